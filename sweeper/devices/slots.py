"""The worker slots a sweep runs on: one per concurrent trial.

A :class:`Slot`'s ``env`` is merged into the worker process's environment: a GPU slot sees exactly one GPU,
named by UUID because CUDA's default device order can differ from NVML's; a CPU slot sees none. Thread
counts split the machine's cores between slots so concurrent trials don't oversubscribe. A GPU may add to
its slots' env (``GPU.slot_env``: a fake GPU's train on the CPU). With ``trials_per_gpu: auto`` the driver
starts a GPU's workers as packing needs them (:mod:`sweeper.dispatch.packer`)."""

import os
from dataclasses import dataclass
from typing import Literal

from sweeper.config import DevicesConfig
from sweeper.devices.fake import probe
from sweeper.devices.nvml import GPU, NvmlProbe
from sweeper.errors import DeviceError

AUTO_MAX_TRIALS_PER_GPU = 8  # trials_per_gpu: auto without max_trials_per_gpu

@dataclass
class Slot:
    id: int
    kind: Literal["gpu", "cpu"]
    gpu: GPU | None
    env: dict[str, str]
    threads: int
    label: str


def plan_slots(cfg: DevicesConfig) -> list[Slot]:
    """The worker slots for ``cfg``: ``trials_per_gpu`` per chosen GPU, or CPU slots.

    ``gpus: auto`` takes every GPU found and falls back to CPU slots when there is none;
    ``gpus: none`` forces CPU slots; a list picks GPUs by NVML index or UUID.

    ``skip_busy`` leaves out GPUs that someone else is using: another process holds a compute context on it,
    or more than ``busy_memory_mb`` of its memory is in use (memory catches users NVML can't list, such as
    processes in other containers). The check is a snapshot at planning time; it doesn't reserve anything."""
    if cfg.gpus == "none":
        return cpu_slots(cfg.cpu_workers)
    found = probe()
    allowed = visible(found.gpus)
    chosen = allowed if cfg.gpus == "auto" else _select(found, cfg.gpus, allowed)
    if cfg.gpus == "auto" and not chosen:
        return cpu_slots(cfg.cpu_workers)
    chosen = _skip_busy(chosen, cfg.busy_memory_mb) if cfg.skip_busy else chosen
    return gpu_slots(chosen, slots_per_gpu(cfg))


def slots_per_gpu(cfg: DevicesConfig) -> int:
    """Worker slots per GPU: ``trials_per_gpu``; ``auto``: the most trials packing may run on one GPU."""
    auto = cfg.trials_per_gpu == "auto"
    return (cfg.max_trials_per_gpu or AUTO_MAX_TRIALS_PER_GPU) if auto else int(cfg.trials_per_gpu)


def gpu_slots(gpus: list[GPU], trials_per_gpu: int) -> list[Slot]:
    threads = max(1, cpu_count() // max(1, len(gpus) * trials_per_gpu))
    slots: list[Slot] = []
    for gpu in gpus:
        for k in range(trials_per_gpu):
            env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": gpu.uuid,
                   **_thread_env(threads), **gpu.slot_env}
            if "PYTORCH_CUDA_ALLOC_CONF" not in os.environ:  # a user's own setting is inherited instead
                env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"  # less fragmentation, fewer OOMs
            label = f"gpu{gpu.index}" + (f"#{k}" if trials_per_gpu > 1 else "")
            slots.append(Slot(id=len(slots), kind="gpu", gpu=gpu, env=env, threads=threads, label=label))
    return slots


