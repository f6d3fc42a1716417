"""``sweeper refit``: a trial's config trained on every labelled date up to ``--until``, the
production model (docs/refit.md).

The trial's resolved config trains on every target date from the study's first train target (after the
lookback's warm-up; under ``validation.window: rolling``, as many as its last fold trained on) to the last
one whose label is known by ``until``: with the study's pinned widths, the
last target ``t`` has ``t + horizon + embargo <= until`` in date index terms. Nothing later than ``until``
enters the panel, and the labels of the dates between the last target and ``until`` (they reach past it) are
dropped too. ``robust_zscore`` is fitted on this window. There is no valid split and no early stopping: the
core trains exactly E epochs (:func:`refit_epochs`) with the trial's seed, precision and batch plan, and the
last epoch's weights are the refit.

With seed repeats (``validation.repeats``) the trial's model is its seed ensemble, so the refit
trains every seed (``train.seed + r``) and writes one weights file per seed.

It writes ``trials/<n>/refit/``: ``weights.pt``, ``norm_stats.json``, then ``refit.json`` (each atomically;
the record goes last and is removed first when a refit is replaced, so a reader never takes half a refit for
one). ``predict --data`` uses it (:mod:`sweeper.inspect.trial_model`)."""

import dataclasses
import datetime
import json
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
import torch
from optuna.trial import FrozenTrial

from sweeper import __version__
from sweeper import config as C
from sweeper.atomic import atomic_path, write_text
from sweeper.data.build import build, check_usable, in_memory, to_panel
from sweeper.data.columns import row_codes, user_day
from sweeper.data.folds import MIN_TRAIN_DATES
from sweeper.data.load import recipe
from sweeper.data.panel import Panel
from sweeper.data.split import purge_gap, split_widths
from sweeper.errors import ConfigError, DataError, StopReason
from sweeper.inspect.predict import pick_trial
from sweeper.inspect.trial_model import read_refit, trial_config
from sweeper.models.check_cache import code_changed, source_digest
from sweeper.store.layout import RefitFiles, TrialFiles, trial_files
from sweeper.store.run_folder import files_folder
from sweeper.store.trial_folder import remove
from sweeper.validation import contract as K
from sweeper.validation.grid import seeded

MIN_TARGET_DATES = MIN_TRAIN_DATES  # a refit trains on at least as many target dates as a fold


@dataclass(frozen=True)
class Window:
    """The refit's target dates ``[first, stop)`` and ``until``, the last date it reads (indices)."""

    first: int
    stop: int
    until: int


@dataclass
class Refit:
    record: dict[str, Any]           # what refit.json holds
    folder: Path
    replaced: dict[str, Any] | None  # the record of the refit this one replaced

    def lines(self) -> list[str]:
        r = self.record
        seeds = r.get("seeds") or [r["seed"]]  # a seed ensemble's refit trains every seed
        trained = f"seed {seeds[0]}" if len(seeds) == 1 else f"{len(seeds)} seeds ({str(seeds)[1:-1]})"
        epochs = f"{r['epochs']} epoch{'s' * (r['epochs'] != 1)}"
        again = (f"; it replaced the refit trained to {old.get('until')} ({old.get('created', '?')[:19]})"
                 if (old := self.replaced) else "")
        return [f"refit trial {r['trial']}: {epochs} ({r['epochs_from']}) on {r['target_dates']} target "
                f"dates {r['first_target']} to {r['last_target']} ({r['rows']} rows), labels known "
                f"by {r['until']}; {trained}, {r['device']}, {r['duration_s']:.1f} s",
                f"wrote {self.folder}/ ({', '.join(RefitFiles(self.folder).names(len(seeds)))}){again}"]


def refit_epochs(trial: FrozenTrial) -> tuple[int, str]:
    """``(E, where it came from)``: the median of the trial's ``fold_best_epoch`` (a trial of
    several runs) when it has one, else its ``best_epoch``; rounded half up, at least 1. A trial that
    ``train.max_minutes`` cut short says so: its best epoch may be early only because its training was."""
    timed_out = trial.user_attrs.get("stop_reason") == StopReason.TIME
    cut = ", of a training cut short by train.max_minutes" if timed_out else ""
    if isinstance(folds := trial.user_attrs.get(K.FOLD_BEST_EPOCH), list) and folds:
        median = float(statistics.median(folds))
        return max(1, math.floor(median + 0.5)), f"the median best epoch of {len(folds)} fold(s){cut}"
    best = trial.user_attrs.get("best_epoch")
    if not isinstance(best, (int, float)) or not math.isfinite(best) or best < 1:
        raise ConfigError(f"--trial {trial.number}: trial {trial.number} ({trial.state.name}) has no best "
                          "epoch (user attrs fold_best_epoch, best_epoch) to refit with; pick a finished one")
    return max(1, math.floor(float(best) + 0.5)), f"its best epoch{cut}"


