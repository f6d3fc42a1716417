"""One step of a stack (:mod:`sweeper.core.loop`): every member's batch in one stacked forward and
backward, one per-member update; and the probe that sizes the micro- and evaluation batch with it.

Nothing here reads a value back from the device: whether a step was non-finite stays a
device-side flag that the optimizer itself obeys, and the loop reads each member's loss and
flag later, many steps at a time (see ``loop.SYNC_EVERY``)."""


from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from sweeper.config import TrainConfig
from sweeper.core.batch_plan import AUTO_PROBE_START, EVAL_SPLITS, BatchPlan
from sweeper.core.batch_search import MemoryReader, attempt, find_micro_batch, release_memory
from sweeper.core.lanes import Lane
from sweeper.core.loss import Loss
from sweeper.core.optim import FlatStack, MemberScaler, StackedAdamW, on_device
from sweeper.core.precision import Precision
from sweeper.core.schedule import Rows
from sweeper.data import Batcher
from sweeper.data.batches import gather_stack
from sweeper.models.stacked.base import StackedModule, member_rows


class StackStep:
    """One stacked optimizer step over every member's batch (``None``: the member makes no update)."""

    def __init__(self, stack: StackedModule, forward: torch.nn.Module, flat: FlatStack,
                 optimizer: StackedAdamW, scaler: MemberScaler, precision: Precision, criterion: Loss,
                 lanes: list[Lane], dropout: list[torch.Generator]) -> None:
        self.stack, self.forward, self.flat = stack, forward, flat  # forward: the stack, or it compiled
        self.optimizer, self.scaler = optimizer, scaler
        self.precision, self.criterion, self.lanes, self.dropout = precision, criterion, lanes, dropout
        self.device = flat.values.device
        self.rows: list[int] | None = None  # each member's rows, told to the stack when uneven
        member_rows(stack, None)  # not an earlier step's

    @contextmanager
    def preserved(self) -> Iterator[None]:
        """Probing steps leave no trace: weights, buffers (batch statistics), moments, scales and each
        member's counters."""
        values, buffers = self.flat.values.clone(), [b.clone() for b in self.stack.buffers()]
        moments = {k: v.clone() for k, v in self.optimizer.state_dict().items()}
        scale, good = self.scaler.scale_.clone(), self.scaler.good.clone()
        rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        dropout_states = [g.get_state() for g in self.dropout]
        try:
            yield
        finally:
            with torch.no_grad():
                self.flat.values.copy_(values)
                for b, kept in zip(self.stack.buffers(), buffers):
                    b.copy_(kept)
            self.optimizer.load_state_dict(moments)
            self.scaler.scale_, self.scaler.good = scale, good
            for lane in self.lanes:
                lane.position = 0
                lane.new_epoch()
            self.flat.zero_grad()
            torch.set_rng_state(rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)
            for g, state in zip(self.dropout, dropout_states):
                g.set_state(state)
            release_memory()

    def until_it_fits(self, batch: list[Rows | None], micro: int, shrink: Callable[[int], int],
                      say: Callable[[str], None]) -> int:
        """The step, redone in micro-batches half the size after an OOM; returns the micro-batch."""
        while True:
            if attempt(self, batch, micro)[0]:
                return micro
            self.flat.zero_grad()
            release_memory()  # outside the except: the traceback no longer pins activations
            micro = shrink(micro)
            say(f"out of memory: micro-batch now {micro}")

    def __call__(self, batch: list[Rows | None], micro: int) -> None:
        active = on_device([float(rows is not None) for rows in batch], self.device)
        self.flat.zero_grad()
        total = self._accumulate(batch, micro)
        self.scaler.unscale_(self.flat)
        self.optimizer.set_factors([lane.factor(lane.position) for lane in self.lanes])
        _, skipped = self.optimizer.step(active)
        self.scaler.update(skipped * active)
        for index, (lane, rows) in enumerate(zip(self.lanes, batch)):
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
            present = [part[0] if part is not None else lane.batcher.index[:1]
                       for lane, part in zip(self.lanes, parts)]
            sizes = [len(part[0]) if part is not None else 0 for part in parts]
            if (rows := None if min(sizes) == max(sizes) else sizes) != self.rows:  # shorter ones' own rows
                member_rows(self.stack, rows)
                self.rows = rows
            got = gather_stack([lane.batcher for lane in self.lanes], present, max(sizes))
            weights = on_device([part[1] if part is not None else 0.0 for part in parts], self.device)
            with self.precision.autocast():
                pred = self.forward(got.x)
            losses = self.criterion.stacked(pred, got.y, got.t, sizes) * weights
            self.scaler.scale(losses).backward()
            total += losses.detach()
            del got, pred, losses  # the next micro-batch's gather must not find this one's still alive
        return total


