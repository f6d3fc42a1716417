"""GPUs as NVML sees them: what the driver plans slots from, what telemetry and
``sweeper doctor`` report.

Everything here reads NVML (``nvidia-ml-py``) and never touches ``torch.cuda``: the
driver process must not hold a CUDA context (it would pin memory on every GPU and
make forked workers unusable). Without the NVIDIA driver, :func:`list_gpus` is empty.

Testing without GPUs: ``SWEEPER_FAKE_GPUS=N`` reports N fake 80 GB GPUs,
``SWEEPER_FAKE_BUSY=1,3`` marks those fake indices as used by another process, and
``SWEEPER_FAKE_GPU_MEMORY_MB`` sets each fake GPU's size (packing tests).
"""
import os
import platform
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from sweeper.errors import DeviceError

FAKE_GPUS_ENV = "SWEEPER_FAKE_GPUS"
FAKE_BUSY_ENV = "SWEEPER_FAKE_BUSY"
FAKE_SLOT_ENV = "SWEEPER_FAKE_GPU_SLOT"
FAKE_MEMORY_ENV = "SWEEPER_FAKE_GPU_MEMORY_MB"
FAKE_TOTAL_MB = 81920
FAKE_BUSY_PID = 999_999  # "someone else": never a pid of ours in tests
FAKE_BUSY_MB = 30_000
_MIB = 1 << 20
T = TypeVar("T")


@dataclass
class GPU:
    index: int  # NVML index (PCI bus order)
    uuid: str  # "GPU-..."; what CUDA_VISIBLE_DEVICES gets
    name: str
    total_mb: int
    free_mb: int
    used_mb: int
    util: int | None  # percent; None where NVML can't say (MIG, some vGPUs)
    processes: list[dict] = field(default_factory=list)  # {"pid": int, "used_mb": int | None}
    bf16: bool | None = None  # compute capability >= 8.0 (Ampere, Hopper, ...)
    capability: tuple[int, int] | None = None
    fake: bool = False

@dataclass
class NvmlProbe:
    """What one NVML session saw: the GPUs, the driver version, or why there are none."""

    gpus: list[GPU]
    driver: str | None = None
    error: str | None = None
    fake: bool = False


# ------------------------------------------------------------------ reading GPUs


def probe() -> NvmlProbe:
    """Read every GPU in one NVML session (or the fakes). Never raises for a missing driver."""
    if os.environ.get(FAKE_GPUS_ENV, "").strip():
        return NvmlProbe(_fake_gpus(), driver="fake", fake=True)
    try:
        import pynvml as nvml
    except ImportError:
        return NvmlProbe([], error="nvidia-ml-py is not installed")
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return NvmlProbe([], error=f"NVML unavailable ({exc}): no NVIDIA driver?")
    try:
        driver = _optional(lambda: _text(nvml.nvmlSystemGetDriverVersion()), None, nvml)
        gpus = [g for g in (_read_gpu_or_none(nvml, i) for i in range(nvml.nvmlDeviceGetCount())) if g]
        return NvmlProbe(gpus, driver=driver)
    except nvml.NVMLError as exc:
        return NvmlProbe([], error=f"NVML failed while reading GPUs ({exc})")
    finally:
        _optional(nvml.nvmlShutdown, None, nvml)


def list_gpus() -> list[GPU]:
    """All GPUs NVML reports (or the ``SWEEPER_FAKE_GPUS`` fakes); ``[]`` without a driver."""
    return probe().gpus


def _read_gpu_or_none(nvml: Any, index: int) -> GPU | None:
    try:
        return _read_gpu(nvml, index)
    except getattr(nvml, "NVMLError_NoPermission", ()):  # another job's GPU (Slurm ConstrainDevices)
        return None


