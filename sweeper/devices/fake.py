"""Fake GPUs, for tests and drills on machines without any, and the one place that
chooses between them and the real ones: the GPUs a process sees (:func:`probe`) and
what a worker's trials train on (:func:`trial_device`).

- ``SWEEPER_FAKE_GPUS=N``: the GPUs this process sees are N fake 80 GB GPUs, not NVML's;
- ``SWEEPER_FAKE_BUSY=1,3``: those fake indices are used by another process;
- ``SWEEPER_FAKE_GPU_MEMORY_MB``: each fake GPU's size (packing tests);
- ``SWEEPER_FAKE_GPU_SLOT=1``: put in the env of a fake GPU's worker slots, so that the worker
  trains on the CPU;
- ``SWEEPER_FAKE_TRIAL_MEMORY_MB``: on such a slot, the peak memory every trial reports (its
  batch probe's, each epoch's); a trial allotted less runs out of memory at its start;
- ``SWEEPER_FAKE_CPU_BF16=0|1``: whether this CPU runs bf16 natively, so ``train.precision: auto``
  is measured on it (unset: torch's oneDNN says); the suite sets 0, so its numbers are fp32's on every box.

And the clocks a test shortens (seconds; unset, production's own value):

- ``SWEEPER_FAKE_TIMEOUT_GRACE_S``: the floor of the grace past ``train.max_minutes`` before
  the driver kills a trial (120 s), so a test drills the hard kill in seconds;
- ``SWEEPER_FAKE_TELEMETRY_INTERVAL_S``: how often the driver samples the GPUs (5 s);
- ``SWEEPER_FAKE_SQLITE_BUSY_TIMEOUT_S``: how long a SQLite call waits for the lock (60 s),
  so the outage tests see "database is locked" at once.

The environment is read at each call, never at import: tests set it after importing."""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from sweeper.devices.nvml import GPU, NvmlProbe, read_nvml
from sweeper.errors import DeviceError, OutOfMemory

if TYPE_CHECKING:
    from sweeper.core.device import TrialMemory

GPUS_ENV = "SWEEPER_FAKE_GPUS"
BUSY_ENV = "SWEEPER_FAKE_BUSY"
GPU_MEMORY_ENV = "SWEEPER_FAKE_GPU_MEMORY_MB"
SLOT_ENV = "SWEEPER_FAKE_GPU_SLOT"
TRIAL_MEMORY_ENV = "SWEEPER_FAKE_TRIAL_MEMORY_MB"
TIMEOUT_GRACE_ENV = "SWEEPER_FAKE_TIMEOUT_GRACE_S"
TELEMETRY_INTERVAL_ENV = "SWEEPER_FAKE_TELEMETRY_INTERVAL_S"
SQLITE_BUSY_TIMEOUT_ENV = "SWEEPER_FAKE_SQLITE_BUSY_TIMEOUT_S"
CPU_BF16_ENV = "SWEEPER_FAKE_CPU_BF16"
TOTAL_MB = 81920
BUSY_PID = 999_999  # "someone else": never a pid of ours in tests
BUSY_MB = 30_000
N = TypeVar("N", int, float)


def probe() -> NvmlProbe:
    """Read every GPU this process sees at once: the fakes while ``SWEEPER_FAKE_GPUS`` is set, else
    through NVML. Never raises for a missing driver."""
    return (read_fakes if os.environ.get(GPUS_ENV, "").strip() else read_nvml)()


def read_fakes() -> NvmlProbe:
    count = _env_number(GPUS_ENV, os.environ[GPUS_ENV])
    busy = {_env_number(BUSY_ENV, part) for part in os.environ.get(BUSY_ENV, "").split(",") if part.strip()}
    total = _env_or(GPU_MEMORY_ENV, TOTAL_MB)
    return NvmlProbe([_fake_gpu(k, k in busy, total) for k in range(count)], driver="fake", fake=True)


def _fake_gpu(index: int, busy: bool, total: int) -> GPU:
    # a fake GPU's memory is not used by the trials on it (they train on the CPU): packing
    # counts them by the peaks they report (SWEEPER_FAKE_TRIAL_MEMORY_MB)
    used = min(BUSY_MB, total) if busy else 0
    return GPU(index=index, uuid=f"GPU-00000000-0000-4000-8000-{index:012d}", name="Fake GPU",
               total_mb=total, free_mb=total - used, used_mb=used, util=100 if busy else 0,
               processes=[{"pid": BUSY_PID, "used_mb": used}] if busy else [], bf16=True,
               capability=(9, 0), slot_env={SLOT_ENV: "1"})


