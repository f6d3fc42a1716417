"""What a trial of several runs leaves: its objective, its user attributes and its files.

The trial's model is the last fold's first seed (:func:`~sweeper.validation.runner.model_run`):
its weights, normalisation statistics, test scores and ``daily_ic_test.csv`` are the trial's.
``daily_ic_valid.csv`` holds every fold's valid block (the mean over seeds), with its fold.
"""
from __future__ import annotations

import os
import shutil
from typing import Any

import pandas as pd

from sweeper.atomic import atomic_path
from sweeper.config import SweeperConfig
from sweeper.store.layout import TrialFiles
from sweeper.validation import runner as R
from sweeper.validation.scores import MEANED, daily_valid, fold_scores, objective, trial_attrs


def attrs_of(out: R.Outcome, cfg: SweeperConfig) -> tuple[float, dict[str, Any]]:
    """(the objective, the user attributes): the aggregates of every run, and the model run's own
    figures (test scores, best epoch, batch sizes); without a model run (cut short before the
    last fold), the last run's figures other than test scores, which only the model has."""
    model = next((r for r in out.runs if (r.fold, r.repeat) == R.model_run(cfg)), None)
    own = (model or out.runs[-1]).metrics if out.runs else {}
    base = {k: v for k, v in own.items() if k not in MEANED}
    attrs = {**base, **trial_attrs(out.runs, cfg, folds_run=out.folds_run, fold_dates=out.fold_dates,
                                   predictions=out.predictions)}
    attrs["stop_reason"] = out.stop_reason
    attrs["duration_s"] = sum(float(r.metrics.get("duration_s") or 0.0) for r in out.runs)  # every run's
    return objective(out.runs, cfg), attrs


def terminator_scores(out: R.Outcome, cfg: SweeperConfig) -> list[float]:
    """The fold scores of ``study.metric`` (one fold, under holdout with repeats: the seed scores)."""
    if cfg.validation.n_folds > 1:
        return fold_scores(out.runs, cfg.study.metric)
    return [float(r.metrics.get(cfg.study.metric, float("nan"))) for r in out.runs]


def first_seed_predictions(out: R.Outcome) -> dict[str, pd.DataFrame]:
    """``{"valid": ...}``: the first seed's valid predictions of every fold, in date order (what
    ``study.constraints`` judges; the blocks are disjoint)."""
    frames = [frame for (fold, repeat), frame in sorted(out.predictions.items()) if repeat == 0]
    return {"valid": pd.concat(frames, ignore_index=True)} if frames else {}


def write_files(out: R.Outcome, cfg: SweeperConfig, files: TrialFiles) -> None:
    """The trial's own files from its runs: daily_ic_valid.csv, and the model run's weights
    (moved: the run's folder keeps no second copy), norm_stats.json and daily_ic_test.csv."""
    with atomic_path(files.daily_ic("valid")) as tmp:
        daily_valid(out.daily).to_csv(tmp, index=False)
    folder = files.run(*(i + 1 for i in R.model_run(cfg)))
    weights = folder / R.WEIGHTS
    if weights.exists():
        os.replace(weights, files.weights)
    for name, dst in ((R.NORM_STATS, files.norm_stats), (R.DAILY_TEST, files.daily_ic("test"))):
        if (folder / name).exists():
            with atomic_path(dst) as tmp:
                shutil.copyfile(folder / name, tmp)
