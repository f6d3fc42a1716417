"""The device a trial trains on: which one, seeding, and the memory it is measured by."""

import random
import resource
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from sweeper.core.batch_search import CudaMemory, MemoryReader


def resolve_device(device: torch.device | str | None) -> torch.device:
    """None: the current CUDA device if there is one, else the CPU; "cuda" gets its index."""
    device = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    unnumbered = device.type == "cuda" and device.index is None
    return torch.device("cuda", torch.cuda.current_device()) if unnumbered else device


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA device too


class TrialMemory(Protocol):
    """The device memory a trial is measured by (the batch probe, the peak known before the first
    epoch, each epoch's peak): :func:`trial_memory` gives a device's own; a caller may hand another.
    The bodies here are the host's (:class:`HostMemory`)."""

    def reader(self) -> MemoryReader | None:
        """What the batch probe measures against; None: nothing is probed (micro-batch = batch)."""
        return None

    def start_peak_mb(self, probed_mb: float) -> float:
        """The peak reported before the first epoch (packing charges the trial by it), from what the
        probe measured (NaN: nothing probed). May raise OutOfMemory, as a probe does."""
        return probed_mb

    def reset_peak(self) -> None: return  # an epoch begins

    def peak_mb(self) -> float:
        """The peak since the epoch began."""


@dataclass(frozen=True)
class CudaTrialMemory(TrialMemory):
    """A CUDA device's memory, within ``limit_mb``, the trial's allotment of a GPU it shares
    (None: all that is free). Peaks are the caching allocator's allocated bytes."""

    device: torch.device
    limit_mb: float | None = None

    def reader(self) -> CudaMemory:
        return CudaMemory(self.device, self.limit_mb)

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak_mb(self) -> float:
        return torch.cuda.max_memory_allocated(self.device) / 2**20


class HostMemory(TrialMemory):
    """The CPU's: nothing is probed (the host's allocator tells no free memory or peak); a peak is
    the process's peak resident size, which cannot be reset."""

    def peak_mb(self) -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def trial_memory(device: torch.device, limit_mb: float | None = None) -> TrialMemory:
    """CUDA's memory within the trial's allotment ``limit_mb`` of a shared GPU; elsewhere the host's."""
    return CudaTrialMemory(device, limit_mb) if device.type == "cuda" else HostMemory()
