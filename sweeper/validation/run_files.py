"""Where a trial's runs keep their files: ``runs/fold-<f>.seed-<r>/`` (a holdout trial's one run
too), each finished run's ``result.json`` last, so that a retry skips the finished ones; and the
trial's checkpoint as one run (or stack) sees it."""

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from sweeper.atomic import atomic_path, write_text
from sweeper.core.checkpoint import FileCheckpointer
from sweeper.core.loop import TrainResult
from sweeper.data.panel import Panel
from sweeper.errors import StopReason
from sweeper.plain import plain
from sweeper.store.layout import SPLITS, TrialFiles
from sweeper.validation import contract as K
from sweeper.validation.grid import RunGrid, named_run
from sweeper.validation.scores import TrainingRun


class RunCheckpointer(FileCheckpointer):
    """The trial's checkpoint, as seen by one run: it loads only a state its own run (or stack)
    saved (the file may hold the previous run's last epoch until this run saves its first)."""

    def load(self) -> dict | None:
        state = super().load()
        was = (state or {}).get("owner") or {}
        mine = self.owner or {}
        return state if named_run(was) == named_run(mine) and was.get("stack") == mine.get("stack") else None


class RunStore:
    def __init__(self, files: TrialFiles, stamp: dict[str, Any], grid: RunGrid) -> None:
        self.files, self.stamp, self.grid = files, stamp, grid

    def finished(self, fold: int, repeat: int) -> TrainingRun | None:
        if not (path := self.files.run_files(fold, repeat).result).exists():
            return None
        raw = json.loads(path.read_text())
        metrics = {k: (math.nan if v is None else v) for k, v in raw["metrics"].items()}
        return TrainingRun(int(raw["fold"]) - 1, int(raw["repeat"]) - 1, int(raw["seed"]), metrics,
                           str(raw.get("stop_reason", StopReason.EPOCHS)))

    def frames(self, fold: int, repeat: int) -> tuple[pd.DataFrame, pd.DataFrame]:
        run = self.files.run_files(fold, repeat)
        return (pd.read_parquet(run.predictions("valid")),
                pd.read_csv(run.daily_ic("valid"), parse_dates=["date"]))

    def member_frames(self, fold: int, repeat: int) -> dict[str, pd.DataFrame]:
        run = self.files.run_files(fold, repeat)
        return {split: pd.read_parquet(run.predictions(split)) for split in SPLITS}

    def save_predictions(self, frames: dict[str, pd.DataFrame]) -> None:
        _write_frames(frames, self.files.predictions)

    def checkpointer(self, fold: int, repeat: int, dates: dict[str, list[str]],
                     stack: list[tuple[int, int]] | None = None) -> FileCheckpointer:
        """The checkpoint of run (fold, repeat), or of the stack it leads (``stack``: its runs):
        the owner names the run, as a lone run's does, and a stack's its runs too (1-based)."""
        owner = {**self.stamp, "fold": fold + 1, "repeat": repeat + 1, K.FOLD_DATES: dates,
                 **({"stack": [[f + 1, r + 1] for f, r in stack]} if stack is not None else {})}
        return RunCheckpointer(self.files.checkpoint, owner)

    def save(self, run: TrainingRun, result: TrainResult, panel: Panel,
             frames: dict[str, pd.DataFrame] | None = None) -> None:
        """The run's files; the model run's weights, normalisation and daily test IC too (the worker moves
        them into the trial's folder). ``frames``: a seed of the ensemble's predictions on valid and test as
        ``predict`` computes them, which the ensemble (and a retry's) is made of, in place of the training's
        valid frame. ``result.json`` last: the run is finished."""
        files = self.files.run_files(run.fold, run.repeat)
        files.folder.mkdir(parents=True, exist_ok=True)
        if model := self.grid.is_model(run.fold, run.repeat):
            with atomic_path(files.weights) as tmp:
                torch.save(result.best_state, tmp)
            if panel.norm_stats is not None:  # new data (predict --data) is normalised with these
                write_text(files.norm_stats, json.dumps(panel.norm_stats))
        _write_frames(frames or {"valid": result.predictions["valid"]}, files.predictions)
        for split in SPLITS if model else ("valid",):
            with atomic_path(files.daily_ic(split)) as tmp:
                result.daily[split].to_csv(tmp, index=False)
        body = {"fold": run.fold + 1, "repeat": run.repeat + 1, "seed": run.seed,
                "stop_reason": run.stop_reason, "metrics": {k: plain(v) for k, v in run.metrics.items()}}
        write_text(files.result, json.dumps(body, indent=1))


def _write_frames(frames: dict[str, pd.DataFrame], path_of: Callable[[str], Path]) -> None:
    for split, frame in frames.items():
        with atomic_path(path_of(split)) as tmp:
            frame.to_parquet(tmp, index=False)
