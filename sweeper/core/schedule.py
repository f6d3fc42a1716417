"""The optimizer, the learning-rate schedule, and how an epoch is cut into batches.

An epoch's batches are *rows* (the (t, i) sample pairs of the sample index), not gathered windows: the step
gathers each micro-batch itself, so that a smaller micro-batch after an out-of-memory error also makes a
smaller gather, and a failed gather can be redone. This is the one home of an epoch's order: a random
permutation of the samples, or whole dates in a random order (:func:`epoch_rows`)."""

import inspect
import math
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
from torch import nn

from sweeper.data import Batcher

FUSED_DEVICES = ("cpu", "cuda")  # where torch's fused AdamW kernel runs


class Rows(NamedTuple):
    """One batch's sample pairs [B, 2] (on the sample index's device), and, for a
    cross-sectional batch, the row count of each of its dates in order (known on the host)."""
    idx: torch.Tensor
    date_counts: list[int] | None = None


def adamw(decay: list[nn.Parameter], other: list[nn.Parameter], lr: float,
          weight_decay: float) -> torch.optim.Optimizer:
    """torch's AdamW with ``weight_decay`` on ``decay`` alone, fused where the kernel runs: one
    launch per step, which can skip a step on a device-side flag (no host sync per step)."""
    params = decay + other
    fused = bool(params) and all(p.is_floating_point() and p.device.type in FUSED_DEVICES for p in params)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}]
    return AdamW([g for g in groups if g["params"]], lr=lr, fused=fused or None)


class AdamW(torch.optim.AdamW):
    """torch's AdamW (the same class, kernels, state and ``state_dict``) without its guards
    against ``torch.compile`` tracing the optimizer.

    Why: each guard (``torch._disable_dynamo``, ``step``'s ``_use_grad_for_differentiable``) imports
    ``torch._dynamo`` at its first call, 1.8-2.6 s of CPU on a 2-core box, in every process that
    trains or in the fork server's preload. The guards act only while dynamo traces a frame, and
    sweeper never traces its optimizer (``train.compile`` compiles the model alone). Outside
    tracing each wrapper calls torch's method as it is, and ``step``'s sets grad mode to
    ``defaults["differentiable"]`` (False here), which is :func:`torch.no_grad`."""

    # torch's own methods: each wrapper (the guard; the profiling hook torch.optim puts on a class
    # whose optimizer was built) keeps what it wraps under __wrapped__ (functools.wraps)
    add_param_group = inspect.unwrap(torch.optim.Optimizer.add_param_group)
    zero_grad = inspect.unwrap(torch.optim.Optimizer.zero_grad)
    state_dict = inspect.unwrap(torch.optim.Optimizer.state_dict)
    load_state_dict = inspect.unwrap(torch.optim.Optimizer.load_state_dict)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        return _ADAM_STEP(self, closure)


_ADAM_STEP = inspect.unwrap(torch.optim.AdamW.step)


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
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))
    return factor


def count_steps(batcher: Batcher, order: str, batch_size: int, limit: int | None) -> int:
    """Optimizer steps per epoch (exact for random order, the expected count for cross sections)."""
    samples = batcher.n_samples if limit is None else min(limit, batcher.n_samples)
    if order == "random":
        return max(1, math.ceil(samples / batch_size))
    dates = max(1, min(batcher.n_dates, int(samples / (batcher.n_samples / max(1, batcher.n_dates)))))
    return max(1, math.ceil(dates / dates_per_batch(batcher, batch_size)))


def dates_per_batch(batcher: Batcher, batch_size: int) -> int:
    return max(1, round(batch_size * batcher.n_dates / max(1, batcher.n_samples)))


class DateRuns:
    """Where each date's samples sit in a split's sample index (sorted by date), on the host."""

    def __init__(self, batcher: Batcher) -> None:
        self.counts = torch.unique_consecutive(batcher.index[:, 0].cpu(), return_counts=True)[1]
        self.starts = torch.cumsum(self.counts, 0) - self.counts

    @property
    def largest(self) -> int:
        """Rows of the split's largest date (the smallest micro-batch an IC loss can use)."""
        return int(self.counts.max()) if len(self.counts) else 1


def epoch_rows(batcher: Batcher, order: str, batch_size: int, generator: torch.Generator,
               limit: int | None, runs: DateRuns | None = None) -> Iterator[Rows]:
    """The epoch's batches as rows: a random order of samples, or whole dates in a random order."""
    if order != "random":
        yield from _cross_section_rows(batcher, runs or DateRuns(batcher),
                                       dates_per_batch(batcher, batch_size), generator, limit)
        return
    cap = batcher.n_samples if limit is None else min(limit, batcher.n_samples)
    perm = torch.randperm(batcher.n_samples, generator=generator, device=generator.device)[:cap]
    perm = perm.to(batcher.index.device)  # once per epoch; each batch is then sliced where the index lives
    for start in range(0, cap, batch_size):
        yield Rows(batcher.index[perm[start:start + batch_size]])


def _cross_section_rows(batcher: Batcher, runs: DateRuns, per_batch: int, generator: torch.Generator,
                        limit: int | None) -> Iterator[Rows]:
    """All samples of ``per_batch`` dates per batch, assets ascending within a date; ``limit``
    stops before the date that would exceed it (at least one date is served). The rows are
    laid out on the host once per epoch, so no batch waits on the device."""
    perm = torch.randperm(len(runs.counts), generator=generator, device=generator.device).cpu()
    counts = runs.counts[perm]
    if limit is not None:
        perm = perm[: max(int((torch.cumsum(counts, 0) <= limit).sum()), 1)]
        counts = counts[: len(perm)]
    ends = torch.cumsum(counts, 0)
    total = int(ends[-1]) if len(ends) else 0
    rows = torch.repeat_interleave(runs.starts[perm] - (ends - counts), counts) + torch.arange(total)
    rows = rows.to(batcher.index.device)
    sizes, bounds = counts.tolist(), [0] + ends.tolist()
    for first in range(0, len(sizes), per_batch):
        last = min(first + per_batch, len(sizes))
        yield Rows(batcher.index[rows[bounds[first]:bounds[last]]], sizes[first:last])
