"""``sweeper refit``: a trial's config trained on every labelled date up to ``--until``, the
production model (docs/refit.md).

The trial's resolved config trains on every target date from the study's first train target
(after the lookback's warm-up) to the last one whose label is known by ``until``: with the
study's pinned widths, the last target ``t`` has ``t + horizon + embargo <= until`` in date
index terms. Nothing later than ``until`` enters the panel, and the labels of the dates
between the last target and ``until`` (they reach past it) are dropped too. ``robust_zscore``
is fitted on this window. There is no valid split and no early stopping: the core trains
exactly E epochs (:func:`refit_epochs`) with the trial's seed, precision and batch plan, and
the last epoch's weights are the refit.

It writes ``trials/<n>/refit/``: ``weights.pt``, ``norm_stats.json``, then ``refit.json``
(each atomically; the record goes last and is removed first when a refit is replaced, so a
reader never takes half a refit for one). ``predict --data`` uses it
(:mod:`sweeper.inspect.trial_model`).
"""
from __future__ import annotations

import datetime
import hashlib
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
from sweeper.data import synth
from sweeper.data.build import in_memory, scatter
from sweeper.data.columns import Columns, row_codes
from sweeper.data.features import select
from sweeper.data.folds import MIN_TRAIN_DATES
from sweeper.data.leak import judge_leaks, mean_daily_corr
from sweeper.data.normalize import fit_stats, normalize_inplace, normalize_label
from sweeper.data.panel import Panel
from sweeper.data.parquet import feature_blocks, file_fingerprint, read_keys, read_plan
from sweeper.data.split import purge_gap, split_widths
from sweeper.errors import ConfigError, DataError
from sweeper.inspect.predict import pick_trial
from sweeper.inspect.trial_model import REFIT_RECORD, REFIT_STATS, REFIT_WEIGHTS, read_refit, trial_config
from sweeper.store.layout import TrialFiles, trial_files
from sweeper.store.run_folder import study_folder

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
        said = [f"refit trial {r['trial']}: {r['epochs']} epochs ({r['epochs_from']}) on {r['target_dates']} "
                f"target dates {r['first_target']} to {r['last_target']} ({r['rows']} rows), labels known "
                f"by {r['until']}; seed {r['seed']}, {r['device']}, {r['duration_s']:.1f} s"]
        old = self.replaced
        again = (f"; it replaced the refit trained to {old.get('until')} ({old.get('created', '?')[:19]})"
                 if old else "")
        said.append(f"wrote {self.folder}/ ({REFIT_WEIGHTS}, {REFIT_STATS}, {REFIT_RECORD}){again}")
        return said


def refit_epochs(trial: FrozenTrial) -> tuple[int, str]:
    """``(E, where it came from)``: the median of the trial's ``fold_best_epoch`` (walk_forward,
    or repeats) when it has one, else its ``best_epoch``; rounded half up, at least 1."""
    folds = trial.user_attrs.get("fold_best_epoch")
    if isinstance(folds, list) and folds:
        median = float(statistics.median(folds))
        return max(1, math.floor(median + 0.5)), f"the median best epoch of {len(folds)} fold(s)"
    best = trial.user_attrs.get("best_epoch")
    if not isinstance(best, (int, float)) or not math.isfinite(best) or best < 1:
        raise ConfigError(f"--trial {trial.number}: trial {trial.number} ({trial.state.name}) has no best "
                          "epoch (user attrs fold_best_epoch, best_epoch) to refit with; pick a finished one")
    return max(1, math.floor(float(best) + 0.5)), "its best epoch"


def parse_until(until: str | None) -> np.datetime64 | None:
    if until is None:
        return None
    try:
        day = pd.Timestamp(str(until))
    except (ValueError, TypeError):
        day = None
    if day is None or pd.isna(day):
        raise ConfigError(f"--until: cannot parse the date {until!r} (expected e.g. 2014-06-30)")
    if day.tzinfo is not None:
        day = day.tz_convert("UTC").tz_localize(None)
    return day.to_datetime64().astype("datetime64[ns]")


