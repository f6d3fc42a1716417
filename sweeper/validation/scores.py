"""A trial's scores: the one home of how its training runs are aggregated into the objective
and its user attributes (docs/walk-forward.md). A trial of one run scores that run: its value
is the run's ``study.metric`` and it records no fold figures.

A fold's score is the mean over its seeds; the objective is the mean over folds of
``study.metric``'s fold scores, or with ``validation.aggregate: lcb`` that mean less one
standard error (plus one, for a metric that is minimised). The standard error is the fold
scores' (std with ddof=1 over sqrt(n)); with one fold (seed repeats without folds) the seed scores'."""

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from sweeper.config import SweeperConfig
from sweeper.errors import StopReason
from sweeper.quant import ic as M
from sweeper.validation import contract as K
from sweeper.validation.grid import RunGrid

MEANED = ("val_ic", "val_rank_ic", "val_icir", "val_loss")  # stored as the mean over folds


@dataclass
class TrainingRun:
    """One finished training run of a trial: fold and repeat (its seed index) count from 0 here."""

    fold: int
    repeat: int
    seed: int
    metrics: dict[str, Any]
    stop_reason: str = StopReason.EPOCHS


def _by_fold(runs: Sequence[TrainingRun]) -> list[list[TrainingRun]]:
    return [[r for r in runs if r.fold == f] for f in sorted({r.fold for r in runs})]


def fold_scores(runs: Sequence[TrainingRun], key: str) -> list[float]:
    """Per fold (in fold order), the mean over its seeds of ``key``."""
    return [_mean([_num(r.metrics.get(key)) for r in fold]) for fold in _by_fold(runs)]


def standard_error(runs: Sequence[TrainingRun], key: str) -> float:
    """std (ddof=1) / sqrt(n) of the fold scores; with one fold, of its seed scores."""
    if len(scores := fold_scores(runs, key)) < 2:
        scores = [_num(r.metrics.get(key)) for r in runs]
    finite = [s for s in scores if math.isfinite(s)]
    return statistics.stdev(finite) / math.sqrt(len(finite)) if len(finite) >= 2 else math.nan


def objective(runs: Sequence[TrainingRun], cfg: SweeperConfig,
              predictions: Mapping[tuple[int, int], pd.DataFrame] | None = None) -> float:
    """The trial's value: the mean over folds of ``study.metric`` (lcb: less one standard error;
    ensemble: of each fold's seed ensemble, from the runs' valid ``predictions``)."""
    metric = cfg.study.metric
    if cfg.validation.aggregate == "ensemble":
        return _mean(ensemble_fold_scores(runs, predictions or {}, metric))
    mean = _mean(fold_scores(runs, metric))
    if cfg.validation.aggregate != "lcb":
        return mean
    se = standard_error(runs, metric)
    return mean - se if cfg.study.resolved_direction == "maximize" else mean + se


def ensemble_frame(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """The seed ensemble's ``date, asset, pred, label``: per row, the mean of the seeds' predictions."""
    stacked = pd.concat([f[["date", "asset", "pred", "label"]] for f in frames], ignore_index=True)
    return stacked.groupby(["date", "asset"], sort=True, as_index=False).agg(pred=("pred", "mean"),
                                                                           label=("label", "first"))


def ensemble_fold_scores(runs: Sequence[TrainingRun], predictions: Mapping[tuple[int, int], pd.DataFrame],
                         metric: str = "val_ic") -> list[float]:
    """Per fold (in fold order), ``metric`` (val_ic, val_rank_ic, val_icir) of the fold's seed ensemble
    (the mean of its seeds' predictions) on its valid block."""
    seeds = [[predictions[(r.fold, r.repeat)] for r in fold if (r.fold, r.repeat) in predictions]
             for fold in _by_fold(runs)]
    return [float(M.ic_report(ensemble_frame(frames))[metric.removeprefix("val_")])  # type: ignore[literal-required]
            if frames else math.nan for frames in seeds]


def trial_attrs(runs: Sequence[TrainingRun], cfg: SweeperConfig, *, folds_run: int,
                spans: list[dict[str, list[str]]],
                predictions: Mapping[tuple[int, int], pd.DataFrame]) -> dict[str, Any]:
    """The user attributes of a trial made of ``runs`` (the contract's names), without those of
    the model in weights.pt (the worker adds the model run's own). One run: only its figures."""
    attrs: dict[str, Any] = {key: _mean(fold_scores(runs, key)) for key in MEANED}
    grid = RunGrid.of(cfg)
    if grid.single:  # one run's figures are the trial's: nothing to aggregate over folds or seeds
        return attrs
    for key in dict.fromkeys(["val_ic", cfg.study.metric]):  # fold_<key>, <key>_se, worst_fold_<key>
        scores = fold_scores(runs, key)
        attrs.update({K.fold_key(key): scores, K.se_key(key): standard_error(runs, key)})
        if grid.folded:
            finite = [v for v in scores if math.isfinite(v)]
            # the worst of a minimised metric (val_loss) is its largest; val_ic's is its smallest
            worst = max if key == cfg.study.metric and cfg.study.resolved_direction == "minimize" else min
            attrs[K.worst_key(key)] = worst(finite) if finite else math.nan
    if grid.folded:
        attrs[K.FOLD_DATES] = spans
    if grid.repeats > 1:
        per_fold = ensemble_fold_scores(runs, predictions)
        seeds = [[_num(r.metrics.get("val_ic")) for r in fold] for fold in _by_fold(runs)]
        sd = _mean([statistics.stdev(v) for v in seeds if len(v) >= 2 and all(math.isfinite(x) for x in v)])
        attrs.update({K.SEED_VAL_IC_SD: sd, K.FOLD_SEED_ENSEMBLE_VAL_IC: per_fold,
                      K.SEED_ENSEMBLE_VAL_IC: _mean(per_fold)})
    attrs[K.FOLD_BEST_EPOCH] = [int(statistics.median_low([int(r.metrics.get("best_epoch") or 0) for r in f]))
                                for f in _by_fold(runs)]
    attrs[K.FOLDS_RUN] = folds_run
    return attrs


def daily_valid(frames: Mapping[tuple[int, int], pd.DataFrame]) -> pd.DataFrame:
    """``daily_ic_valid.csv`` of the trial: per valid date the mean over seeds of the runs' daily
    ic and rank_ic, with the fold (1-based); the blocks are disjoint, so each date appears once."""
    if not (parts := [frame.assign(fold=fold + 1) for (fold, _repeat), frame in frames.items()]):
        return pd.DataFrame(columns=["date", "ic", "rank_ic", "fold"])
    both = pd.concat(parts, ignore_index=True)
    out = both.groupby(["fold", "date"], sort=True, as_index=False)[["ic", "rank_ic"]].mean()
    return out[["date", "ic", "rank_ic", "fold"]].sort_values("date", ignore_index=True)


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else math.nan
