"""The GPUs this process sees, and what is reported of them: telemetry samples and the
study's environment. No CUDA context, ever (see :mod:`~sweeper.devices.nvml`)."""
from __future__ import annotations

import platform
import time
from typing import Any, TypedDict

from sweeper.devices.fake import gpu_reader
from sweeper.devices.nvml import GPU, NvmlProbe


class TelemetrySample(TypedDict):
    """One GPU at one moment: a row of the sweep's ``devices.csv``."""

    time: float
    index: int
    uuid: str
    util: int | None
    mem_used_mb: int
    mem_total_mb: int
    n_procs: int


def probe() -> NvmlProbe:
    """Read every GPU at once: through NVML, or the fakes of tests (:mod:`~sweeper.devices.fake`).
    Never raises for a missing driver."""
    return gpu_reader()()


def list_gpus() -> list[GPU]:
    """All GPUs this process sees; ``[]`` without a driver."""
    return probe().gpus


def telemetry() -> list[TelemetrySample]:
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


def environment_summary() -> dict[str, Any]:
    """Versions and GPUs, JSON-safe, for the study's user attributes.

    ``torch.version.cuda`` is the CUDA the wheel was built with; reading it creates no context.
    """
    import torch  # here: the driver's other uses of this module need no torch

    found = probe()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "driver": found.driver,
        "fake_gpus": found.fake,
        "gpus": [{"index": g.index, "name": g.name, "uuid": g.uuid, "total_mb": g.total_mb}
                 for g in found.gpus],
    }
