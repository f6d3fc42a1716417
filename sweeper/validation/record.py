"""What a trial leaves: its objective, its user attributes and its files, from its runs.

The trial's model is the grid's model run (the last fold's first seed,
:attr:`~sweeper.validation.grid.RunGrid.model_run`): its weights, normalisation statistics, test scores and
``daily_ic_test.csv`` are the trial's. With seed repeats the model is the seed ensemble of the last fold:
its test scores, predictions and ``daily_ic_test.csv`` are the mean of the seeds' predictions', each seed's
weights are kept, and each seed's own test ICs are attributes (``seed_test_ic``). ``daily_ic_valid.csv``
holds every fold's valid block (the mean over seeds), with its fold (a holdout trial's: its one fold, 1)."""

from typing import Any

import pandas as pd

from sweeper.atomic import atomic_path
from sweeper.config import SweeperConfig
from sweeper.quant import ic as M
from sweeper.store.layout import TrialFiles
from sweeper.store.trial_folder import TrialFolder
from sweeper.validation import contract as K
from sweeper.validation import runner as R
from sweeper.validation import scores as V
from sweeper.validation.grid import RunGrid
from sweeper.validation.scores import MEANED, TrainingRun, daily_valid, fold_scores, objective, trial_attrs


def attrs_of(out: R.TrialRuns, cfg: SweeperConfig) -> tuple[float, dict[str, Any]]:
    """(the objective, the user attributes): the aggregates of every run, and the model run's own
    figures (test scores, best epoch, batch sizes); without a model run (cut short before the
    last fold), the last run's figures other than test scores, which only the model has."""
    members = [r for r in out.runs if out.grid.is_model(r.fold, r.repeat)]
    own = (members[0] if members else out.runs[-1]).metrics if out.runs else {}
    base = {k: v for k, v in own.items() if k not in MEANED}
    attrs = {**base, **trial_attrs(out.runs, cfg, folds_run=out.folds_run, spans=out.spans,
                                   predictions=out.predictions)}
    if out.ensemble is not None:  # the trial's model is its seed ensemble: these are its figures
        report = M.ic_report(out.ensemble["test"])
        attrs.update(test_ic=report["ic"], test_rank_ic=report["rank_ic"], test_icir=report["icir"])
        attrs[K.SEED_TEST_IC] = [r.metrics.get("test_ic") for r in members]
        attrs[K.SEED_TEST_RANK_IC] = [r.metrics.get("test_rank_ic") for r in members]
    attrs.update(stop_reason=out.stop_reason, duration_s=training_seconds(out.runs, out.grid),
                 final_scoring_s=training_seconds(out.runs, out.grid, "final_scoring_s"))
    return objective(out.runs, cfg, out.predictions), attrs


def training_seconds(runs: list[TrainingRun], grid: RunGrid, key: str = "duration_s") -> float:
    """The trial's training time (``duration_s``; ``final_scoring_s``: of its final scorings): its stacks one
    after another, each counted once. The members of a stack train together, each reporting the stack's
    time, so summing every run's would count a stack of K members K times."""
    stacks: dict[int, float] = {}
    for r in runs:
        k = grid.stack_of(r.fold, r.repeat)
        stacks[k] = max(stacks.get(k, 0.0), float(r.metrics.get(key) or 0.0))
    return sum(stacks.values())


def summary(out: R.TrialRuns, cfg: SweeperConfig) -> dict[str, Any]:
    """``sweeper train --json``: the trial's attributes with its ``value`` (the objective; of one
    run, its metrics and its ``study.metric``)."""
    value, attrs = attrs_of(out, cfg)
    return {"value": value, **attrs}


def terminator_scores(out: R.TrialRuns, cfg: SweeperConfig) -> list[float]:
    """The fold scores of ``study.metric`` (one fold of several seeds: the seed scores; one run:
    its one score, which the Terminator cannot use)."""
    return (fold_scores(out.runs, cfg.study.metric) if out.grid.folded
            else [float(r.metrics.get(cfg.study.metric, float("nan"))) for r in out.runs])


def model_predictions(out: R.TrialRuns) -> dict[str, pd.DataFrame]:
    """``{"valid": ...}``: every fold's valid predictions of the trial's model, in date order (what
    ``study.constraints`` judges; the blocks are disjoint): with seed repeats the fold's seed ensemble,
    which the trial deploys and ``best`` shows (its first seed's turnover is not the ensemble's)."""
    folds: dict[int, list[pd.DataFrame]] = {}
    for (fold, _), frame in sorted(out.predictions.items()):
        folds.setdefault(fold, []).append(frame)
    frames = [seeds[0] if len(seeds) == 1 else V.ensemble_frame(seeds) for seeds in folds.values()]
    return {"valid": pd.concat(frames, ignore_index=True)} if frames else {}


def write_files(out: R.TrialRuns, files: TrialFiles) -> None:
    """The trial's own files: daily_ic_valid.csv and its model's (:meth:`TrialFolder.take_model`)."""
    with atomic_path(files.daily_ic("valid")) as tmp:
        daily_valid(out.daily).to_csv(tmp, index=False)
    TrialFolder.of(files).take_model(out.grid.members)
    if out.ensemble is not None:  # the ensemble's daily test IC, not its first seed's
        with atomic_path(files.daily_ic("test")) as tmp:
            M.daily_ic(out.ensemble["test"]).to_csv(tmp, index=False)
