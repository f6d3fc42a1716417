"""Fit the micro-batch to free device memory (in the spirit of accelerate's
``find_executable_batch_size`` and Lightning's batch-size scaler).

Rules from their bug trackers shape this module: one OOM predicate; probe with the real step (precision,
optimizer state, evaluation); peaks counted from one base taken before probing, so what outlives an attempt
(AdamW's moments, made by the first step) is charged to every size; a cap and a margin; and recovery from an
OOM *outside* the ``except`` block, once the exception's frames (and the tensors they reference) are gone."""

import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from sweeper.errors import OutOfMemory

OOM_MESSAGES = ("out of memory", "CUDA error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED",
                "DefaultCPUAllocator: can't allocate memory")


def is_oom(exc: BaseException) -> bool:
    """True for an out-of-memory error from any allocator torch uses."""
    # cuBLAS/cuDNN and the CPU allocator raise plain RuntimeErrors
    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and any(m in str(exc) for m in OOM_MESSAGES))


def release_memory() -> None:
    """Drop unreachable tensors and hand cached CUDA blocks back."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def attempt(fn: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
    """``(True, fn(*args))``, or ``(False, None)`` when it ran out of memory; any other exception
    propagates. On return the exception is gone, so the caller can free what its frames pinned."""
    try:
        return True, fn(*args)
    except Exception as exc:
        if not is_oom(exc):
            raise
    return False, None


class MemoryReader(Protocol):
    base_bytes: int                       # allocated when the free memory was read; peaks count from it
    def free_bytes(self) -> int: ...      # read once, before probing
    def reset_peak(self) -> None: ...
    def peak_bytes(self) -> int: ...      # peak allocation since reset_peak, above base_bytes


def available_bytes(free: int, total: int, reserved: int, allocated: int, fraction: float,
                    limit: int | None) -> int:
    """What this process may still allocate: the driver's free bytes plus the blocks our caching
    allocator holds unused; capped by a per-process memory fraction, and by ``limit``, the
    allotment of a trial that shares its GPU (what is allocated already counts against it)."""
    available = free + reserved - allocated
    if fraction < 1.0:  # set_per_process_memory_fraction binds before the driver does
        available = min(available, int(fraction * total) - allocated)
    if limit is not None:
        available = min(available, limit - allocated)
    return int(max(available, 0))


class CudaMemory:
    """MemoryReader for one CUDA device: the free memory and the base allocation are read once, at
    the first ``free_bytes()``. ``cuda`` is ``torch.cuda``, or a stand-in in tests."""

    def __init__(self, device: torch.device, limit_mb: float | None = None, cuda: Any = torch.cuda) -> None:
        if device.index is None:  # some torch.cuda calls insist on an index
            device = torch.device("cuda", cuda.current_device())
        self.device, self.cuda = device, cuda
        self.limit_bytes = None if limit_mb is None else int(limit_mb * 2**20)
        self.base_bytes = 0
        self._free: int | None = None

    def free_bytes(self) -> int:
        if self._free is None:
            cuda, device = self.cuda, self.device
            free, total = cuda.mem_get_info(device)
            self.base_bytes = cuda.memory_allocated(device)
            self._free = available_bytes(free, total, cuda.memory_reserved(device), self.base_bytes,
                                         cuda.get_per_process_memory_fraction(device), self.limit_bytes)
        return self._free

    def reset_peak(self) -> None:
        self.cuda.synchronize(self.device)
        self.cuda.reset_peak_memory_stats(self.device)

    def peak_bytes(self) -> int:
        self.cuda.synchronize(self.device)
        return int(self.cuda.max_memory_allocated(self.device) - self.base_bytes)


@dataclass
class ProbeResult:
    micro_batch: int
    tried: list[int]
    fits: dict[int, bool] = field(default_factory=dict)
    peak_bytes: dict[int, int] = field(default_factory=dict)  # sizes that ran without OOM
    free_bytes: int = 0
    budget_bytes: int = 0


def _measure(try_step: Callable[[int], None], mem: MemoryReader, size: int, steps: int) -> int | None:
    """Peak bytes of ``steps`` steps at ``size``, or None on OOM."""
    mem.reset_peak()
    for _ in range(steps):
        if not attempt(try_step, size)[0]:
            release_memory()  # here, not in the except block: the traceback no longer pins tensors
            return None
    return mem.peak_bytes()


def find_micro_batch(try_step: Callable[[int], None], mem: MemoryReader, *, start: int, cap: int,
                     margin: float, steps: int, minimum: int = 1, why_minimum: str = "") -> ProbeResult:
    """Largest micro-batch <= cap whose ``steps`` real steps run without OOM and peak at most
    (1 - margin) x the free memory: doubles from ``start`` until a size fails (or reaches ``cap``),
    then bisects between the last fit and the first failure. Raises OutOfMemory when nothing down
    to ``minimum`` fits (``why_minimum`` says why the minimum is what it is)."""
    free = mem.free_bytes()
    result = ProbeResult(0, [], free_bytes=free, budget_bytes=int((1.0 - margin) * free))

    def fits(size: int) -> bool:
        peak = _measure(try_step, mem, size, steps)
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
        lo, hi = (mid, hi) if fits(mid := (lo + hi) // 2) else (lo, mid)
    if lo < minimum:
        raise OutOfMemory(f"no micro-batch of at least {minimum} rows fits in memory (tried {result.tried}; "
                          f"budget {result.budget_bytes / 2**20:.0f} MiB){why_minimum}")
    result.micro_batch = lo
    return result
