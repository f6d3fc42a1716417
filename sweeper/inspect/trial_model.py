"""A trial's model, rebuilt and applied: its resolved config, its weights, the panel it scores and the
normalisation statistics that panel needs.

The study's own data is loaded with the trial's data config, exactly as the trial was trained (same split,
same normalisation), and predicted through :func:`sweeper.core.predict` with the trial's
``train.eval_batch_size``: the IC of the valid output is the trial's stored ``val_ic``. Another file
(``--data``) is scored with :func:`sweeper.data.scoring.scoring_panel`: the trial's features, normalised with
the statistics of the trial's train split (``trials/<n>/norm_stats.json``; a trial without that file has them
re-fitted on the study's train split, and the notes say so).

A trial with a refit (``sweeper refit``: ``trials/<n>/refit/``, complete once its ``refit.json`` is written)
has ``--data`` scored with the refit's weights and statistics instead, and :attr:`Predictor.refits` holds the
record of each refit used. The study's own splits are always scored with the trial's own weights: a refit has
trained on its valid and test dates."""

import dataclasses
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
from optuna.trial import FrozenTrial

from sweeper.config import SweeperConfig
from sweeper.data.folds import fold_layout, fold_panel
from sweeper.data.load import PanelMemo, still_the_data
from sweeper.data.normalize import NormStats
from sweeper.data.panel import Panel
from sweeper.data.scoring import own_scoring_panel
from sweeper.errors import ConfigError, DataError, SweeperError
from sweeper.inspect.trials import model_dates, trial_config
from sweeper.models.check_cache import code_changed, source_digest
from sweeper.store.layout import RefitFiles, TrialFiles, trial_files
from sweeper.store.run_folder import files_folder
from sweeper.study.retention import no_model, retrain_command, stand_in, weights_removed
from sweeper.validation import contract as K
from sweeper.validation.grid import RunGrid
from sweeper.validation.scores import ensemble_frame

SPLITS = ("valid", "test", "train", "all")
RANGE = "range"  # the split name of a --start/--end selection
MOVED = ("the study's data file changed since the study ran: each split is its stored dates, normalised "
         "with each trial's own statistics, as --data scores a file")


def load_weights(files: TrialFiles, trial: FrozenTrial, retrain: Callable[[], str]) -> dict[str, Any]:
    """The best epoch's state dict (tensors on the CPU). Weights that ``study.keep`` (or
    ``sweeper gc``) removed are a DataError with the command that retrains the trial (``retrain()``)."""
    path = files.weights
    if weights_removed(trial, files):
        raise DataError(f"{path}: trial {trial.number}'s weights are gone (study.keep, gc, or by hand); "
                        f"retrain it with its params as a new trial: {retrain()}")
    if not path.exists():
        raise DataError(f"{path}: missing; trial {trial.number} " + (
            f"is {trial.state.name} and wrote no weights" if (never := no_model(trial)) is None
            else f"has no model: {never}; predict a trial that finished its folds"))
    return _state_dict(path)


def _state_dict(path: Path) -> dict[str, Any]:
    import torch  # here, not at the top: a report of a study without weights never needs torch

    return torch.load(path, map_location="cpu", weights_only=True)


def read_refit(files: TrialFiles) -> dict[str, Any] | None:
    """The ``refit.json`` record of the trial's refit, or None when it has no complete one (the
    record is written after the weights and statistics, and removed before they are replaced)."""
    if not (path := files.refit_files.record).exists():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot read the refit's record ({exc}); run `sweeper refit` again") \
            from None
    return record if isinstance(record, dict) else None


def restrict(panel: Panel, split: str, start: str | None, end: str | None,
             notes: dict[str, None]) -> tuple[Panel, str]:
    """``(panel, split name)``: the split, or its days in ``[start, end]``; ``notes``: days with no window."""
    from sweeper.data.scoring import date_range

    if split not in panel.splits:
        raise DataError(f"{panel.source}: the study's {split} dates are not known (the study records them "
                        "from this version on); use --split all or --start/--end")
    if start is None and end is None:
        return panel, split
    a, b = panel.splits[split]
    s, e = date_range(panel.dates, [start, end], panel.lookback, "--start/--end")
    asked = date_range(panel.dates, [start, end], 1, "--start/--end")[0]  # before a full window's clamp
    if start is not None and asked < s < min(b, e):
        notes[f"--start {start}: the {s - asked} dates {' to '.join(panel.days((asked, s)))} have too little "
              f"history in the data to predict (a row needs {panel.lookback} dates, its own and the "
              f"{panel.lookback - 1} before it)"] = None
    splits = {**panel.splits, RANGE: (max(a, s), max(min(b, e), max(a, s)))}
    return dataclasses.replace(panel, splits=splits, _cache={}), RANGE


