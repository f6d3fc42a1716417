"""GPUs as NVML sees them, and the worker slots a sweep runs on.

Everything here reads NVML (``nvidia-ml-py``) and never touches ``torch.cuda``: the
driver process must not hold a CUDA context (it would pin memory on every GPU and
make forked workers unusable). Without the NVIDIA driver, :func:`list_gpus` is empty
and the sweep falls back to CPU slots.

A :class:`Slot` is one concurrent trial. Its ``env`` is merged into the worker
process's environment: a GPU slot sees exactly one GPU, named by UUID because CUDA's
default device order can differ from NVML's; a CPU slot sees none. Thread counts
split the machine's cores between slots so concurrent trials don't oversubscribe.

Testing without GPUs: ``SWEEPER_FAKE_GPUS=N`` reports N fake 80 GB GPUs and
``SWEEPER_FAKE_BUSY=1,3`` marks those fake indices as used by another process.
Fake GPU slots get the same env as real ones plus ``SWEEPER_FAKE_GPU_SLOT=1``, which
tells the worker to train on the CPU.
"""
from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, TypeVar

from sweeper.config import DevicesConfig
from sweeper.errors import DeviceError

FAKE_GPUS_ENV = "SWEEPER_FAKE_GPUS"
FAKE_BUSY_ENV = "SWEEPER_FAKE_BUSY"
FAKE_SLOT_ENV = "SWEEPER_FAKE_GPU_SLOT"
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
class Slot:
    id: int
    kind: Literal["gpu", "cpu"]
    gpu: GPU | None
    env: dict[str, str]
    threads: int
    label: str


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
        gpus = [_read_gpu(nvml, i) for i in range(nvml.nvmlDeviceGetCount())]
        return NvmlProbe(gpus, driver=driver)
    except nvml.NVMLError as exc:
        return NvmlProbe([], error=f"NVML failed while reading GPUs ({exc})")
    finally:
        _optional(nvml.nvmlShutdown, None, nvml)


def list_gpus() -> list[GPU]:
    """All GPUs NVML reports (or the ``SWEEPER_FAKE_GPUS`` fakes); ``[]`` without a driver."""
    return probe().gpus


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
    return [_fake_gpu(k, k in busy) for k in range(count)]


