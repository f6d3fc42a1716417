"""How many runs share a stack: measured on the device, not set.

Stacking K runs trains them as one model: on a GPU a small model's step is launch-bound and K
members cost little more than one, so stacking pays as far as memory allows; on a CPU the work
grows with K and the gain depends on the model and the CPU (an MLP gains, an LSTM loses to
torch's fused kernel run member by member). So the loop does not guess: :func:`measure` times
real training steps (the trial's own config and data, each member with its own seed) at each
candidate size, in interleaved rounds so that load from other processes hits every size alike,
and :func:`choose` takes the largest size that beats every smaller one by :data:`MARGIN` in
member-samples per second. A size whose batch probe finds no room (out of memory) is out.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from sweeper.core.device import TrialMemory
from sweeper.core.hooks import NullCheckpointer, NullHook
from sweeper.core.lanes import Member
from sweeper.core.loop import prepare
from sweeper.core.schedule import epoch_rows
from sweeper.errors import OutOfMemory

# a larger stack must train this much faster per member-sample than the best smaller one: the
# rates of two runs of the same size differ by a few percent on a quiet box, and a wrong choice
# near the tie costs little either way
MARGIN = 0.10
WARMUP_STEPS, TIMED_STEPS, ROUNDS = 2, 6, 2


@dataclass(frozen=True)
class StackChoice:
    """The stack size chosen, and the member-samples per second it was chosen on (by size; NaN:
    the size did not fit). ``source``: ``measured``, ``train.max_stack`` (a number pins it) or
    ``study`` (a choice stored with the study)."""

    size: int
    rates: dict[int, float] = field(default_factory=dict)
    source: str = "measured"

    def attrs(self) -> dict[str, Any]:
        """The trial's user attributes: ``stack_size``, ``stack_size_from`` and, when measured,
        ``stack_rates`` (member-samples/s by size)."""
        out: dict[str, Any] = {"stack_size": self.size, "stack_size_from": self.source}
        if self.rates:
            out["stack_rates"] = {str(k): round(v, 1) if math.isfinite(v) else None
                                  for k, v in self.rates.items()}
        return out


def candidate_sizes(runs: int) -> list[int]:
    """The sizes worth timing for a trial of ``runs`` runs: 1, the powers of two below, and ``runs``."""
    sizes, k = [1], 2
    while k < runs:
        sizes.append(k)
        k *= 2
    return sorted({*sizes, max(runs, 1)})


def choose(rates: dict[int, float], margin: float = MARGIN) -> int:
    """The largest size whose rate beats the best smaller size's by ``margin`` (1 if none does)."""
    best = 1
    for size in sorted(rates):
        if size > best and math.isfinite(rates[size]) and rates[size] >= rates.get(best, 0.0) * (1 + margin):
            best = size
    return best


def measure(members: Sequence[Member], device: torch.device, memory: TrialMemory,
            sizes: Sequence[int], say: Callable[[str], None] | None = None) -> StackChoice:
    """Time stacks of the first ``k`` of ``members`` for each ``k`` in ``sizes`` (their real steps:
    gather, forward, backward, update) and choose among them; nothing of it is kept."""
    rates: dict[int, float] = {}
    for _ in range(ROUNDS):
        for k in sizes:
            rate = _rate(members[:k], device, memory)
            # the best round (load only slows a size down); NaN: it never fitted
            rates[k] = max((r for r in (rates.get(k, math.nan), rate) if not math.isnan(r)), default=math.nan)
    choice = StackChoice(choose(rates), rates)
    if say is not None:
        shown = ", ".join(f"{k}: {r:.0f}" for k, r in sorted(rates.items()))
        say(f"stack size {choice.size}: member-samples/s by stack size {shown} (measured)")
    return choice


def _rate(members: Sequence[Member], device: torch.device, memory: TrialMemory) -> float:
    """Member-samples per second of a stack of ``members`` over TIMED_STEPS steps after a warm-up;
    NaN when its batch probe finds no room."""
    try:
        run = prepare(members, device, NullCheckpointer(), memory, None, lambda line: None, NullHook())
    except OutOfMemory:
        return math.nan
    tc = members[0].cfg.train
    batches = [epoch_rows(lane.batcher, tc.resolved_batch_order, run.plan.batch_size, lane.generator, None,
                          lane.runs) for lane in run.lanes]
    micro, seen, began = run.micro, 0, 0.0
    for index in range(WARMUP_STEPS + TIMED_STEPS):
        if index == WARMUP_STEPS:
            _wait(run.step.flat.values)
            began, seen = time.perf_counter(), 0
        batch = [next(rows, None) for rows in batches]
        if any(rows is None for rows in batch):  # an epoch shorter than the timing: start it again
            batches = [epoch_rows(lane.batcher, tc.resolved_batch_order, run.plan.batch_size, lane.generator,
                                  None, lane.runs) for lane in run.lanes]
            batch = [next(rows) for rows in batches]
        micro = run.step.until_it_fits(batch, micro, run.shrink, lambda line: None)
        seen += sum(len(rows.idx) for rows in batch if rows is not None)
    _wait(run.step.flat.values)
    return seen / max(time.perf_counter() - began, 1e-9)


def _wait(values: torch.Tensor) -> None:
    """Let the device finish what it was given (a read of one value)."""
    float(values[0, 0])