def _env_number(name: str, value: str, kind: type[N] = int) -> N:
    """``value`` of the variable ``name``: a whole number >= 0 (``kind`` float: seconds > 0)."""
    try:
        number = kind(value.strip())
    except ValueError:
        number = -1
    if not (number > 0 if kind is float else number >= 0):
        what = "seconds > 0" if kind is float else "a whole number >= 0"
        raise DeviceError(f"environment variable {name}: expected {what}, got {value!r}")
    return number


def _env_or(name: str, default: N, kind: type[N] = int) -> N:
    """The variable ``name`` as :func:`_env_number` reads it; unset, ``default`` (production's)."""
    return _env_number(name, raw, kind) if (raw := os.environ.get(name, "").strip()) else default


# ------------------------------------------------------------------ the clocks a test shortens
# (default) -> seconds: the floor of a trial's grace past train.max_minutes, the interval of the
# driver's GPU samples, how long a SQLite call waits for the lock
timeout_grace_floor_s = functools.partial(_env_or, TIMEOUT_GRACE_ENV, kind=float)
telemetry_interval_s = functools.partial(_env_or, TELEMETRY_INTERVAL_ENV, kind=float)
sqlite_busy_timeout_s = functools.partial(_env_or, SQLITE_BUSY_TIMEOUT_ENV, kind=float)


def cpu_bf16() -> bool | None:
    """``SWEEPER_FAKE_CPU_BF16`` as a bool; None: unset (the CPU itself is asked)."""
    return bool(_env_number(CPU_BF16_ENV, raw)) if (raw := os.environ.get(CPU_BF16_ENV, "").strip()) else None


# ------------------------------------------------------------------ a worker's trials
def trial_device() -> RealDevice | FakeSlot:
    """What this worker's trials train on (``train(device=torch_device, memory=memory(allotted_mb))``),
    asked once at its start: on a fake GPU's slot (``SWEEPER_FAKE_GPU_SLOT``) the CPU, with the fake
    trial memory; else CUDA where torch sees a GPU (the one its slot names), else the CPU."""
    if os.environ.get(SLOT_ENV):
        return FakeSlot()
    import torch  # a worker's: the processes that read GPUs through this module need no torch

    return RealDevice("cuda" if torch.cuda.is_available() else "cpu")


@dataclass(frozen=True)
class RealDevice:
    torch_device: str  # "cuda" or "cpu"

    def memory(self, limit_mb: float | None) -> TrialMemory:
        """What a trial allotted ``limit_mb`` of a shared GPU (None: all of it) is measured by."""
        import torch

        from sweeper.core.device import trial_memory

        return trial_memory(torch.device(self.torch_device), limit_mb)


@dataclass(frozen=True)
class FakeSlot:
    """A fake GPU's slot: its trials train on the CPU, and report ``SWEEPER_FAKE_TRIAL_MEMORY_MB``
    as their peak where it is set (read per trial, as a trial's failure if it is no number)."""

    torch_device: str = "cpu"

    def memory(self, limit_mb: float | None) -> TrialMemory:
        return (FakeTrialMemory(float(raw), limit_mb) if (raw := os.environ.get(TRIAL_MEMORY_ENV, "").strip())
                else RealDevice(self.torch_device).memory(limit_mb))


@dataclass(frozen=True)
class FakeTrialMemory:
    """A trial's memory on a fake GPU: ``needs_mb`` wherever a GPU trial reports a measured peak
    (before its first epoch, as a batch probe's; each epoch's), and out of memory at its start
    when that is more than it was allotted. Nothing is probed: it trains on the CPU."""

    needs_mb: float
    allotted_mb: float | None

    def reader(self) -> None:
        return None

    def start_peak_mb(self, probed_mb: float) -> float:
        if self.allotted_mb is not None and self.needs_mb > self.allotted_mb:
            raise OutOfMemory(f"fake GPU: the trial needs {self.needs_mb:g} MB and was allotted "
                              f"{self.allotted_mb:g} MB ({TRIAL_MEMORY_ENV})")
        return self.needs_mb

    def reset_peak(self) -> None:
        return None

    def peak_mb(self) -> float:
        return self.needs_mb
