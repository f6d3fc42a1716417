"""Fit the micro-batch to free device memory (in the spirit of accelerate's
``find_executable_batch_size`` and Lightning's batch-size scaler).

Two rules from their bug trackers shape this module: probe with the real step
(precision, optimizer state), and recover from an OOM *outside* the ``except``
block, so the exception's frames (and the tensors they reference) are gone
before memory is released.
"""
from __future__ import annotations

import gc
import math
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from sweeper.errors import OutOfMemory

OOM_MESSAGES = (
    "out of memory",
    "CUDA error: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "DefaultCPUAllocator: can't allocate memory",
)


def is_oom(exc: BaseException) -> bool:
    """True for an out-of-memory error from any allocator torch uses."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    # cuBLAS/cuDNN and the CPU allocator raise plain RuntimeErrors
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in OOM_MESSAGES)


def release_memory() -> None:
    """Drop unreachable tensors and hand cached CUDA blocks back."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


class MemoryReader(Protocol):
    def free_bytes(self) -> int: ...
    def reset_peak(self) -> None: ...
    def peak_bytes(self) -> int: ...


class CudaMemory:
    """MemoryReader for one CUDA device; peaks are measured above the allocation at reset."""

    def __init__(self, device: torch.device) -> None:
        if device.index is None:  # some torch.cuda calls insist on an index
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self._base = 0

    def free_bytes(self) -> int:
        free, total = torch.cuda.mem_get_info(self.device)
        allocated = torch.cuda.memory_allocated(self.device)
        # blocks cached by our own allocator are free for us, though not for the driver
        available = free + torch.cuda.memory_reserved(self.device) - allocated
        fraction = torch.cuda.get_per_process_memory_fraction(self.device)
        if fraction < 1.0:  # a cap set with set_per_process_memory_fraction binds before the driver does
            available = min(available, int(fraction * total) - allocated)
        return int(max(available, 0))

    def reset_peak(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self._base = torch.cuda.memory_allocated(self.device)

    def peak_bytes(self) -> int:
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.max_memory_allocated(self.device) - self._base)


@dataclass
class ProbeResult:
    micro_batch: int
    tried: list[int]
    fits: dict[int, bool] = field(default_factory=dict)
    peak_bytes: dict[int, int] = field(default_factory=dict)  # sizes that ran without OOM
    free_bytes: int = 0
    budget_bytes: int = 0


def _attempt(try_step: Callable[[int], None], mem: MemoryReader, size: int, steps: int) -> int | None:
    """Peak bytes of ``steps`` steps at ``size``, or None on OOM."""
    mem.reset_peak()
    oom = False
    try:
        for _ in range(steps):
            try_step(size)
    except Exception as exc:
        if not is_oom(exc):
            raise
        oom = True
    if oom:  # here, not in the except block: the traceback no longer pins tensors
        release_memory()
        return None
    return mem.peak_bytes()


def find_micro_batch(try_step: Callable[[int], None], mem: MemoryReader, *, start: int, cap: int,
                     margin: float, steps: int, minimum: int = 1) -> ProbeResult:
    """Largest micro-batch <= cap whose ``steps`` real steps run without OOM and peak
    at most (1 - margin) x the free memory measured before probing.

    Doubles from ``start`` until a size fails (or reaches ``cap``), then bisects
    between the last fit and the first failure. Raises OutOfMemory when nothing
    down to ``minimum`` fits.
    """
    free = mem.free_bytes()
    result = ProbeResult(0, [], free_bytes=free, budget_bytes=int((1.0 - margin) * free))

    def fits(size: int) -> bool:
        peak = _attempt(try_step, mem, size, steps)
        ok = peak is not None and peak <= result.budget_bytes
        result.tried.append(size)
        result.fits[size] = ok
        if peak is not None:
            result.peak_bytes[size] = peak
        return ok

    lo, hi = minimum - 1, None  # largest known fit (virtual below minimum), smallest known failure
    size = max(minimum, min(start, cap))
    while hi is None:
        if not fits(size):
            hi = size
        elif size >= cap:
            lo = size
            break
        else:
            lo, size = size, min(2 * size, cap)
    while hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    if lo < minimum:
        raise OutOfMemory(f"no micro-batch of at least {minimum} rows fits in memory "
                          f"(tried {result.tried}; budget {result.budget_bytes / 2**20:.0f} MiB)")
    result.micro_batch = lo
    return result


def accumulation_steps(batch: int, micro: int) -> int:
    return math.ceil(batch / micro)
