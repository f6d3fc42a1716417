"""The LightGBM fit: trained on the train rows' normalised label, early-stopped on the valid
split's, then valid and test predicted and scored with the trials' IC functions
(:func:`sweeper.quant.ic.ic_report` and :func:`~sweeper.quant.ic.daily_ic` of a long frame
``date, asset, pred, label`` with the raw label, as :func:`sweeper.core.evaluate.final_scores`).

Under walk-forward folds it fits one booster per fold (:func:`fit_folds`), on the fold's panel
(:func:`sweeper.data.folds.fold_panel`), early-stopped on its valid block. As a trial's, the
valid figures are the mean over folds; the test figures, predictions and ``model.txt`` are the
last fold's booster's, whose train window ends closest to the test split.

The defaults are Qlib's LightGBM Alpha158 benchmark (examples/benchmarks/LightGBM/
workflow_config_lightgbm_Alpha158.yaml, and LGBModel.fit's 1000 rounds with early stopping after
50), except ``num_threads``: the baseline gets the threads of the slot it runs in."""

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from sweeper.baseline.features import Design, design
from sweeper.config import DataConfig, SweeperConfig
from sweeper.config.long_sweeps import BaselineConfig
from sweeper.core.evaluate import SPLIT_PREFIX
from sweeper.data.folds import Fold, fold_layout, fold_panel
from sweeper.data.panel import Panel
from sweeper.errors import ConfigError
from sweeper.quant import ic as M
from sweeper.validation.grid import RunGrid

# Qlib's LGBModel kwargs of the Alpha158 benchmark; its ``loss: mse`` is LightGBM's objective
QLIB_ALPHA158: dict[str, Any] = {
    "objective": "mse", "colsample_bytree": 0.8879, "learning_rate": 0.2, "subsample": 0.8789,
    "lambda_l1": 205.6999, "lambda_l2": 580.9768, "max_depth": 8, "num_leaves": 210}


@dataclass
class BaselineResult:
    """What a fit gives: the scores, and per split the predictions and daily ICs."""

    scores: dict[str, float]                 # val_ic, val_rank_ic, val_icir, test_ic, ...
    predictions: dict[str, pd.DataFrame]     # split -> date, asset, pred, label
    daily: dict[str, pd.DataFrame]           # split -> date, ic, rank_ic
    best_iteration: int
    elapsed_s: float
    lightgbm_version: str
    params: dict[str, Any]
    rows: dict[str, int]                     # rows per split (train after any subsampling)
    n_features: int
    subsampled: dict[str, Any] | None = None
    train_rows: pd.DataFrame | None = field(default=None, repr=False)  # date, asset[, fold] of each train row
    model_text: str = field(default="", repr=False)
    # walk-forward folds: one entry per fold (:func:`fit_folds`); None with one fold
    folds: list[dict[str, Any]] | None = None


def lgb_params(cfg: BaselineConfig, threads: int, seed: int) -> dict[str, Any]:
    """Qlib's parameters, the study's ``baseline.params`` over them, and this run's threads."""
    return {**QLIB_ALPHA158, "verbosity": -1, "seed": seed, **cfg.params, "num_threads": int(threads)}


def lgb_names(names: list[str]) -> list[str]:
    """The feature names as LightGBM takes them: it refuses JSON's characters (a panel's ``ret[5]`` is
    ``ret_5_`` in model.txt) and a name twice (``ret[5]`` beside ``ret_5_``: each gets its position)."""
    counts = Counter(plain := [re.sub(r'[\[\]{}":,]', "_", n) for n in names])
    return [f"{n}@{k}" if counts[n] > 1 else n for k, n in enumerate(plain)]


def fit(panel: Panel, cfg: BaselineConfig, threads: int = 1, seed: int = 0,
        splits: tuple[str, ...] = ("valid", "test")) -> BaselineResult:
    """Train, early-stop and score the baseline on ``panel`` (the study's, or a fold's) on
    ``splits`` (valid always: early stopping reads it)."""
    import lightgbm as lgb

    started = time.perf_counter()
    train = design(panel, "train", cfg.lags, cfg.max_rows)
    valid = design(panel, "valid", cfg.lags)
    params = lgb_params(cfg, threads, seed)
    dtrain = lgb.Dataset(train.X, label=train.y, feature_name=lgb_names(train.names), free_raw_data=True)
    dvalid = lgb.Dataset(valid.X, label=valid.y, reference=dtrain, free_raw_data=True)
    try:
        booster = lgb.train(params, dtrain, num_boost_round=cfg.num_boost_round, valid_sets=[dvalid],
                            valid_names=["valid"],
                            callbacks=[lgb.early_stopping(cfg.early_stopping_rounds, verbose=False)])
    except lgb.basic.LightGBMError as exc:  # with the user's params: most likely a value it refuses
        if not cfg.params:
            raise
        raise ConfigError(f"baseline.params {cfg.params}: LightGBM refuses them ({exc})") from None
    rows, subsampled = {"train": len(train.t), "valid": len(valid.t)}, train.subsampled
    train_rows = pd.DataFrame({"date": panel.dates[train.t], "asset": panel.assets[train.i]})
    del train, dtrain, dvalid
    best = int(booster.best_iteration or booster.current_iteration())
    scores: dict[str, float] = {}
    predictions, daily = {}, {}
    for split in splits:
        p = SPLIT_PREFIX[split]
        rows_of = valid if split == "valid" else design(panel, split, cfg.lags)
        frame = frame_of(panel, rows_of, booster.predict(rows_of.X, num_iteration=best))
        rows[split] = len(frame)
        report = M.ic_report(frame)
        scores.update({f"{p}_{k}": report[k] for k in ("ic", "rank_ic", "icir")})
        predictions[split], daily[split] = frame, M.daily_ic(frame)
    return BaselineResult(scores=scores, predictions=predictions, daily=daily, best_iteration=best,
                          elapsed_s=time.perf_counter() - started, lightgbm_version=lgb.__version__,
                          params=params, rows=rows, n_features=len(valid.names),
                          subsampled=subsampled, train_rows=train_rows, model_text=booster.model_to_string())


