"""One trial's training runs: its run grid (folds x seeds; one fold of one seed without
walk-forward folds or repeats), trained and scored on all of them (docs/walk-forward.md).

- :mod:`~sweeper.validation.grid`: the run grid, the one layout of a trial's runs;
- :mod:`~sweeper.validation.runner`: the loop over the grid, each run through
  :func:`sweeper.core.train`, with each finished run's files in ``runs/`` (resume skips them);
- :mod:`~sweeper.validation.scores`: the aggregation into the objective and the user attributes;
- :mod:`~sweeper.validation.record`: what the trial leaves: value, attributes, files;
- :mod:`~sweeper.validation.contract`: the fold attributes' names, and whether a study is folded.
"""
from __future__ import annotations

from sweeper.validation.grid import RunGrid, seeded
from sweeper.validation.runner import RunStore, Trainer, TrialRuns, train_runs
from sweeper.validation.scores import TrainingRun, daily_valid, objective, trial_attrs

__all__ = ["RunGrid", "RunStore", "Trainer", "TrainingRun", "TrialRuns", "daily_valid", "objective",
           "seeded", "train_runs", "trial_attrs"]