def plan_stack(step: StackStep, tc: TrainConfig, cap: int, mem: MemoryReader | None,
               date_rows: int) -> BatchPlan:
    """The stack's batch plan: without a memory reader the batch is one micro-batch; with one,
    the micro-batch, then the evaluation batch (rows per member), are probed with real stacked
    steps and evaluations (every member's activations at once) against the free memory less
    ``train.memory_margin``, and the stack is left exactly as it was."""
    eval_rows = max(1, tc.resolved_eval_batch_size // len(step.lanes))  # the whole evaluation batch, shared
    if mem is None:
        return BatchPlan(cap, cap, eval_rows)
    auto = tc.batch_size == "auto"
    minimum, why = max(min(tc.min_micro_batch, cap), date_rows), ""
    if date_rows > min(tc.min_micro_batch, cap):
        cap = max(cap, date_rows)
        why = ("; the IC loss keeps each date's rows in one micro-batch and the largest date has "
               f"{date_rows} rows (train.loss: mse can split it)")
    with step.preserved():
        start = min(cap, AUTO_PROBE_START) if auto else cap
        found = find_micro_batch(_probe(step, tc.seed), mem, start=start, cap=cap, margin=tc.memory_margin,
                                 steps=tc.probe_steps, minimum=minimum, why_minimum=why)
        micro = found.micro_batch
        # AdamW's state, made by the first step, is alive (and counted) while the evaluation is probed
        # each member's largest evaluated split: what the loop and the final scoring run
        batchers = [max((Batcher(lane.panel, split, lane.batcher.device) for split in EVAL_SPLITS),
                        key=lambda b: b.n_samples) for lane in step.lanes]
        longest = max(b.n_samples for b in batchers)
        evals = find_micro_batch(_eval_probe(step, batchers), mem, start=min(eval_rows, longest),
                                 cap=min(eval_rows, longest), margin=tc.memory_margin,
                                 steps=1) if longest else None  # a refit's panels: nothing to evaluate
    eval_batch = evals.micro_batch if evals else eval_rows
    peak = mem.base_bytes + max(found.peak_bytes[micro], evals.peak_bytes[eval_batch] if evals else 0)
    note = (f"probed micro-batch {micro} (tried {found.tried}) and eval batch {eval_batch}: "
            f"peak {peak / 2**20:.0f} MiB, budget {found.budget_bytes / 2**20:.0f} MiB above "
            f"{mem.base_bytes / 2**20:.0f} MiB in use")
    return BatchPlan(micro if auto else cap, micro, eval_batch, peak / 2**20, note)


def _probe(step: StackStep, seed: int) -> Callable[[int], None]:
    """A real stacked step (gather, precision, backward, clipping, AdamW and its state) on ``size``
    random rows per member."""
    generator = torch.Generator().manual_seed(seed + 1)

    def probe(size: int) -> None:
        rows: list[Rows | None] = []
        for lane in step.lanes:
            order = torch.randint(lane.batcher.n_samples, (size,), generator=generator)
            rows.append(Rows(lane.batcher.index[order.to(lane.batcher.index.device)]))
        step(rows, size)
        step.flat.zero_grad()  # as the loop frees them to evaluate
    return probe


def _eval_probe(step: StackStep, batchers: list[Batcher]) -> Callable[[int], None]:
    """One stacked evaluation forward of ``size`` rows per member of ``batchers``, as evaluation runs it."""

    def probe(size: int) -> None:
        stack = step.stack
        was_training = stack.training
        stack.eval()
        try:
            with torch.no_grad():
                rows = [b.index[:size] if b.n_samples else lane.batcher.index[:1]
                        for b, lane in zip(batchers, step.lanes)]
                step.forward(gather_stack(batchers, rows, max(len(r) for r in rows)).x).float()
        finally:
            stack.train(was_training)
    return probe