def refit(cfg: C.SweeperConfig, study: optuna.Study, *, trial: str | int = "best", until: str | None = None,
          device: str | None = None) -> Refit:
    """Refit ``trial`` (``best`` or a number) of ``study`` on the labels known by ``until``
    (default: the panel's last date) and write ``trials/<n>/refit/``. Bad input raises
    ConfigError or DataError before anything is written."""
    from sweeper.core import resolve_device, train

    began = time.perf_counter()
    day = parse_until(until)  # bad input first: nothing read, nothing written
    chosen = pick_trial(study, trial)  # "best": the best feasible COMPLETE trial; topK is refused
    epochs, epochs_from = refit_epochs(chosen)
    files = trial_files(study_folder(cfg, study), chosen.number)
    tcfg = resolved_config(cfg, chosen, files)
    panel, window = refit_panel(tcfg.data, day)
    # exactly E epochs: no time limit, and train's fixed_epochs validates nothing and never stops early
    run_cfg = tcfg.model_copy(update={"train": tcfg.train.model_copy(update={"epochs": epochs,
                                                                              "max_minutes": None})})
    where = resolve_device(device)
    result = train(run_cfg, panel, device=where, fixed_epochs=True)
    record = {"trial": chosen.number, **_dates(panel, window, tcfg.data), "until_asked": until,
              "epochs": epochs, "epochs_from": epochs_from, "seed": tcfg.train.seed,
              "rows": len(panel.sample_index("train")), "device": str(where),
              **{k: result.metrics[k] for k in ("train_loss", "batch_size", "micro_batch_size", "precision")},
              "data": panel.source, "data_fingerprint": panel.fingerprint,
              "duration_s": time.perf_counter() - began, "sweeper_version": __version__,
              "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    assert panel.norm_stats is not None, "refit_panel fits the statistics"
    replaced = write_refit(files, result.best_state, panel.norm_stats, record)
    return Refit(record, files.refit, replaced)


def _dates(panel: Panel, window: Window, data: C.DataConfig) -> dict[str, Any]:
    horizon, embargo = split_widths(data)[1:]
    return {"until": _iso(panel.dates[window.until]), "first_target": _iso(panel.dates[window.first]),
            "last_target": _iso(panel.dates[window.stop - 1]), "target_dates": window.stop - window.first,
            "horizon": horizon, "embargo": embargo}


def resolved_config(cfg: C.SweeperConfig, trial: FrozenTrial, files: TrialFiles) -> C.SweeperConfig:
    """The trial's ``config.yaml``, or (a trial that never wrote one) its params applied to the study's."""
    if files.config.exists():
        return trial_config(files)
    return C.with_overrides(cfg, trial.params, f"trial {trial.number} params")


def write_refit(files: TrialFiles, state: dict, stats: Any, record: dict[str, Any]) -> dict[str, Any] | None:
    """Write the refit's files, the record last; returns the record of the refit it replaced."""
    folder = files.refit
    previous = read_refit(files)
    (folder / REFIT_RECORD).unlink(missing_ok=True)  # from here until the record is back, no refit
    with atomic_path(folder / REFIT_WEIGHTS) as tmp:
        torch.save(state, tmp)
    write_text(folder / REFIT_STATS, json.dumps(stats))
    write_text(folder / REFIT_RECORD, json.dumps(record, indent=2, allow_nan=False))
    return previous


# ---------------------------------------------------------------- the refit's panel

def refit_panel(data: C.DataConfig, until: np.datetime64 | None) -> tuple[Panel, Window]:
    """The panel of the dates up to ``until``, its train split the refit's window (valid and
    test empty), normalised with statistics fitted on that window; the leak guard judges it."""
    keys, blocks, fingerprint = _columns(data)
    codes = row_codes(keys)
    window = refit_window(codes.dates, data, until)
    X, y_raw, mask = scatter(keys, codes, blocks, in_memory)
    cut = window.until + 1  # nothing after until
    X, y_raw, mask = X[:cut], y_raw[:cut].copy(), mask[:cut]
    y_raw[window.stop:] = np.nan  # the labels past the last target reach past until
    span = (window.first, window.stop)
    corr, rows = mean_daily_corr(X, y_raw, mask, span)
    judge_leaks(corr, rows, data.max_feature_label_corr, keys.feature_names, keys.source, keys.label_col)
    fit_dates = (max(window.first - data.lookback + 1, 0), window.stop)  # what the train windows see
    stats = fit_stats(torch.from_numpy(X), torch.from_numpy(mask), data.feature_norm, fit_dates,
                      list(keys.feature_names))
    normalize_inplace(X, mask, data.feature_norm, stats)
    y_t = torch.from_numpy(y_raw)
    y = normalize_label(y_t, torch.from_numpy(mask), data.label_norm)
    empty = (window.stop, window.stop)
    panel = Panel(X=torch.from_numpy(X), y=y, y_raw=y_t, mask=torch.from_numpy(mask), dates=codes.dates[:cut],
                  assets=codes.assets, features=list(keys.feature_names),
                  splits={"train": span, "valid": empty, "test": empty}, lookback=data.lookback,
                  oracle_ic=None, source=keys.source, fingerprint=fingerprint, norm_stats=stats)
    if len(panel.sample_index("train")) == 0:
        first, last = _iso(panel.dates[window.first]), _iso(panel.dates[window.stop - 1])
        raise DataError(f"{keys.source}: column '{keys.label_col}': no present row has a finite label "
                        f"between {first} and {last} (--until)")
    return panel, window


def refit_window(dates: np.ndarray, data: C.DataConfig, until: np.datetime64 | None) -> Window:
    """The target dates a refit to ``until`` trains on; ConfigError when too few are left."""
    lookback, horizon, embargo = split_widths(data)
    gap = purge_gap(horizon, embargo)
    last = len(dates) - 1 if until is None else int(np.searchsorted(dates, until, side="right")) - 1
    first = lookback - 1
    train = data.split.train
    if not isinstance(train, float):  # date ranges: the study's train split starts at its own
        first = max(first, int(np.searchsorted(dates, pd.Timestamp(train[0]).to_datetime64(), side="left")))
    stop = last - gap + 1
    if stop - first < MIN_TARGET_DATES:
        earliest = first + MIN_TARGET_DATES - 1 + gap
        hint = f"; the earliest --until is {_iso(dates[earliest])}" if earliest < len(dates) else ""
        asked = "the data's last date" if until is None else _iso(until)
        raise ConfigError(
            f"--until {asked}: {max(stop - first, 0)} target dates from "
            f"{_iso(dates[min(first, len(dates) - 1)])} with a label known by then, too few: a refit "
            f"needs at least {MIN_TARGET_DATES} after the lookback's warm-up of {lookback - 1} dates "
            f"(data.split.lookback) and before the purge of {gap} (data.split.horizon + "
            f"data.split.embargo){hint}")
    return Window(first, stop, last)


def _columns(data: C.DataConfig) -> tuple[Columns, Any, str]:
    """``(keys, feature blocks, fingerprint)`` of the study's data, as :mod:`sweeper.data.load`
    reads them, before anything is split or normalised."""
    if data.synthetic is None:
        path, features, _ = read_plan(data)
        keys = read_keys(path, data, features)
        selection = {"date": data.date_col, "asset": data.asset_col, "label": data.label,
                     "features": features}
        return keys, feature_blocks(path, features, len(keys.label)), file_fingerprint(path, selection)
    p = data.synthetic
    source = synth.describe(p.assets, p.dates, p.features, p.seed)
    names = synth.feature_names(p.features)
    chosen = select(names, ["date", "asset", *names, "label"], data.features, data.exclude, source)
    frame = synth.generate(p.assets, p.dates, p.features, p.seed)
    keys = Columns(source=source, date_col="date", asset_col="asset", label_col="label",
                   dates=frame["date"].to_numpy("datetime64[ns]"), assets=frame["asset"].to_numpy(object),
                   features=np.empty((len(frame), 0), dtype=np.float32),
                   label=frame["label"].to_numpy(np.float32), feature_names=chosen)
    blob = json.dumps({"synthetic": p.model_dump(), "generator": synth.GENERATOR_VERSION, "features": chosen},
                      sort_keys=True)
    return keys, [(0, frame[chosen].to_numpy(np.float32))], hashlib.sha256(blob.encode()).hexdigest()


def _iso(day: np.datetime64) -> str:
    return pd.Timestamp(day).strftime("%Y-%m-%d")
