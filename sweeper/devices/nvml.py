"""GPUs as NVML sees them: what one reading of the GPUs holds, and the reading itself.

Everything here reads NVML (``nvidia-ml-py``) and never touches ``torch.cuda``: the driver process must not
hold a CUDA context (it would pin memory on every GPU and make forked workers unusable). Without the NVIDIA
driver, :func:`read_nvml` finds none. Which reader a process uses, NVML's or the fakes of tests, is
:func:`sweeper.devices.fake.probe`'s choice."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict, TypeVar

_MIB = 1 << 20
T = TypeVar("T")


class GpuProcess(TypedDict):
    pid: int
    used_mb: int | None  # None where NVML cannot say (containers, no permission)


@dataclass
class GPU:
    index: int  # NVML index (PCI bus order)
    uuid: str  # "GPU-..."; what CUDA_VISIBLE_DEVICES gets
    name: str
    total_mb: int
    free_mb: int
    used_mb: int
    util: int | None  # percent; None where NVML can't say (MIG, some vGPUs)
    processes: list[GpuProcess] = field(default_factory=list)
    bf16: bool | None = None  # compute capability >= 8.0 (Ampere, Hopper, ...)
    capability: tuple[int, int] | None = None
    slot_env: dict[str, str] = field(default_factory=dict)  # what its worker slots add to their env


@dataclass
class NvmlProbe:
    """What one NVML session saw: the GPUs, the driver version, or why there are none."""

    gpus: list[GPU]
    driver: str | None = None
    error: str | None = None
    fake: bool = False  # the GPUs are the fakes of sweeper.devices.fake


def read_nvml() -> NvmlProbe:
    """Read every GPU in one NVML session. Never raises for a missing driver."""
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
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                gpus.append(_read_gpu(nvml, index))
            except getattr(nvml, "NVMLError_NoPermission", ()):  # another job's GPU (Slurm ConstrainDevices)
                pass
        return NvmlProbe(gpus, driver=driver)
    except nvml.NVMLError as exc:
        return NvmlProbe([], error=f"NVML failed while reading GPUs ({exc})")
    finally:
        _optional(nvml.nvmlShutdown, None, nvml)


def _read_gpu(nvml: Any, index: int) -> GPU:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    # v2 counts the driver's reserved memory apart from "used", so an idle GPU reads ~0 used
    try:
        mem = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
    except (AttributeError, TypeError, nvml.NVMLError):
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
    total, free, used = (int(v) // _MIB for v in (mem.total, mem.free, mem.used))
    capability = _optional(lambda: tuple(nvml.nvmlDeviceGetCudaComputeCapability(handle)), None, nvml)
    return GPU(index=index, uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
               name=_text(nvml.nvmlDeviceGetName(handle)), total_mb=total, free_mb=free, used_mb=used,
               util=_optional(lambda: int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu), None, nvml),
               processes=_optional(lambda: _processes(nvml, handle), [], nvml),
               bf16=None if capability is None else capability >= (8, 0), capability=capability)


def _processes(nvml: Any, handle: Any) -> list[GpuProcess]:
    # NVML reports "not available" (containers, no permission) as None or a huge sentinel
    return [{"pid": int(proc.pid), "used_mb": used // _MIB if isinstance(used, int) and 0 <= used < (1 << 60)
             else None} for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            for used in [getattr(proc, "usedGpuMemory", None)]]


def _optional(read: Callable[[], T], default: T, nvml: Any) -> T:
    """A field some GPUs don't support (utilisation under MIG, ...) reads as ``default``."""
    try:
        return read()
    except nvml.NVMLError:
        return default


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
