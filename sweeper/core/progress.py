"""What the loop carries from epoch to epoch, what it learns of an epoch's steps at each host sync,
and the one-line epoch summary."""

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class Progress:
    """History, the best epoch and its weights, the patience and non-finite counters."""

    epoch: int = 0
    best: float | None = None
    best_epoch: int = 0
    best_state: dict = field(default_factory=dict)
    best_metrics: dict = field(default_factory=dict)
    bad_epochs: int = 0
    nonfinite_steps: int = 0
    history: list[dict] = field(default_factory=list)

    def record(self, epoch: int, metrics: dict, key: str, weights: Callable[[], dict]) -> None:
        """The epoch's ``metrics``; ``weights()`` (CPU copies) are kept when it is the best yet."""
        self.epoch = epoch
        self.history.append(metrics)
        value = metrics[key]
        better = math.isfinite(value) and (self.best is None or not math.isfinite(self.best)
                                           or (value < self.best if key == "val_loss" else value > self.best))
        if better or not self.best_state:  # the first epoch is the best until beaten
            self.best, self.best_epoch, self.best_metrics = value, epoch, metrics
            self.best_state = weights()
        self.bad_epochs = 0 if better else self.bad_epochs + 1


@dataclass
class EpochSteps:
    """An epoch's steps as the host learns them: each leaves its loss and skip flag (1.0: no update,
    something was non-finite) on the device; :meth:`sync` reads every pending pair in one transfer."""

    loss_sum: float = 0.0
    updates: int = 0
    pending: list[torch.Tensor] = field(default_factory=list)

    def add(self, loss: torch.Tensor, skipped: torch.Tensor) -> None:
        self.pending += (loss, skipped)

    @property
    def unread(self) -> int:
        return len(self.pending) // 2

    def sync(self, progress: Progress, patience: int) -> tuple[int, bool]:
        """Reads the pending steps in order: a finite one adds its loss and resets
        ``progress.nonfinite_steps``, a non-finite one counts. Returns (steps that made no update,
        whether ``patience`` consecutive non-finite steps were reached)."""
        if not self.pending:
            return 0, False
        values = torch.stack(self.pending).tolist()
        self.pending.clear()
        skipped = 0
        for loss, skip in zip(values[::2], values[1::2]):
            if not skip:
                self.loss_sum, self.updates = self.loss_sum + loss, self.updates + 1
                progress.nonfinite_steps = 0
                continue
            skipped += 1
            progress.nonfinite_steps += 1
            if progress.nonfinite_steps >= patience:
                return skipped, True
        return skipped, False

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / self.updates if self.updates else math.nan


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def epoch_line(m: dict, epochs: int) -> str:
    return (f"epoch {m['epoch']}/{epochs} train_loss {m['train_loss']:.4f} val_loss {m['val_loss']:.4f} "
            f"val_ic {m['val_ic']:.4f} val_rank_ic {m['val_rank_ic']:.4f} {m['samples_per_s']:.0f} samples/s")
