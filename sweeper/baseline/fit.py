"""The LightGBM fit: trained on the train rows' normalised label, early-stopped on the valid
split's, then valid and test predicted and scored with the trials' IC functions
(:func:`sweeper.quant.ic.ic_report` and :func:`~sweeper.quant.ic.daily_ic` of a long frame
``date, asset, pred, label`` with the raw label, as :func:`sweeper.core.evaluate.final_scores`).

The defaults are Qlib's LightGBM Alpha158 benchmark (examples/benchmarks/LightGBM/
workflow_config_lightgbm_Alpha158.yaml, and LGBModel.fit's 1000 rounds with early stopping after
50), except ``num_threads``: the baseline gets the threads of the slot it runs in.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from sweeper.baseline.features import Design, design
from sweeper.config.long_sweeps import BaselineConfig
from sweeper.data.panel import Panel
from sweeper.quant import ic as M

# Qlib's LGBModel kwargs of the Alpha158 benchmark; its ``loss: mse`` is LightGBM's objective
QLIB_ALPHA158: dict[str, Any] = {
    "objective": "mse", "colsample_bytree": 0.8879, "learning_rate": 0.2, "subsample": 0.8789,
    "lambda_l1": 205.6999, "lambda_l2": 580.9768, "max_depth": 8, "num_leaves": 210,
}
SPLIT_PREFIX = {"valid": "val", "test": "test"}  # as the trials' metric names


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
    train_rows: pd.DataFrame | None = field(default=None, repr=False)  # date, asset of each train row
    model_text: str = field(default="", repr=False)


def lgb_params(cfg: BaselineConfig, threads: int, seed: int) -> dict[str, Any]:
    """Qlib's parameters, the study's ``baseline.params`` over them, and this run's threads."""
    return {**QLIB_ALPHA158, "verbosity": -1, "seed": seed, **cfg.params, "num_threads": int(threads)}


def fit(panel: Panel, cfg: BaselineConfig, threads: int = 1, seed: int = 0) -> BaselineResult:
    """Train, early-stop and score the baseline on ``panel`` (the study's normalised panel)."""
    import lightgbm as lgb

    started = time.perf_counter()
    train = design(panel, "train", cfg.lags, cfg.max_rows)
    valid = design(panel, "valid", cfg.lags)
    params = lgb_params(cfg, threads, seed)
    dtrain = lgb.Dataset(train.X, label=train.y, feature_name=train.names, free_raw_data=True)
    dvalid = lgb.Dataset(valid.X, label=valid.y, reference=dtrain, free_raw_data=True)
    booster = lgb.train(params, dtrain, num_boost_round=cfg.num_boost_round, valid_sets=[dvalid],
                        valid_names=["valid"],
                        callbacks=[lgb.early_stopping(cfg.early_stopping_rounds, verbose=False)])
    rows, subsampled = {"train": len(train.t), "valid": len(valid.t)}, train.subsampled
    train_rows = pd.DataFrame({"date": panel.dates[train.t], "asset": panel.assets[train.i]})
    del train, dtrain, dvalid
    best = int(booster.best_iteration or booster.current_iteration())
    scores: dict[str, float] = {}
    predictions, daily = {}, {}
    for split, p in SPLIT_PREFIX.items():
        rows_of = valid if split == "valid" else design(panel, split, cfg.lags)
        frame = frame_of(panel, rows_of, booster.predict(rows_of.X, num_iteration=best))
        rows[split] = len(frame)
        report = M.ic_report(frame)
        scores.update({f"{p}_ic": report["ic"], f"{p}_rank_ic": report["rank_ic"],
                       f"{p}_icir": report["icir"]})
        predictions[split], daily[split] = frame, M.daily_ic(frame)
    return BaselineResult(scores=scores, predictions=predictions, daily=daily, best_iteration=best,
                          elapsed_s=time.perf_counter() - started, lightgbm_version=lgb.__version__,
                          params=params, rows=rows, n_features=len(valid.names),
                          subsampled=subsampled, train_rows=train_rows, model_text=booster.model_to_string())


def frame_of(panel: Panel, rows: Design, pred: Any) -> pd.DataFrame:
    """The trials' long frame of a split: ``date, asset, pred, label`` (label = raw)."""
    return pd.DataFrame({"date": panel.dates[rows.t], "asset": panel.assets[rows.i],
                         "pred": np.asarray(pred, dtype=np.float64), "label": rows.y_raw})