def fit_study(panel: Panel, cfg: SweeperConfig, threads: int = 1, seed: int = 0) -> BaselineResult:
    """The study's baseline: one fit per fold of its run grid (one fold: the panel's own split)."""
    if not RunGrid.of(cfg).folded:
        return fit(panel, cfg.baseline, threads=threads, seed=seed)
    return fit_folds(panel, fold_layout(panel, cfg), cfg.data, cfg.baseline, threads=threads, seed=seed)


def fit_folds(panel: Panel, folds: list[Fold], data: DataConfig, cfg: BaselineConfig,
              threads: int = 1, seed: int = 0) -> BaselineResult:
    """One booster per fold, each on its fold's panel; the last also scores the test split."""
    started = time.perf_counter()
    fits: list[BaselineResult] = []
    for k, fold in enumerate(folds):
        last = k == len(folds) - 1
        one = fit(fold_panel(panel, fold, data), cfg, threads=threads, seed=seed,
                  splits=("valid", "test") if last else ("valid",))
        if not last:  # only the last fold's booster is kept (model.txt): it scores the test split
            one.model_text = ""
        fits.append(one)
    return _merged(fits, time.perf_counter() - started)


def _with_fold(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The folds' frames in fold order (their valid blocks are disjoint and march forward, so
    that is date order), with ``fold`` counted from 1."""
    return pd.concat([f.assign(fold=k + 1) for k, f in enumerate(frames)], ignore_index=True)


def _merged(fits: list[BaselineResult], elapsed_s: float) -> BaselineResult:
    """The folds' fits as one result: valid figures the mean over folds, test the last fold's."""
    last = fits[-1]
    scores = {k: float(np.mean([f.scores[k] for f in fits])) for k in ("val_ic", "val_rank_ic", "val_icir")}
    scores.update({k: v for k, v in last.scores.items() if k.startswith("test_")})
    per_fold = [{"fold": k + 1, **{m: f.scores[m] for m in ("val_ic", "val_rank_ic", "val_icir")},
                 "best_iteration": f.best_iteration, "rows": {s: f.rows[s] for s in ("train", "valid")},
                 "subsampled": f.subsampled, "elapsed_s": f.elapsed_s} for k, f in enumerate(fits)]
    rows = {**{s: sum(f.rows[s] for f in fits) for s in ("train", "valid")}, "test": last.rows["test"]}
    # the subsampled folds' figures summed (folds: which, 1-based; limit and by: the last one's). Each
    # fold is subsampled alone, to baseline.max_rows, since each fit holds only its own train window
    subs = [(k + 1, s) for k, f in enumerate(fits) if (s := f.subsampled)]
    summed: dict[str, Any] = {k: sum(s[k] for _, s in subs)
                              for k in ("dates_kept", "dates_total", "rows_kept", "rows_total")}
    subsampled = {**summed, "limit": subs[-1][1]["limit"], "by": subs[-1][1]["by"],
                  "folds": [k for k, _ in subs]} if subs else None
    return BaselineResult(
        scores=scores, elapsed_s=elapsed_s, best_iteration=last.best_iteration, rows=rows,
        predictions={"valid": _with_fold([f.predictions["valid"] for f in fits]),
                     "test": last.predictions["test"]},
        daily={"valid": _with_fold([f.daily["valid"] for f in fits]), "test": last.daily["test"]},
        lightgbm_version=last.lightgbm_version, params=last.params, n_features=last.n_features,
        subsampled=subsampled, model_text=last.model_text, folds=per_fold,
        train_rows=_with_fold([f.train_rows for f in fits if f.train_rows is not None]))


def frame_of(panel: Panel, rows: Design, pred: Any) -> pd.DataFrame:
    """The trials' long frame of a split: ``date, asset, pred, label`` (label = raw)."""
    return pd.DataFrame({"date": panel.dates[rows.t], "asset": panel.assets[rows.i],
                         "pred": np.asarray(pred, dtype=np.float64), "label": rows.y_raw})
