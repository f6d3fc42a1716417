"""One step of a stack (:mod:`sweeper.core.stack_loop`): every member's batch gathered into
one stacked batch, one forward and backward, one per-member update; and the batch probe that
sizes the stack's micro-batch with such steps. ``Lane`` is what the loop keeps per member.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from sweeper.config import SweeperConfig, TrainConfig
from sweeper.core.batch_plan import AUTO_PROBE_START
from sweeper.core.batch_search import MemoryReader, attempt, find_micro_batch, release_memory
from sweeper.core.loss import Loss
from sweeper.core.precision import Precision
from sweeper.core.progress import EpochSteps, Progress
from sweeper.core.schedule import DateRuns, Rows
from sweeper.core.stack_optim import FlatStack, MemberScaler, StackedAdamW
from sweeper.data import Batcher, Panel
from sweeper.data.batches import gather_stack
from sweeper.models.stacked.base import MemberDropout, StackedModule


@dataclass
class Lane:
    """A member's own state in the loop: everything a lone run's ``train`` keeps."""

    cfg: SweeperConfig
    panel: Panel
    batcher: Batcher
    valid: Batcher
    generator: torch.Generator
    runs: DateRuns | None
    steps_per_epoch: int
    factor: Callable[[int], float]
    solo: torch.nn.Module  # the one-member model that evaluates the member's weights
    progress: Progress = field(default_factory=Progress)
    position: int = 0  # schedule steps taken (LambdaLR's last_epoch)
    stopped: bool = False
    rows: Iterator[Rows] | None = None
    steps: EpochSteps = field(default_factory=EpochSteps)
    seen: int = 0


class StackStep:
    """One stacked optimizer step over every member's batch (``None``: the member makes no update)."""

    def __init__(
        self,
        stack: StackedModule,
        flat: FlatStack,
        optimizer: StackedAdamW,
        scaler: MemberScaler,
        precision: Precision,
        criterion: Loss,
        lanes: list[Lane],
    ) -> None:
        self.stack, self.flat, self.optimizer, self.scaler = stack, flat, optimizer, scaler
        self.precision, self.criterion, self.lanes = precision, criterion, lanes
        self.device = flat.values.device

    @contextmanager
    def preserved(self) -> Iterator[None]:
        """Probing steps leave no trace: weights, moments, scales and each member's counters."""
        opt = self.optimizer
        saved = [
            t.clone()
            for t in (
                self.flat.values,
                opt.exp_avg,
                opt.exp_avg_sq,
                opt.steps,
                self.scaler.scale_,
                self.scaler.good,
            )
        ]
        rng = torch.get_rng_state()
        dropout = next(
            (m.generators for m in self.stack.modules() if isinstance(m, MemberDropout) and m.generators), []
        )
        dropout_states = [g.get_state() for g in dropout]
        try:
            yield
        finally:
            with torch.no_grad():
                for t, old in zip((self.flat.values, opt.exp_avg, opt.exp_avg_sq, opt.steps), saved):
                    t.copy_(old)
            self.scaler.scale_, self.scaler.good = saved[4], saved[5]
            for lane in self.lanes:
                lane.position, lane.seen, lane.steps = 0, 0, EpochSteps()
            self.flat.zero_grad()
            torch.set_rng_state(rng)
            for g, state in zip(dropout, dropout_states):
                g.set_state(state)
            release_memory()

    def until_it_fits(
        self, batch: list[Rows | None], micro: int, shrink: Callable[[int], int], say: Callable[[str], None]
    ) -> int:
        """The step, redone in micro-batches half the size after an OOM; returns the micro-batch."""
        while True:
            ok, _ = attempt(self, batch, micro)
            if ok:
                return micro
            self.flat.zero_grad()
            release_memory()  # outside the except: the traceback no longer pins activations
            micro = shrink(micro)
            say(f"out of memory: micro-batch now {micro}")

    def __call__(self, batch: list[Rows | None], micro: int) -> None:
        lanes = self.lanes
        active = _on_device([float(rows is not None) for rows in batch], self.device)
        self.flat.zero_grad()
        total = self._accumulate(batch, micro)
        self.scaler.unscale_(self.flat)
        self.optimizer.factor = _on_device([lane.factor(lane.position) for lane in lanes], self.device)
        _, skipped = self.optimizer.step(active)
        self.scaler.update(skipped * active)
        for index, (lane, rows) in enumerate(zip(lanes, batch)):
            if rows is not None:
                lane.steps.add(total[index], skipped[index])
                lane.position += 1
                lane.seen += len(rows.idx)

    def _accumulate(self, batch: list[Rows | None], micro: int) -> torch.Tensor:
        """Forward and backward of every micro-batch; each member's (detached) batch loss [K]."""
        splits = [self.criterion.split(rows, micro) if rows is not None else [] for rows in batch]
        total = torch.zeros(len(batch), device=self.device)
        for j in range(max(len(parts) for parts in splits)):
            parts = [parts[j] if j < len(parts) else None for parts in splits]
            # a member without a part here runs its own first row at weight 0 (size 0: no loss of its own)
            present = [
                part[0] if part is not None else lane.batcher.index[:1]
                for lane, part in zip(self.lanes, parts)
            ]
            sizes = [len(part[0]) if part is not None else 0 for part in parts]
            got = gather_stack([lane.batcher for lane in self.lanes], present, max(sizes))
            weights = _on_device([part[1] if part is not None else 0.0 for part in parts], self.device)
            with self.precision.autocast():
                pred = self.stack(got.x)
            losses = self.criterion.stacked(pred, got.y, got.t, sizes) * weights
            self.scaler.scale(losses).backward()
            total += losses.detach()
            del got, pred, losses  # the next micro-batch's gather must not find this one's still alive
        return total


def plan_stack(
    step: StackStep,
    tc: TrainConfig,
    cap: int,
    mem: MemoryReader | None,
    date_rows: int,
    say: Callable[[str], None],
) -> tuple[int, int, float]:
    """(batch, micro-batch, the probe's peak MB) of the stack: without a memory reader the batch
    is one micro-batch; with one, the micro-batch is probed with real stacked steps (every
    member's activations at once) against the free memory less ``train.memory_margin``, as a
    lone run's is, and the stack is left exactly as it was."""
    if mem is None:
        return cap, cap, math.nan
    auto = tc.batch_size == "auto"
    minimum = max(min(tc.min_micro_batch, cap), date_rows)
    generator = torch.Generator().manual_seed(tc.seed + 1)

    def probe(size: int) -> None:
        step(
            [
                Rows(
                    lane.batcher.index[
                        torch.randint(lane.batcher.n_samples, (size,), generator=generator).to(
                            lane.batcher.index.device
                        )
                    ]
                )
                for lane in step.lanes
            ],
            size,
        )

    with step.preserved():
        found = find_micro_batch(
            probe,
            mem,
            start=min(cap, AUTO_PROBE_START) if auto else cap,
            cap=max(cap, minimum),
            margin=tc.memory_margin,
            steps=tc.probe_steps,
            minimum=minimum,
        )
    micro = found.micro_batch
    peak = (mem.base_bytes + found.peak_bytes[micro]) / 2**20
    say(f"probed the stack's micro-batch {micro} (tried {found.tried}): peak {peak:.0f} MiB")
    return (micro if auto else cap), micro, peak


def _on_device(values: list[float], device: torch.device) -> torch.Tensor:
    """A step's per-member host values [K] on the device without a host sync: a copy from pageable
    memory waits for the device's queue (every step would stall it), one from pinned memory does not."""
    host = torch.tensor(values, dtype=torch.float32)
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)
