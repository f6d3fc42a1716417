"""The optimizer, the learning-rate schedule, and how an epoch is cut into batches."""
from __future__ import annotations

import math
from typing import Callable, Iterator

import torch
from torch import nn

from sweeper.data import Batch, Batcher


def make_optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW with weight decay on weight matrices only.

    The usual exemption: biases, norms and position tables are not shrunk towards
    zero. A position table is a matrix, so a model names such parameters in
    ``no_weight_decay()`` (timm's convention; a custom model may define it too).
    """
    exempt = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    decay, other = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 and name not in exempt else other).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr)


def lr_factor(schedule: str, warmup_frac: float, total_steps: int) -> Callable[[int], float]:
    """Multiplier of train.lr after ``step`` optimizer steps (LambdaLR's contract)."""
    total = max(1, total_steps)
    warmup = int(warmup_frac * total)
    if schedule == "onecycle":
        warmup = warmup or int(0.3 * total)  # torch's OneCycleLR pct_start when no warmup is set

    def factor(step: int) -> float:
        if step < warmup:
            if schedule == "onecycle":  # cosine ramp from lr/25, as OneCycleLR
                return 1 / 25 + (1 - 1 / 25) * 0.5 * (1 - math.cos(math.pi * step / warmup))
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        done = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1 + math.cos(math.pi * done))
    return factor


def count_steps(batcher: Batcher, order: str, batch_size: int, limit: int | None) -> int:
    """Optimizer steps per epoch (exact for random order, the expected count for cross sections)."""
    samples = batcher.n_samples if limit is None else min(limit, batcher.n_samples)
    if order == "random":
        return max(1, math.ceil(samples / batch_size))
    per_date = batcher.n_samples / max(1, batcher.n_dates)
    dates = max(1, min(batcher.n_dates, int(samples / per_date)))
    return max(1, math.ceil(dates / dates_per_batch(batcher, batch_size)))


def dates_per_batch(batcher: Batcher, batch_size: int) -> int:
    return max(1, round(batch_size * batcher.n_dates / max(1, batcher.n_samples)))


def epoch_batches(batcher: Batcher, order: str, batch_size: int, generator: torch.Generator,
                  limit: int | None) -> Iterator[Batch]:
    if order == "random":
        return batcher.random_batches(batch_size, generator, limit)
    return batcher.cross_section_batches(dates_per_batch(batcher, batch_size), generator, limit)
