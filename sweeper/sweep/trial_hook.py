"""The training core's epoch hook inside a worker: per-epoch metrics to
``metrics.csv``, the objective to Optuna (for pruning), and an ``epoch`` event
to the driver."""
from __future__ import annotations

import csv
import math
import threading
from pathlib import Path
from typing import Any

import optuna

from sweeper.sweep import protocol


class OptunaHook:
    """Reports the objective each epoch, prunes, logs metrics.csv, and tells the driver."""

    def __init__(self, trial: optuna.Trial, metric: str, number: int, metrics_csv: Path,
                 stop: threading.Event) -> None:
        self.trial, self.metric, self.number, self.metrics_csv, self.stop = trial, metric, number, metrics_csv, stop
        self.pruned = False

    def on_epoch(self, epoch: int, metrics: dict[str, Any]) -> bool:
        append_csv(self.metrics_csv, {"epoch": epoch, **metrics})
        value = metrics.get(self.metric)
        protocol.emit(protocol.EPOCH, number=self.number, epoch=epoch, metrics=metrics)
        if value is None or not math.isfinite(value):
            return False
        self.trial.report(float(value), epoch)
        self.pruned = self.trial.should_prune()
        return self.pruned

    def should_stop(self) -> bool:
        return self.stop.is_set()


def append_csv(path: Path, row: dict[str, Any]) -> None:
    new = not path.exists()
    with path.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(row))
        if new:
            writer.writeheader()
        writer.writerow(row)


def copy_csv_upto(src: Path, dst: Path, epoch: int) -> None:
    """The rows of ``src`` up to ``epoch``, appended to ``dst`` (a retry's replayed history)."""
    with src.open() as fh:
        rows = [r for r in csv.DictReader(fh) if int(float(r["epoch"])) <= epoch]
    for row in rows:
        append_csv(dst, row)
