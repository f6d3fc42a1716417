"""A study's trials' prediction frames for ``sweeper best`` and ``sweeper report``: read back
from the files the worker stored, or, for a trial that has none, from its model run again.

Every trial since issue 28 stores its model run's predictions on valid and test
(``trials/<n>/predictions_valid.parquet`` / ``predictions_test.parquet``: ``date, asset,
pred, label``, the frame :func:`sweeper.core.evaluate.predict` returns at the end of training).
They are the frames :class:`~sweeper.inspect.trial_model.Predictor` computes from the trial's
weights and the study's data, so the long-short view and the top-K ensemble read them and load
no data and import no torch. A trial without them (a study swept before, or ``study.keep.
predictions: top_k`` removed them) is predicted as before, and only then is torch imported.

This module imports no torch (``tests/test_readonly_imports.py``); nor does
:mod:`sweeper.inspect.trials` (a trial's resolved config, the top trials), which it reads."""
from __future__ import annotations

from typing import TYPE_CHECKING

import optuna
import pandas as pd
from optuna.trial import FrozenTrial

from sweeper.config import SweeperConfig
from sweeper.inspect.trials import trial_config
from sweeper.store.layout import trial_files
from sweeper.store.run_folder import files_folder

if TYPE_CHECKING:
    from sweeper.inspect.trial_model import Predictor


class TrialFrames:
    """``date, asset, pred, label`` of the study's trials on valid and test: the stored files
    where the trial has them, else the :class:`Predictor`'s (made on first need, with one load
    of the data for every trial it predicts)."""

    def __init__(self, cfg: SweeperConfig, study: optuna.Study, study_file: str | None = None) -> None:
        self.cfg, self.study, self.study_file = cfg, study, study_file
        self.run_dir = files_folder(cfg, study)  # this study's files, wherever another study put them
        self._predictor: Predictor | None = None
        self._frames: dict[tuple[int, str], pd.DataFrame] = {}
        self.predicted: list[tuple[int, str]] = []  # the frames the model had to be run for

    @property
    def predictor(self) -> Predictor:
        if self._predictor is None:
            from sweeper.inspect.trial_model import Predictor  # torch: only for a trial without files

            self._predictor = Predictor(self.cfg, self.study, study_file=self.study_file)
        return self._predictor

    def config(self, trial: FrozenTrial) -> SweeperConfig:
        return trial_config(trial_files(self.run_dir, trial.number), self.cfg)

    def frame(self, trial: FrozenTrial, split: str) -> pd.DataFrame:
        """The trial's frame of ``split`` (``valid`` or ``test``)."""
        if (key := (trial.number, split)) not in self._frames:
            if (stored := trial_files(self.run_dir, trial.number).predictions(split)).exists():
                self._frames[key] = pd.read_parquet(stored)
            else:
                self._frames[key] = self.predictor.frame(trial, split)
                self.predicted.append(key)
        return self._frames[key]