def no_rows(panel: Panel, split: str, name: str, trial: int, lookback: int,
            span: tuple[str | None, str | None]) -> str:
    """Why ``split`` (``name``: it or its --start/--end range) of ``panel`` has no row to predict:
    how many dates a row needs, and how many the data has."""
    between = f" between {span[0] or 'the start'} and {span[1] or 'the end'}" if name == RANGE else ""
    days = [str(day)[:10] for day in panel.dates[[0, -1]]] if len(panel.dates) else []
    first, stop = panel.splits[name]
    held = "" if len(panel.dates) < lookback else \
        f"; the {'range' if between else 'split'} holds {stop - first} of them"
    return (f"{panel.source}: no rows to predict in the {split} split{between} (trial {trial}, lookback "
            f"{lookback}: a row needs {lookback} dates, its own and the {lookback - 1} before it; the data "
            f"has {len(panel.dates)}{', ' + ' to '.join(days) if days else ''}{held})")


class Predictor:
    """Predictions of the study's trials, with what they share (the study's panel for each data
    config, each trial's frames) made once: ``sweeper best`` scores the best trial and the top-3
    ensemble on valid and test with one load of the data."""

    def __init__(self, cfg: SweeperConfig, study: optuna.Study, device: str | None = None,
                 study_file: str | None = None) -> None:
        self.cfg, self.study = cfg, study
        self.study_file = study_file  # named in the retrain command of a trial whose weights are gone
        self.run_dir = files_folder(cfg, study)  # this study's files, wherever another study put them
        self._device_name = device
        self.code_now = source_digest(cfg)  # the user models' files now: the study's names, every trial's
        self.notes: dict[str, None] = {}  # each said once, in order
        self.refits: dict[int, dict[str, Any]] = {}  # trial -> its refit's record, for each refit used
        self._panels = PanelMemo()
        self._frames: dict[tuple, pd.DataFrame] = {}

    def has_refit(self, trial: FrozenTrial) -> bool:
        return read_refit(trial_files(self.run_dir, trial.number)) is not None

    def frame(self, trial: FrozenTrial, split: str, *, data: str | Path | None = None,
              start: str | None = None, end: str | None = None) -> pd.DataFrame:
        """``date, asset, pred, label`` of ``trial`` on ``split`` of the study's data (or ``data``)."""
        key = (trial.number, split, None if data is None else str(data), start, end)
        if key not in self._frames:
            self._frames[key] = self._predict(trial, split, data, start, end)
        return self._frames[key]

    def _predict(self, trial: FrozenTrial, split: str, data: str | Path | None, start: str | None,
                 end: str | None) -> pd.DataFrame:
        from sweeper.core import predict, resolve_device
        from sweeper.models import build_model

        own = trial_files(self.run_dir, trial.number)
        refit = read_refit(own) if data is not None else None  # the study's own dates: its own weights
        files = own if refit else self._files(trial, own)  # its refit first; a retrain for its own weights
        tcfg = trial_config(files, self.cfg)
        if changed := code_changed(self.code_now, trial.user_attrs, self.study.user_attrs):
            raise ConfigError(f"{changed}, so trial {trial.number}'s weights would score another model than "
                              "it trained; restore them, or run a new study with the new code")
        used = files.refit_files if refit else files  # the refit's model files, or the trial's own
        # its seed ensemble's (a refit trains every seed); a trial cut short before it had one: the first seed
        seeds = len(refit.get("seeds") or [0]) if refit else len(trial.user_attrs.get(K.SEED_TEST_IC) or [0])
        members = self._members(trial, files, used, seeds)
        if data is None and self.study_data[1] is False and tcfg.data.path:
            data = tcfg.data.path  # it changed: the study's stored dates, scored with the trial's own weights
            self.notes[MOVED] = None
        panel = (self.own_panel(tcfg) if data is None
                 else self._new_panel(tcfg, used.norm_stats, trial, Path(data)))
        panel, name = restrict(panel, split, start, end, self.notes)
        if len(panel.sample_index(name)) == 0:
            raise DataError(no_rows(panel, split, name, trial.number, tcfg.data.lookback, (start, end)))
        device = resolve_device(self._device_name)
        if refit:
            self.refits[trial.number] = refit
        on_device = panel.to(device, tcfg.data.device_share)
        frames = []
        for weights in members:
            model = build_model(tcfg.model, len(panel.features), tcfg.data.lookback)
            try:
                model.load_state_dict(weights)
            except (RuntimeError, KeyError) as exc:  # the model's code changed since the trial trained
                raise ConfigError(f"trial {trial.number}'s weights do not fit the model {tcfg.model.name!r} "
                                  f"builds now (was its code changed?): {str(exc).splitlines()[0]}") from None
            frames.append(predict(model.to(device), on_device, name, device,
                                  tcfg.train.resolved_eval_batch_size))
        return frames[0] if len(frames) == 1 else ensemble_frame(frames)

    def _files(self, trial: FrozenTrial, files: TrialFiles) -> TrialFiles:
        """The trial's ``files``; where its weights are gone, its retrain's (:func:`stand_in`), said once."""
        if weights_removed(trial, files) and (
                twin := stand_in(trial, self.study.get_trials(deepcopy=False), self.run_dir)):
            note = f"trial {trial.number}'s weights are gone: its retrain, trial {twin.number}, scores for it"
            self.notes[note], files = None, trial_files(self.run_dir, twin.number)
        return files

    def _members(self, trial: FrozenTrial, files: TrialFiles, used: TrialFiles | RefitFiles,
                 seeds: int) -> list[dict[str, Any]]:
        """The state dicts whose predictions' mean is the model (``used``: the refit's files, or the trial's
        own), every seed's: a missing file fails before any data is read (a mean of fewer: another model)."""
        refit = used is not files
        if refit and not used.weights.exists():
            raise DataError(f"{used.weights}: missing beside its refit.json; run `sweeper refit` again")
        first = _state_dict(used.weights) if refit else load_weights(files, trial, functools.partial(
            retrain_command, trial, self.study_file, self.study, self.cfg.study.n_trials))
        if missing := [p.name for p in map(used.member_weights, range(1, seeds)) if not p.exists()]:
            raise DataError(f"{used.folder}: {', '.join(missing)} missing; the model is the mean of its "
                            f"{seeds} seeds{'; run `sweeper refit` again' * refit}")
        return [first, *(_state_dict(used.member_weights(r)) for r in range(1, seeds))]

    @functools.cached_property
    def study_data(self) -> tuple[str, bool | None]:
        """The study's data (its source), and whether it is still the data the study was run on (None:
        unknown), by its own data section's fingerprint (a trial's searched features would read another)."""
        return still_the_data(self.cfg.data, self.study.user_attrs.get("data_fingerprint"))

    def own_panel(self, tcfg: SweeperConfig) -> Panel:
        """The study's data loaded with a trial's data config, every present row scoreable.

        Under walk-forward folds it is the model run's fold's panel (the grid's, the last fold): the trial's
        model trained on that fold's window with its normalisation, and scoring the study's own valid split
        would score dates that fold trained on (its valid block is the one the model has not seen)."""
        from sweeper.data import load_panel

        def make() -> Panel:
            panel = load_panel(tcfg.data)
            if (grid := RunGrid.of(tcfg)).folded:
                panel = fold_panel(panel, fold_layout(panel, tcfg)[grid.model_run[0]], tcfg.data)
            return own_scoring_panel(panel)

        key = {"data": tcfg.data.model_dump(mode="json"), "validation": tcfg.validation.model_dump()}
        return self._panels.get(key, make)

    def _new_panel(self, tcfg: SweeperConfig, kept: Path, trial: FrozenTrial, path: Path) -> Panel:
        from sweeper.data.scoring import scoring_panel

        if not path.exists():
            raise DataError(f"{path}: no such file (--data)")
        stats, split_dates = self._scoring_inputs(tcfg, kept, trial)
        return self._panels.get([str(path), tcfg.data.model_dump(mode="json"), stats, split_dates],
                                lambda: scoring_panel(tcfg.data, path, stats["features"], stats, split_dates))

    def _scoring_inputs(self, tcfg: SweeperConfig, kept: Path,
                        trial: FrozenTrial) -> tuple[NormStats, dict[str, list[str]]]:
        """The trial's features and normalisation statistics (``kept``: its ``norm_stats.json``
        or its refit's), and the study's split dates.

        Both come from what the study kept (``kept``, the ``split_dates`` attribute) when it
        kept them, else from the study's data loaded as the trial was."""
        saved: NormStats | None = json.loads(kept.read_text()) if kept.exists() else None
        split_dates = model_dates(self.study.user_attrs)  # walk-forward: the model run's fold (own_panel)
        if saved is not None and split_dates:
            return saved, split_dates
        try:
            own = self.own_panel(tcfg)
        except SweeperError as exc:
            if saved is None:
                raise DataError(f"trial {trial.number} has no {kept.name} and the study's data "
                                f"cannot be loaded to re-fit its normalisation: {exc}") from None
            return saved, {}  # the study's dates are unknown: --split all or --start/--end only
        if saved is None and tcfg.data.feature_norm == "robust_zscore":
            self.notes[f"trial {trial.number} has no {kept.name} (it was trained before trials saved one): "
                       "robust_zscore was re-fitted on the study's train split"] = None
        stats = saved or own.norm_stats
        assert stats is not None, "a loaded panel carries the statistics it was normalised with (data.build)"
        return stats, split_dates or {k: v for k, v in own.split_dates().items() if k != "all"}
