"""Walk-forward folds and seed repeats: a trial trained as several runs and scored on all of
them (docs/walk-forward.md).

- :mod:`~sweeper.validation.runner`: the loop over folds and seeds, each run through
  :func:`sweeper.core.train`, with each finished run's files in ``runs/`` (resume skips them);
- :mod:`~sweeper.validation.scores`: the aggregation into the objective and the user attributes.

Under ``validation.scheme: holdout`` with ``repeats: 1`` none of this runs: a trial is one
``train`` call, as it always was.
"""
from __future__ import annotations

from sweeper.validation.runner import Outcome, RunStore, Trainer, global_step, model_run, seeded, train_runs
from sweeper.validation.scores import Run, daily_valid, objective, trial_attrs

__all__ = ["Outcome", "Run", "RunStore", "Trainer", "daily_valid", "global_step", "model_run", "objective",
           "seeded", "train_runs", "trial_attrs"]
