"""Choosing the batch before training: the effective batch, the micro-batch and the
evaluation batch, probed on CUDA with real training steps and a real evaluation pass
that leave no trace; and halving the micro-batch after an OOM."""
from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from sweeper.config import SweeperConfig
from sweeper.core.batch_search import MemoryReader, find_micro_batch, release_memory
from sweeper.core.loss import Loss
from sweeper.core.precision import Precision
from sweeper.core.progress import cpu_copy
from sweeper.core.schedule import Rows
from sweeper.core.step import train_step
from sweeper.data import Batcher, Panel
from sweeper.errors import OutOfMemory

AUTO_PROBE_START = 512  # first size tried for batch_size: auto (then doubling)
EVAL_SPLITS = ("valid", "test")  # what the loop evaluates: per epoch, then at the end


@dataclass(frozen=True)
class BatchPlan:
    batch_size: int          # rows behind one optimizer step
    micro_batch: int         # rows per forward/backward
    eval_batch_size: int     # rows per evaluation forward
    peak_mem_mb: float = math.nan  # the probe's device peak (allocated) at these sizes; NaN: not probed
    note: str = ""           # what the probe did, for the log


def plan_batch(cfg: SweeperConfig, model: nn.Module, optimizer: torch.optim.Optimizer, precision: Precision,
               criterion: Loss, batcher: Batcher, panel: Panel, mem: MemoryReader | None,
               date_rows: int = 1) -> BatchPlan:
    """The batch plan. With ``mem`` the micro-batch, then the evaluation batch, are probed
    against its free memory less ``train.memory_margin``; without it, micro-batch = batch.
    ``date_rows`` > 1: the IC loss's micro-batches hold whole dates, so none can be smaller."""
    tc = cfg.train
    auto = tc.batch_size == "auto"
    cap = min(tc.max_batch_size if auto else int(tc.batch_size), max(1, batcher.n_samples))
    if mem is None:
        return BatchPlan(cap, cap, tc.eval_batch_size)
    minimum, why = min(tc.min_micro_batch, cap), ""
    if date_rows > minimum:
        minimum, cap = date_rows, max(cap, date_rows)
        why = ("; the IC loss keeps each date's rows in one micro-batch and the largest date has "
               f"{date_rows} rows (train.loss: mse can split it)")
    evaluator = max((Batcher(panel, split, batcher.device) for split in EVAL_SPLITS),
                    key=lambda b: b.n_samples)
    eval_cap = max(1, min(tc.eval_batch_size, evaluator.n_samples))
    step = probe_step(model, optimizer, precision, batcher, criterion, tc.seed, tc.grad_clip)
    with preserved(model, optimizer):
        train = find_micro_batch(step, mem, start=min(cap, AUTO_PROBE_START) if auto else cap, cap=cap,
                                 margin=tc.memory_margin, steps=tc.probe_steps, minimum=minimum,
                                 why_minimum=why)
        micro = train.micro_batch
        # AdamW's state, made by the first step, is alive (and counted) while the evaluation is probed
        evals = find_micro_batch(eval_step(model, evaluator), mem, start=eval_cap, cap=eval_cap,
                                 margin=tc.memory_margin, steps=1) if evaluator.n_samples else None
    eval_batch = evals.micro_batch if evals else tc.eval_batch_size
    peak = mem.base_bytes + max(train.peak_bytes[micro], evals.peak_bytes[eval_batch] if evals else 0)
    note = (f"probed micro-batch {micro} (tried {train.tried}) and eval batch {eval_batch}: "
            f"peak {peak / 2**20:.0f} MiB, budget {train.budget_bytes / 2**20:.0f} MiB above "
            f"{mem.base_bytes / 2**20:.0f} MiB in use")
    return BatchPlan(micro if auto else cap, micro, eval_batch, peak / 2**20, note)


def probe_step(model: nn.Module, optimizer: torch.optim.Optimizer, precision: Precision, batcher: Batcher,
               criterion: Loss, seed: int, grad_clip: float | None = 1.0) -> Callable[[int], None]:
    """A real training step (gather, precision, backward, clipping, AdamW update and its state) on
    ``size`` random rows; its gradients are freed afterwards, as the loop frees them to evaluate."""
    generator = torch.Generator().manual_seed(seed + 1)
    scaler = precision.scaler()  # its own: probing must not move the trial's loss scale
    params = list(model.parameters())

    def step(size: int) -> None:
        order = torch.randint(batcher.n_samples, (size,), generator=generator).to(batcher.index.device)
        train_step(model, params, optimizer, scaler, precision, batcher.gather, Rows(batcher.index[order]),
                   size, criterion, grad_clip)
        optimizer.zero_grad(set_to_none=True)
    return step


def eval_step(model: nn.Module, batcher: Batcher) -> Callable[[int], None]:
    """One evaluation forward (fp32, eval mode, no autograd) of ``size`` rows, as ``evaluate`` runs it."""
    def step(size: int) -> None:
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                model(batcher.gather(batcher.index[:size]).x).float()
        finally:
            model.train(was_training)
    return step


@contextmanager
def preserved(model: nn.Module, optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Restores weights, optimizer state and RNG after probing, so probing never changes training."""
    weights = cpu_copy(model.state_dict())
    opt_state = copy.deepcopy(optimizer.state_dict())
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        model.load_state_dict(weights)
        optimizer.load_state_dict(opt_state)
        optimizer.zero_grad(set_to_none=True)
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        release_memory()


def shrink_micro(micro: int, minimum: int, batch_size: int, date_rows: int = 1) -> int:
    """The micro-batch after an OOM: half, down to ``train.min_micro_batch``; with the IC loss
    (``date_rows`` > 1) no smaller than the largest date, which one micro-batch must hold whole."""
    smaller = micro // 2
    if smaller < min(minimum, batch_size):
        raise OutOfMemory(f"out of memory at micro-batch {micro}; halving it would go below "
                          f"train.min_micro_batch={minimum}")
    if smaller < date_rows:
        if micro > date_rows:
            return date_rows
        raise OutOfMemory(f"out of memory at micro-batch {micro}; it cannot shrink: the IC loss keeps each "
                          f"date's rows in one micro-batch and the largest date of the training split has "
                          f"{date_rows} rows (train.loss: mse can split a date; or fewer assets, or more "
                          "memory)")
    return smaller
