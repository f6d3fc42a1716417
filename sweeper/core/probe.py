"""Choosing the batch before training: the effective batch and the micro-batch, probed on
CUDA with real training steps that leave no trace; and halving the micro-batch after an OOM."""
from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from torch import nn

from sweeper.config import SweeperConfig
from sweeper.core.batch_size import CudaMemory, find_micro_batch, release_memory
from sweeper.core.precision import Precision
from sweeper.core.progress import cpu_copy
from sweeper.core.step import accumulate
from sweeper.data import Batcher
from sweeper.errors import OutOfMemory

AUTO_PROBE_START = 512  # first size tried for batch_size: auto (then doubling)


def plan_batch(cfg: SweeperConfig, model: nn.Module, optimizer: torch.optim.Optimizer, precision: Precision,
               batcher: Batcher, device: torch.device) -> tuple[int, int]:
    """(effective batch, micro-batch). On CUDA the micro-batch is probed against free memory."""
    tc = cfg.train
    auto = tc.batch_size == "auto"
    cap = min(tc.max_batch_size if auto else int(tc.batch_size), max(1, batcher.n_samples))
    if device.type != "cuda":
        return cap, cap
    step = probe_step(model, optimizer, precision, batcher, tc.loss, tc.seed)
    with preserved(model, optimizer):
        probe = find_micro_batch(step, CudaMemory(device), start=min(cap, AUTO_PROBE_START) if auto else cap,
                                 cap=cap, margin=tc.memory_margin, steps=tc.probe_steps,
                                 minimum=min(tc.min_micro_batch, cap))
    micro = probe.micro_batch
    return (micro if auto else cap), micro


def probe_step(model: nn.Module, optimizer: torch.optim.Optimizer, precision: Precision, batcher: Batcher,
               loss_name: str, seed: int) -> Callable[[int], None]:
    """A real training step (precision, backward, optimizer state) on a real batch of ``size`` rows."""
    generator = torch.Generator().manual_seed(seed + 1)
    scaler = precision.scaler()

    def step(size: int) -> None:
        batch = next(batcher.random_batches(size, generator))
        optimizer.zero_grad(set_to_none=True)
        accumulate(model, batch, size, loss_name, precision, scaler)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
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


def shrink_micro(micro: int, minimum: int, batch_size: int) -> int:
    smaller = micro // 2
    if smaller < min(minimum, batch_size):
        raise OutOfMemory(f"out of memory at micro-batch {micro}; halving it would go below "
                          f"train.min_micro_batch={minimum}")
    return smaller