def _read_gpu(nvml: Any, index: int) -> GPU:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    total, free, used = _memory_mb(nvml, handle)
    capability = _optional(lambda: tuple(nvml.nvmlDeviceGetCudaComputeCapability(handle)), None, nvml)
    return GPU(
        index=index,
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        name=_text(nvml.nvmlDeviceGetName(handle)),
        total_mb=total,
        free_mb=free,
        used_mb=used,
        util=_optional(lambda: int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu), None, nvml),
        processes=_optional(lambda: _processes(nvml, handle), [], nvml),
        bf16=None if capability is None else capability >= (8, 0),
        capability=capability,
    )


def _memory_mb(nvml: Any, handle: Any) -> tuple[int, int, int]:
    # v2 counts the driver's reserved memory apart from "used", so an idle GPU reads ~0 used
    try:
        mem = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
    except (AttributeError, TypeError, nvml.NVMLError):
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
    return int(mem.total) // _MIB, int(mem.free) // _MIB, int(mem.used) // _MIB


def _processes(nvml: Any, handle: Any) -> list[dict]:
    out = []
    for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
        used = getattr(proc, "usedGpuMemory", None)
        # NVML reports "not available" (containers, no permission) as None or a huge sentinel
        known = isinstance(used, int) and 0 <= used < (1 << 60)
        out.append({"pid": int(proc.pid), "used_mb": used // _MIB if known else None})
    return out


def _optional(read: Callable[[], T], default: T, nvml: Any) -> T:
    """A field some GPUs don't support (utilisation under MIG, ...) reads as ``default``."""
    try:
        return read()
    except nvml.NVMLError:
        return default


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _fake_gpus() -> list[GPU]:
    count = _env_int(FAKE_GPUS_ENV, os.environ[FAKE_GPUS_ENV])
    raw_busy = [part for part in os.environ.get(FAKE_BUSY_ENV, "").split(",") if part.strip()]
    busy = {_env_int(FAKE_BUSY_ENV, part) for part in raw_busy}
    raw_total = os.environ.get(FAKE_MEMORY_ENV, "").strip()
    total = _env_int(FAKE_MEMORY_ENV, raw_total) if raw_total else FAKE_TOTAL_MB
    return [_fake_gpu(k, k in busy, total) for k in range(count)]


def _fake_gpu(index: int, busy: bool, total: int = FAKE_TOTAL_MB) -> GPU:
    # a fake GPU's memory is not used by the trials on it (they train on the CPU): packing
    # counts them by the peaks they report (SWEEPER_FAKE_TRIAL_MEMORY_MB)
    used = min(FAKE_BUSY_MB, total) if busy else 0
    return GPU(
        index=index,
        uuid=f"GPU-00000000-0000-4000-8000-{index:012d}",
        name="Fake GPU",
        total_mb=total,
        free_mb=total - used,
        used_mb=used,
        util=100 if busy else 0,
        processes=[{"pid": FAKE_BUSY_PID, "used_mb": used}] if busy else [],
        bf16=True,
        capability=(9, 0),
        fake=True,
    )


def _env_int(name: str, value: str) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        number = -1
    if number < 0:
        raise DeviceError(f"environment variable {name}: expected a whole number >= 0, got {value!r}")
    return number

# ------------------------------------------------------------------ reporting


def telemetry() -> list[dict]:
    """One sample per GPU, for the sweep's GPU timeline. Empty without GPUs."""
    now = time.time()
    return [
        {
            "time": now,
            "index": g.index,
            "uuid": g.uuid,
            "util": g.util,
            "mem_used_mb": g.used_mb,
            "mem_total_mb": g.total_mb,
            "n_procs": len(g.processes),
        }
        for g in list_gpus()
    ]


def environment_summary() -> dict:
    """Versions and GPUs, JSON-safe, for the study's user attributes.

    ``torch.version.cuda`` is the CUDA the wheel was built with; reading it creates no context.
    """
    import torch

    found = probe()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "driver": found.driver,
        "fake_gpus": found.fake,
        "gpus": [{"index": g.index, "name": g.name, "uuid": g.uuid, "total_mb": g.total_mb} for g in found.gpus],
    }