def cpu_slots(workers: int | str) -> list[Slot]:
    """CPU slots. ``auto`` runs one single-threaded trial per core (at most 8).

    The small models of a sweep barely speed up with more intra-op threads, and on a busy machine OpenMP
    threads that share cores can make a step many times slower (measured: a small LSTM step went from 0.4 ms
    to 44 ms with 2 threads on a loaded 2-core box), so trials in parallel beat threads within a trial.
    Cores beyond 8 are shared out as threads, since every worker holds its own copy of the panel. An
    explicit count above the core count still gets 1 thread each."""
    cores = cpu_count()
    count = min(cores, 8) if workers == "auto" else int(workers)
    threads = max(1, cores // count)
    env = {"CUDA_VISIBLE_DEVICES": "", **_thread_env(threads)}
    return [Slot(id=k, kind="cpu", gpu=None, env=dict(env), threads=threads, label=f"cpu{k}")
            for k in range(count)]


def cpu_count() -> int:
    """Cores this process may run on (affinity / container limits), not the host's total."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _thread_env(threads: int) -> dict[str, str]:
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def visible(gpus: list[GPU]) -> list[GPU]:
    """The GPUs that the driver's own CUDA_VISIBLE_DEVICES leaves it (Slurm and other
    schedulers set it to the job's allocation), in its order; all of them when unset.

    NVML lists every GPU of the node whatever that variable says, so without this a job holding 4 of 8 GPUs
    would start workers on the other jobs' GPUs. As CUDA does, an integer is an index (NVML's PCI bus order,
    which matches CUDA's with CUDA_DEVICE_ORDER=PCI_BUS_ID, as schedulers assume), a ``GPU-...`` entry
    matches a UUID by prefix, and the list ends at the first entry that matches nothing (a first index or
    UUID that does is refused: a typo ran the sweep on CPU slots; ``""`` or ``-1`` hides them all)."""
    if (raw := os.environ.get("CUDA_VISIBLE_DEVICES")) is None:
        return gpus
    out: list[GPU] = []
    for item in (p.strip() for p in raw.split(",")):
        if item.isdigit():
            gpu = gpus[int(item)] if int(item) < len(gpus) else None
        else:
            prefix = item.lower()
            hits = [g for g in gpus if prefix.startswith("gpu-") and g.uuid.lower().startswith(prefix)]
            gpu = hits[0] if len(hits) == 1 else None
        if gpu is None and not out and gpus and (item.isdigit() or item.lower().startswith("gpu-")):
            raise DeviceError(f"CUDA_VISIBLE_DEVICES={raw} names none of the {len(gpus)} GPUs found (indices "
                              f"0-{len(gpus) - 1}, or UUIDs); fix or unset it, or use devices.gpus: none")
        if gpu is None or gpu in out:
            break
        out.append(gpu)
    return out


def _select(found: NvmlProbe, wanted: list[int | str], allowed: list[GPU]) -> list[GPU]:
    if not wanted:  # no slot: the sweep would wait for one for good
        raise DeviceError("devices.gpus: an empty list names no GPU; list GPUs, or use auto or none")
    chosen: list[GPU] = []
    for item in wanted:
        if (text := str(item).strip().lower()).isdigit():
            gpu = next((g for g in found.gpus if g.index == int(text)), None)
        else:  # a UUID, with or without its "GPU-" prefix
            key = text if text.startswith("gpu-") else f"gpu-{text}"
            gpu = next((g for g in found.gpus if g.uuid.lower() == key), None)
        if gpu is None:
            what = f"with index {item}" if text.isdigit() else f"with UUID {item!r}"
            why = f" ({found.error})" if found.error else ""
            listing = ", ".join(f"{g.index}: {g.name} {g.uuid}" for g in found.gpus)
            raise DeviceError(f"devices.gpus: no GPU {what}; " + (
                f"available: {listing}" if found.gpus
                else f"no GPU was found{why}; use devices.gpus: auto or none to run on the CPU"))
        if text.isdigit() and gpu not in allowed:  # another job's (a UUID names its GPU whatever the order)
            raise DeviceError(f"devices.gpus: GPU {gpu.index} is outside CUDA_VISIBLE_DEVICES="
                              f"{os.environ['CUDA_VISIBLE_DEVICES']} (GPUs "
                              f"{', '.join(str(g.index) for g in allowed) or 'none'} by NVML's index); name "
                              "one of those, or use devices.gpus: auto")
        if gpu not in chosen:  # the same GPU by index and by UUID is still one GPU
            chosen.append(gpu)
    return chosen


def _skip_busy(gpus: list[GPU], busy_memory_mb: int) -> list[GPU]:
    mine = os.getpid()
    reasons = [f"{len(others)} process(es)" if (others := [p for p in gpu.processes if p["pid"] != mine])
               else f"{gpu.used_mb} MB used" if gpu.used_mb > busy_memory_mb else None for gpu in gpus]
    if not (free := [gpu for gpu, reason in zip(gpus, reasons) if reason is None]):
        busy = ", ".join(f"GPU {gpu.index} ({reason})" for gpu, reason in zip(gpus, reasons))
        raise DeviceError(f"devices.skip_busy: every requested GPU is busy: {busy}; wait for "
                          f"them to free up, raise devices.busy_memory_mb (now {busy_memory_mb}), or set "
                          "devices.skip_busy: false")
    return free
