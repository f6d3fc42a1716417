"""Training one trial over its walk-forward folds and seed repeats: the one loop that runs
them (docs/walk-forward.md).

Runs go fold by fold, seed by seed (seed ``r`` trains with ``train.seed + r``), each through
:func:`sweeper.core.train` on the fold's panel (:func:`sweeper.data.folds.fold_panel`, built
once per fold). A run that finished is recorded in its folder, ``runs/fold-<f>.seed-<r>/``,
``result.json`` written last: a retry skips the runs that have one and continues the run in
progress from the trial's checkpoint, whose owner stamp names its fold and repeat.

The run stops early, leaving the later folds unrun, when the run is pruned (the hook reports at
the global step ``(f * repeats + r) * epochs + epoch``, so the study's pruner compares trials
at the same fold, seed and epoch) or when ``train.max_minutes``, counted from the trial's
start across all folds, runs out.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from sweeper.atomic import atomic_path, write_text
from sweeper.config import SweeperConfig
from sweeper.core.checkpoint import FileCheckpointer
from sweeper.core.device import TrialMemory
from sweeper.core.hooks import Checkpointer, EpochHook, NullCheckpointer
from sweeper.core.loop import TrainResult
from sweeper.data.folds import Fold, fold_dates, fold_layout, fold_panel
from sweeper.data.load import PanelMemo
from sweeper.data.panel import Panel
from sweeper.store.layout import TrialFiles
from sweeper.validation.scores import Run

RESULT, PREDICTIONS, DAILY = "result.json", "predictions_valid.parquet", "daily_ic_valid.csv"
WEIGHTS, NORM_STATS, DAILY_TEST = "weights.pt", "norm_stats.json", "daily_ic_test.csv"
CUT_SHORT = ("pruned", "time")  # a run that ended so ends the trial's runs


def seeded(cfg: SweeperConfig, repeat: int) -> SweeperConfig:
    """The config of repeat ``repeat`` (0-based): seed ``train.seed + repeat``."""
    if repeat == 0:
        return cfg
    return cfg.model_copy(update={"train": cfg.train.model_copy(update={"seed": cfg.train.seed + repeat})})


def global_step(cfg: SweeperConfig, fold: int, repeat: int, epoch: int) -> int:
    """The intermediate value's step of a run's epoch (fold, repeat 0-based; epoch 1-based)."""
    return (fold * cfg.validation.repeats + repeat) * cfg.train.epochs + epoch


def model_run(cfg: SweeperConfig) -> tuple[int, int]:
    """(fold, repeat) of the run whose model is the trial's: the last fold's first seed."""
    return cfg.validation.n_folds - 1, 0


@dataclass
class Outcome:
    """The runs a trial made (or a retry found finished), in order, and why they stopped."""

    folds: list[Fold]
    fold_dates: list[dict[str, list[str]]]
    runs: list[Run] = field(default_factory=list)
    predictions: dict[tuple[int, int], pd.DataFrame] = field(default_factory=dict)
    daily: dict[tuple[int, int], pd.DataFrame] = field(default_factory=dict)
    model: TrainResult | None = None  # the model run's result, when it trained in this process
    cut_short: str | None = None      # pruned | time: the later runs were not run

    @property
    def folds_run(self) -> int:
        """Folds with a scored run (the last may be cut short): ``len(fold_val_ic)``."""
        return len({r.fold for r in self.runs})

    @property
    def stop_reason(self) -> str:
        return self.cut_short or (self.runs[-1].stop_reason if self.runs else "epochs")


class RunCheckpointer(FileCheckpointer):
    """The trial's checkpoint, as seen by one run: it loads only a state its own run saved
    (the file may hold the previous run's last epoch until this run saves its first)."""

    def load(self) -> dict | None:
        state = super().load()
        was = (state or {}).get("owner") or {}
        mine = self.owner or {}
        if state is None or (was.get("fold"), was.get("repeat")) != (mine.get("fold"), mine.get("repeat")):
            return None
        return state


class RunStore:
    """A trial's ``runs/`` folder: which runs finished, their files, their checkpointer."""

    def __init__(self, files: TrialFiles, stamp: dict[str, Any]) -> None:
        self.files, self.stamp = files, stamp

    def folder(self, fold: int, repeat: int) -> Path:
        return self.files.run(fold + 1, repeat + 1)

    def finished(self, fold: int, repeat: int) -> Run | None:
        path = self.folder(fold, repeat) / RESULT
        if not path.exists():
            return None
        raw = json.loads(path.read_text())
        metrics = {k: (math.nan if v is None else v) for k, v in raw["metrics"].items()}
        return Run(int(raw["fold"]) - 1, int(raw["repeat"]) - 1, int(raw["seed"]), metrics,
                   str(raw.get("stop_reason", "epochs")))

    def frames(self, fold: int, repeat: int) -> tuple[pd.DataFrame, pd.DataFrame]:
        folder = self.folder(fold, repeat)
        return pd.read_parquet(folder / PREDICTIONS), pd.read_csv(folder / DAILY, parse_dates=["date"])

    def checkpointer(self, fold: int, repeat: int, dates: dict[str, list[str]]) -> RunCheckpointer:
        owner = {**self.stamp, "fold": fold + 1, "repeat": repeat + 1, "fold_dates": dates}
        return RunCheckpointer(self.files.checkpoint, owner)

    def save(self, run: Run, result: TrainResult, panel: Panel, is_model: bool) -> None:
        folder = self.folder(run.fold, run.repeat)
        folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(folder / PREDICTIONS) as tmp:
            result.predictions["valid"].to_parquet(tmp, index=False)
        with atomic_path(folder / DAILY) as tmp:
            result.daily["valid"].to_csv(tmp, index=False)
        if is_model:  # the trial's model: the worker moves its weights into the trial's folder
            with atomic_path(folder / WEIGHTS) as tmp:
                torch.save(result.best_state, tmp)
            if panel.norm_stats is not None:
                write_text(folder / NORM_STATS, json.dumps(panel.norm_stats))
            with atomic_path(folder / DAILY_TEST) as tmp:
                result.daily["test"].to_csv(tmp, index=False)
        body = {"fold": run.fold + 1, "repeat": run.repeat + 1, "seed": run.seed,
                "stop_reason": run.stop_reason, "metrics": {k: _plain(v) for k, v in run.metrics.items()}}
        write_text(folder / RESULT, json.dumps(body, indent=1))  # last: the run is finished


@dataclass
class Trainer:
    """What every run of the trial shares: how it trains and reports."""

    cfg: SweeperConfig
    hook: EpochHook
    started: float
    device: torch.device | str | None = None
    log: Callable[[str], None] | None = None
    memory: TrialMemory | None = None
    store: RunStore | None = None  # None: nothing kept on disk (``sweeper train``)
    # a worker's panels: robust_zscore's fold panels (built from the data) kept for its next
    # trial, which usually shares its data; None: built once per fold for this trial only
    panels: PanelMemo | None = None


def train_runs(panel: Panel, trainer: Trainer) -> Outcome:
    """Train (or, for a retry, find finished) every run of the trial, fold by fold."""
    cfg, store = trainer.cfg, trainer.store
    folds = fold_layout(panel, cfg)
    out = Outcome(folds, fold_dates(panel, folds) if cfg.validation.walk_forward else [])
    deadline = trainer.started + cfg.train.max_minutes * 60 if cfg.train.max_minutes else math.inf
    last = (len(folds) - 1, cfg.validation.repeats - 1)
    for fold in folds:
        fpanel: Panel | None = None
        for repeat in range(cfg.validation.repeats):
            done = store.finished(fold.index, repeat) if store is not None else None
            if done is not None and store is not None:
                out.runs.append(done)
                out.predictions[(fold.index, repeat)], out.daily[(fold.index, repeat)] = store.frames(
                    fold.index, repeat)
                continue
            if out.runs and time.monotonic() > deadline:
                # no run starts past the budget (its one step would score nothing); the first
                # always starts, as a holdout trial's run does, so a trial is never without a score
                out.cut_short = "time"
                return out
            if fpanel is None:
                fpanel = _fold_panel(trainer, panel, fold)
                _tick(trainer.hook)  # building a fold's panel is progress, for the stall watchdog
            run = _train_one(trainer, fpanel, fold, repeat, out)
            if run.stop_reason in CUT_SHORT and (fold.index, repeat) != last:
                out.cut_short = run.stop_reason
                return out
    return out


def _fold_panel(trainer: Trainer, panel: Panel, fold: Fold) -> Panel:
    """The fold's panel, once per fold: every seed of the fold trains on the same one. A
    cross-sectional norm's is a cheap view of ``panel``; robust_zscore's is built from the data,
    so a worker keeps it for its next trial."""
    data = trainer.cfg.data
    if trainer.panels is None or data.feature_norm != "robust_zscore":
        return fold_panel(panel, fold, data)
    key = {"fold_of": data.model_dump(mode="json"), "train": fold.train, "valid": fold.valid}
    return trainer.panels.get(key, lambda: fold_panel(panel, fold, data))


def _train_one(trainer: Trainer, panel: Panel, fold: Fold, repeat: int, out: Outcome) -> Run:
    from sweeper.core import train

    cfg = seeded(trainer.cfg, repeat)
    say = trainer.log or (lambda line: None)
    dates = out.fold_dates[fold.index] if out.fold_dates else {}
    where = f"fold {fold.index + 1}/{len(out.folds)}" if out.fold_dates else "holdout"
    say(f"{where}, seed {repeat + 1}/{cfg.validation.repeats} (train.seed {cfg.train.seed})"
        + (f": train {dates['train'][0]}..{dates['train'][1]}, valid {dates['valid'][0]}..{dates['valid'][1]}"
           if dates else ""))
    begin = getattr(trainer.hook, "begin_run", None)  # optional: a hook that steps by run
    if begin is not None:
        begin(fold.index, repeat, global_step(cfg, fold.index, repeat, 0))
    store = trainer.store
    checkpoint: Checkpointer = (store.checkpointer(fold.index, repeat, dates) if store is not None
                                else NullCheckpointer())
    is_model = (fold.index, repeat) == model_run(cfg)
    # only the trial's model is scored on test: every other run's panel has an empty test split,
    # so no other run reads a test date at all (its closing line says test_ic nan)
    scored = panel if is_model else _without_test(panel)
    result = train(cfg, scored, device=trainer.device, hook=trainer.hook, checkpoint=checkpoint,
                   log=trainer.log, started=trainer.started, memory=trainer.memory)
    metrics = {k: v for k, v in result.metrics.items() if is_model or not k.startswith("test_")}
    run = Run(fold.index, repeat, cfg.train.seed, metrics, result.stop_reason)
    if store is not None:
        store.save(run, result, panel, is_model)
    out.runs.append(run)
    out.predictions[(fold.index, repeat)] = result.predictions["valid"]
    out.daily[(fold.index, repeat)] = result.daily["valid"]
    if is_model:
        out.model = result
    return run


def _without_test(panel: Panel) -> Panel:
    start = panel.splits["test"][0]
    return dataclasses.replace(panel, splits={**panel.splits, "test": (start, start)}, _cache={})


def _tick(hook: EpochHook) -> None:
    tick = getattr(hook, "tick", None)
    if tick is not None:
        tick()


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