def _fake_gpu(index: int, busy: bool) -> GPU:
    used = FAKE_BUSY_MB if busy else 0
    return GPU(
        index=index,
        uuid=f"GPU-00000000-0000-4000-8000-{index:012d}",
        name="Fake GPU",
        total_mb=FAKE_TOTAL_MB,
        free_mb=FAKE_TOTAL_MB - used,
        used_mb=used,
        util=100 if busy else 0,
        processes=[{"pid": FAKE_BUSY_PID, "used_mb": FAKE_BUSY_MB}] if busy else [],
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


# ------------------------------------------------------------------ slots


def plan_slots(cfg: DevicesConfig) -> list[Slot]:
    """The worker slots for ``cfg``: ``trials_per_gpu`` per chosen GPU, or CPU slots.

    ``gpus: auto`` takes every GPU found and falls back to CPU slots when there is none;
    ``gpus: none`` forces CPU slots; a list picks GPUs by NVML index or UUID.

    ``skip_busy`` leaves out GPUs that someone else is using: another process holds a
    compute context on it, or more than ``busy_memory_mb`` of its memory is in use
    (memory catches users NVML can't list, such as processes in other containers).
    The check is a snapshot at planning time; it doesn't reserve anything.
    """
    if cfg.gpus == "none":
        return cpu_slots(cfg.cpu_workers)
    found = probe()
    if cfg.gpus == "auto":
        if not found.gpus:
            return cpu_slots(cfg.cpu_workers)
        chosen = found.gpus
    else:
        chosen = _select(found, cfg.gpus)
    if cfg.skip_busy:
        chosen = _skip_busy(chosen, cfg.busy_memory_mb)
    return gpu_slots(chosen, cfg.trials_per_gpu)


def gpu_slots(gpus: list[GPU], trials_per_gpu: int) -> list[Slot]:
    threads = max(1, cpu_count() // max(1, len(gpus) * trials_per_gpu))
    slots = []
    for gpu in gpus:
        for k in range(trials_per_gpu):
            env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": gpu.uuid, **_thread_env(threads)}
            if "PYTORCH_CUDA_ALLOC_CONF" not in os.environ:  # a user's own setting is inherited instead
                env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"  # less fragmentation, fewer OOMs
            if gpu.fake:
                env[FAKE_SLOT_ENV] = "1"
            label = f"gpu{gpu.index}" + (f"#{k}" if trials_per_gpu > 1 else "")
            slots.append(Slot(id=len(slots), kind="gpu", gpu=gpu, env=env, threads=threads, label=label))
    return slots


def cpu_slots(workers: int | str) -> list[Slot]:
    """CPU slots. ``auto`` runs one single-threaded trial per core (at most 8).

    The small models of a sweep barely speed up with more intra-op threads, and on a
    busy machine OpenMP threads that share cores can make a step many times slower
    (measured: a small LSTM step went from 0.4 ms to 44 ms with 2 threads on a loaded
    2-core box), so trials in parallel beat threads within a trial. Cores beyond 8
    are shared out as threads, since every worker holds its own copy of the panel.
    An explicit count above the core count still gets 1 thread each.
    """
    cores = cpu_count()
    count = min(cores, 8) if workers == "auto" else int(workers)
    threads = max(1, cores // count)
    env = {"CUDA_VISIBLE_DEVICES": "", **_thread_env(threads)}
    return [Slot(id=k, kind="cpu", gpu=None, env=dict(env), threads=threads, label=f"cpu{k}") for k in range(count)]


def cpu_count() -> int:
    """Cores this process may run on (affinity / container limits), not the host's total."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _thread_env(threads: int) -> dict[str, str]:
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def _select(found: NvmlProbe, wanted: list[int | str]) -> list[GPU]:
    chosen: list[GPU] = []
    for item in wanted:
        gpu = _lookup(found.gpus, item)
        if gpu is None:
            raise DeviceError(f"devices.gpus: no GPU {_describe(item)}; {_available(found)}")
        if gpu not in chosen:  # the same GPU by index and by UUID is still one GPU
            chosen.append(gpu)
    return chosen


def _lookup(gpus: list[GPU], item: int | str) -> GPU | None:
    text = str(item).strip()
    if text.isdigit():
        return next((g for g in gpus if g.index == int(text)), None)
    key = text.lower() if text.lower().startswith("gpu-") else f"gpu-{text.lower()}"
    return next((g for g in gpus if g.uuid.lower() == key), None)


def _describe(item: int | str) -> str:
    return f"with index {item}" if str(item).strip().isdigit() else f"with UUID {item!r}"


def _available(found: NvmlProbe) -> str:
    if not found.gpus:
        why = f" ({found.error})" if found.error else ""
        return f"no GPU was found{why}; use devices.gpus: auto or none to run on the CPU"
    listing = ", ".join(f"{g.index}: {g.name} {g.uuid}" for g in found.gpus)
    return f"available: {listing}"


def _skip_busy(gpus: list[GPU], busy_memory_mb: int) -> list[GPU]:
    mine = os.getpid()
    free, busy = [], []
    for gpu in gpus:
        others = [p for p in gpu.processes if p["pid"] != mine]
        reason = f"{len(others)} process(es)" if others else (
            f"{gpu.used_mb} MB used" if gpu.used_mb > busy_memory_mb else None
        )
        (busy if reason else free).append((gpu, reason))
    if not free:
        detail = ", ".join(f"GPU {g.index} ({why})" for g, why in busy)
        raise DeviceError(
            f"devices.skip_busy: every requested GPU is busy: {detail}; wait for them to free up, "
            f"raise devices.busy_memory_mb (now {busy_memory_mb}), or set devices.skip_busy: false"
        )
    return [g for g, _ in free]


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