def parse_until(until: str | None) -> np.datetime64 | None:
    return None if until is None else user_day(until, "--until", end=True)  # a bare day: all of it


def refit(cfg: C.SweeperConfig, study: optuna.Study, *, trial: str | int = "best", until: str | None = None,
          device: str | None = None) -> Refit:
    """Refit ``trial`` (``best`` or a number) of ``study`` on the labels known by ``until``
    (default: the panel's last date) and write ``trials/<n>/refit/``. Bad input raises
    ConfigError or DataError before anything is written."""
    from sweeper.core import Member, resolve_device, train_stack

    began = time.perf_counter()
    day = parse_until(until)  # bad input first: nothing read, nothing written
    chosen = pick_trial(study, trial)  # "best": the best feasible COMPLETE trial; topK is refused
    if changed := code_changed(source_digest(cfg), chosen.user_attrs, study.user_attrs):
        raise ConfigError(f"{changed}, so a refit would train another model than trial {chosen.number}'s; "
                          "restore them, or run a new study with the new code")
    epochs, epochs_from = refit_epochs(chosen)
    files = trial_files(files_folder(cfg, study), chosen.number)
    # the trial's config.yaml, or (a trial that never wrote one) its params applied to the study's
    tcfg = (trial_config(files, cfg) if files.config.exists()
            else C.with_overrides(cfg, chosen.params, f"trial {chosen.number} params"))
    panel, window = refit_panel(tcfg.data, day, _rolling(tcfg, chosen, study))
    # exactly E epochs: no time limit, and train's fixed_epochs validates nothing and never stops early
    run_cfg, where = tcfg.with_train(epochs=epochs, max_minutes=None), resolve_device(device)
    # seed repeats: the trial's model is its seed ensemble, so every seed trains, in stacks of its size
    seeds = [Member(seeded(run_cfg, r), panel) for r in range(tcfg.validation.repeats)]
    pinned = tcfg.train.max_stack if tcfg.train.max_stack != "auto" else 1
    size = int(chosen.user_attrs.get("stack_size", pinned))
    results = [result for first in range(0, len(seeds), size)
               for result in train_stack(seeds[first:first + size], device=where, fixed_epochs=True)]
    result = results[0]
    record = {"trial": chosen.number, **_dates(panel, window, tcfg.data), "until_asked": until,
              "epochs": epochs, "epochs_from": epochs_from, "seed": tcfg.train.seed,
              "seeds": [tcfg.train.seed + r for r in range(len(results))],
              "rows": len(panel.sample_index("train")), "device": str(where),
              **{k: result.metrics[k] for k in ("train_loss", "batch_size", "micro_batch_size", "precision")},
              "data": panel.source, "data_fingerprint": panel.fingerprint,
              "duration_s": time.perf_counter() - began, "sweeper_version": __version__,
              "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    assert panel.norm_stats is not None, "refit_panel fits the statistics"
    replaced = write_refit(files, [r.best_state for r in results], panel.norm_stats, record)
    return Refit(record, files.refit, replaced)


def _dates(panel: Panel, window: Window, data: C.DataConfig) -> dict[str, Any]:
    horizon, embargo = split_widths(data)[1:]
    days = panel.sample_index("train")[:, 0].unique()  # the target dates it trained on: those with a label
    return {"until": _iso(panel.dates[window.until]), "first_target": _iso(panel.dates[int(days[0])]),
            "last_target": _iso(panel.dates[int(days[-1])]), "target_dates": len(days),
            "horizon": horizon, "embargo": embargo}


def write_refit(files: TrialFiles, states: list[dict], stats: Any,
                record: dict[str, Any]) -> dict[str, Any] | None:
    """Write the refit's files (one weights file per seed), the record last; returns the record
    of the refit it replaced."""
    refit = files.refit_files
    previous = read_refit(files)
    remove(refit.record)  # from here until the record is back, no refit
    for stale in refit.other_members()[len(states) - 1:]:  # a replaced refit of more seeds
        remove(stale)
    for seed, state in enumerate(states):
        with atomic_path(refit.member_weights(seed)) as tmp:
            torch.save(state, tmp)
    write_text(refit.norm_stats, json.dumps(stats))
    write_text(refit.record, json.dumps(record, indent=2, allow_nan=False))
    return previous


# ---------------------------------------------------------------- the refit's panel
def _rolling(tcfg: C.SweeperConfig, trial: FrozenTrial, study: optuna.Study) -> list[str] | None:
    """A rolling window's last fold's train days (the trial's own layout, as it trained), or None."""
    folds = K.layout(trial.user_attrs) or K.layout(study.user_attrs)  # (a holdout study has none)
    return folds[-1]["train"] if tcfg.validation.window == "rolling" and folds else None


def refit_panel(data: C.DataConfig, until: np.datetime64 | None,
                rolling: list[str] | None = None) -> tuple[Panel, Window]:
    """The panel of the dates up to ``until`` (its rows and labels: the module docstring), its train split the
    refit's window (valid and test empty), built by the panel builder (:func:`sweeper.data.build.build`):
    normalisation fitted on that window, the leak guard judging it."""
    how = recipe(data)
    keys, blocks, _oracle = how.columns()
    check_usable(keys)  # an empty file has no window to speak of
    codes = row_codes(keys)  # each row's date index: a row at index <= until stays, so do the indices
    window = refit_window(codes.dates, data, until, rolling)
    keep = codes.date <= window.until  # nothing after until
    label = np.where(codes.date[keep] < window.stop, keys.label[keep], np.nan).astype(np.float32)
    kept = dataclasses.replace(keys, dates=keys.dates[keep], assets=keys.assets[keep],
                               features=keys.features[keep], label=label)
    empty = (window.stop, window.stop)
    built = build(kept, ((k0, block[keep]) for k0, block in blocks), data, lambda d, s: None, in_memory,
                  splits={"train": (window.first, window.stop), "valid": empty, "test": empty})
    panel = to_panel(built, data, how.fingerprint, how.source)
    if len(panel.sample_index("train")) == 0:
        first, last = _iso(panel.dates[window.first]), _iso(panel.dates[window.stop - 1])
        raise DataError(f"{keys.source}: column '{keys.label_col}': no present row has a finite label "
                        f"between {first} and {last} (--until)")
    return panel, window


def refit_window(dates: np.ndarray, data: C.DataConfig, until: np.datetime64 | None,
                 rolling: list[str] | None = None) -> Window:
    """The target dates a refit to ``until`` trains on; ConfigError when too few are left. ``rolling``: the
    first and last day of a rolling window's last fold, whose length (in dates) the refit keeps."""
    lookback, horizon, embargo = split_widths(data)
    gap = purge_gap(horizon, embargo)
    last = len(dates) - 1 if until is None else int(np.searchsorted(dates, until, side="right")) - 1
    first = lookback - 1
    train = data.split.train
    if not isinstance(train, float):  # date ranges: the study's train split starts at its own
        first = max(first, int(np.searchsorted(dates, user_day(train[0], "data.split.train"), side="left")))
    if rolling is not None:  # its folds' length: the epochs refit_epochs took were found on it
        a, b = (np.searchsorted(dates, user_day(day, "fold_dates", end=k == 1), side="right" if k else "left")
                for k, day in enumerate(rolling))
        first = max(first, last - gap + 1 - int(b - a))
    if (stop := last - gap + 1) - first < MIN_TARGET_DATES:
        earliest = first + MIN_TARGET_DATES - 1 + gap
        hint = f"; the earliest --until is {_iso(dates[earliest])}" if earliest < len(dates) else ""
        asked = "the data's last date" if until is None else _iso(until)
        raise ConfigError(f"--until {asked}: {max(stop - first, 0)} target dates from "
                          f"{_iso(dates[min(first, len(dates) - 1)])} with a label known by then, too few: "
                          f"a refit needs at least {MIN_TARGET_DATES} after the lookback's warm-up of "
                          f"{lookback - 1} dates (data.split.lookback) and before the purge of {gap} "
                          f"(data.split.horizon + data.split.embargo){hint}")
    return Window(first, stop, last)


def _iso(day: np.datetime64) -> str:
    return pd.Timestamp(day).strftime("%Y-%m-%d")
