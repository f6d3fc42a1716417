"""The training core's epoch hook inside a worker: per-epoch metrics to ``metrics.csv``, the objective to
Optuna (for pruning), an ``epoch`` event to the driver, and ``progress`` events while steps and evaluation
batches go on (the driver's stall watchdog lives on them)."""

import csv
import math
import time
from pathlib import Path
from typing import Any

import optuna

from sweeper.atomic import append_csv
from sweeper.core.hooks import NullHook
from sweeper.interrupt import StopToken
from sweeper.validation.grid import RunGrid, named_run
from sweeper.worker import protocol

PROGRESS_EVERY_S = 5.0  # the most a progress event waits; shorter when study.stall_timeout is short


class OptunaHook(NullHook):
    """Reports the objective each epoch, prunes, logs metrics.csv, and tells the driver."""

    def __init__(self, trial: optuna.Trial, metric: str, number: int, metrics_csv: Path,
                 stop: StopToken, stall_timeout: float | None = None) -> None:
        self.trial, self.metric, self.number = trial, metric, number
        self.metrics_csv, self.stop = metrics_csv, stop
        self.pruned, self.steps = False, 0
        # a trial of several runs (walk-forward folds, seed repeats) steps on across its stacks: the
        # stack's offset is added to its epoch, and metrics.csv rows say which fold and seed they are
        self.offset = 0
        self.runs: list[dict[str, int]] = [{}]
        # progress several times within study.stall_timeout: one slow pipe or busy driver turn
        # never makes a live trial look stalled
        self.progress_every = min(PROGRESS_EVERY_S, stall_timeout / 4 if stall_timeout else math.inf)
        self._next_progress = 0.0  # the first step is reported at once

    def on_probe(self, peak_mb: float | None) -> None:
        """The batch probe's measured peak at the micro-batch it chose: the driver packs trials
        on a GPU by it, long before the first epoch's peak comes."""
        if peak_mb is not None and math.isfinite(peak_mb):
            protocol.emit(protocol.MEMORY, number=self.number, peak_mb=peak_mb)

    def begin(self, runs: list[dict[str, int]], offset: int) -> None:
        """The next epochs are a stack's: the columns naming each member's run, and the stack's
        offset (:meth:`RunGrid.step`); each epoch reports one value, the mean over the members
        still training, so the pruner compares trials at the same runs and epoch."""
        self.offset, self.runs = offset, runs

    def on_epoch(self, epoch: int, rows: list[dict[str, Any] | None]) -> bool:
        values = [self._record(columns, epoch, row)
                  for columns, row in zip(self.runs, rows) if row is not None]
        if not (finite := [v for v in values if v is not None]):
            return False
        self.trial.report(sum(finite) / len(finite), self.offset + epoch)
        self.pruned = self.trial.should_prune()
        return self.pruned

    def _record(self, columns: dict[str, int], epoch: int, metrics: dict[str, Any]) -> float | None:
        """One run's epoch in metrics.csv and to the driver (with its fold and repeat, and the size
        of the stack it trains in: the driver's view says which run this is); its finite metric value."""
        append_csv(self.metrics_csv, [{**columns, "epoch": epoch, **metrics}])
        protocol.emit(protocol.EPOCH, number=self.number, epoch=epoch,
                      metrics={**columns, **metrics, "stack": len(self.runs)})
        value = metrics.get(self.metric)
        return float(value) if value is not None and math.isfinite(value) else None

    def should_stop(self) -> bool:
        self.steps += 1  # polled once before every training step
        self.tick()
        return self.stop.requested

    def tick(self) -> None:
        """Tell the driver the trial moves (a step or an evaluation batch), at most every
        ``progress_every`` seconds: a clock read per batch, an event a few times a minute."""
        if (now := time.monotonic()) >= self._next_progress:
            self._next_progress = now + self.progress_every
            protocol.emit(protocol.PROGRESS, number=self.number, steps=self.steps)


def copy_csv_upto(src: Path, dst: Path, step: int, grid: RunGrid) -> None:
    """The rows of ``src`` up to the grid's ``step``, appended to ``dst`` (a retry's replayed
    history; a row's step is :meth:`RunGrid.step_of_row`), each naming its run as the retry's own
    rows do (a row of an older one-run trial names none: :func:`~sweeper.validation.grid.named_run`)."""
    with src.open() as fh:
        rows = [r for r in csv.DictReader(fh) if grid.step_of_row(r) <= step]
    for row in rows:
        append_csv(dst, [{**grid.columns(*named_run(row)), **row}])
