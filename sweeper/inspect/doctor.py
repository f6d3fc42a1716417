"""``sweeper doctor``: what this machine offers a sweep, as (check, value) rows and one verdict.

GPUs are read through NVML first; ``torch.cuda.is_available()`` is asked last, because
it loads the CUDA driver, and by then everything NVML knows is already in the rows.
The verdict on a machine without GPUs (or without the NVIDIA driver) is exactly
``NO_GPU_VERDICT`` with exit code 0: CPU slots are a supported way to run."""

import platform
import sqlite3
import sys
from importlib import metadata
from typing import NamedTuple

from sweeper import __version__
from sweeper.devices import NvmlProbe, probe
from sweeper.devices.fake import GPUS_ENV

NO_GPU_VERDICT = "no GPU: CPU slots will be used"


class DoctorReport(NamedTuple):
    rows: list[tuple[str, str]]
    verdict: str
    exit_code: int


def doctor() -> DoctorReport:
    """Check the environment. Exit code 0 when a sweep can run as configured by default, else 1."""
    import torch

    found = probe()
    driver = (f"fake GPUs ({GPUS_ENV}={len(found.gpus)})" if found.fake
              else found.driver or f"not found: {found.error or 'NVML reported nothing'}")
    rows = [("python", f"{platform.python_version()} ({sys.executable})"), ("sweeper", __version__),
            ("torch", torch.__version__), ("torch CUDA build", torch.version.cuda or "none (CPU-only build)"),
            ("NVIDIA driver", driver)]
    for gpu in found.gpus:
        tag = f"GPU {gpu.index}"
        procs = ", ".join(f"pid {p['pid']}" + (f" ({p['used_mb']} MB)" if p.get("used_mb") is not None
                                                else "") for p in gpu.processes)
        cc = f" (compute capability {gpu.capability[0]}.{gpu.capability[1]})" if gpu.capability else ""
        bf16 = "unknown" if gpu.bf16 is None else ("yes" if gpu.bf16 else "no, fp16 autocast only") + cc
        rows += [(tag, f"{gpu.name} {gpu.uuid}"),
                 (f"{tag} memory", f"{gpu.free_mb} MB free of {gpu.total_mb} MB ({gpu.used_mb} MB used)"),
                 (f"{tag} utilisation", "n/a" if gpu.util is None else f"{gpu.util}%"),
                 (f"{tag} processes", procs or "none"), (f"{tag} bf16", bf16)]
    rows += [("optuna", _package_version("optuna")), ("SQLite", sqlite3.sqlite_version),
             ("optuna-dashboard", _package_version("optuna-dashboard"))]
    available = bool(torch.cuda.is_available())
    rows.append(("torch.cuda.is_available()", str(available)))
    return DoctorReport(rows, *_verdict(found, torch.version.cuda, available))


def _verdict(found: NvmlProbe, torch_cuda: str | None, available: bool) -> tuple[str, int]:
    if (n := len(found.gpus)) == 0:
        return NO_GPU_VERDICT, 0
    gpus = f"{n} GPU{'s' if n > 1 else ''}"
    if found.fake:
        return f"{gpus} faked by {GPUS_ENV}: GPU slots will train on the CPU", 0
    if torch_cuda is None:
        return f"{gpus} found but this torch is a CPU-only build: install a CUDA build of torch", 1
    if not available:
        return (f"{gpus} found but torch.cuda.is_available() is False: the driver "
                f"({found.driver or 'unknown'}) may be too old for torch's CUDA {torch_cuda}", 1)
    busy = [str(g.index) for g in found.gpus if g.processes]
    note = f" ({len(busy)} in use by other processes: GPU {', '.join(busy)})" if busy else ""
    return f"ok: {gpus} ready for GPU slots{note}", 0


def _package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"
