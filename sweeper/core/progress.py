"""What the loop carries from epoch to epoch: history, the best epoch and its weights,
the patience and non-finite counters; plus the one-line epoch summary."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from torch import nn


@dataclass
class Progress:
    """What the loop carries from epoch to epoch (and what a checkpoint restores)."""

    epoch: int = 0
    best: float | None = None
    best_epoch: int = 0
    best_state: dict = field(default_factory=dict)
    best_metrics: dict = field(default_factory=dict)
    bad_epochs: int = 0
    nonfinite_steps: int = 0
    history: list[dict] = field(default_factory=list)

    def record(self, epoch: int, metrics: dict, key: str, model: nn.Module) -> None:
        self.epoch = epoch
        self.history.append(metrics)
        value = metrics[key]
        lower = key == "val_loss"
        better = math.isfinite(value) and (self.best is None or not math.isfinite(self.best)
                                           or (value < self.best if lower else value > self.best))
        if better or not self.best_state:  # the first epoch is the best until beaten
            self.best, self.best_epoch, self.best_metrics = value, epoch, metrics
            self.best_state = cpu_copy(model.state_dict())
            self.bad_epochs = 0 if better else self.bad_epochs + 1
        else:
            self.bad_epochs += 1


def cpu_copy(state_dict: dict) -> dict:
    return {k: v.detach().to("cpu", copy=True) for k, v in state_dict.items()}


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def epoch_line(m: dict, epochs: int) -> str:
    return (f"epoch {m['epoch']}/{epochs} train_loss {m['train_loss']:.4f} val_loss {m['val_loss']:.4f} "
            f"val_ic {m['val_ic']:.4f} val_rank_ic {m['val_rank_ic']:.4f} {m['samples_per_s']:.0f} samples/s")
