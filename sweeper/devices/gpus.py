"""The GPUs this process sees, and what is reported of them: telemetry samples and the
study's environment, read by :func:`~sweeper.devices.fake.probe`. No CUDA context, ever (see
:mod:`~sweeper.devices.nvml`)."""
from __future__ import annotations

import importlib.util
import platform
import sys
import time
from pathlib import Path
from typing import Any, TypedDict

from sweeper.devices.fake import probe
from sweeper.devices.nvml import GPU


class TelemetrySample(TypedDict):
    """One GPU at one moment: a row of the sweep's ``devices.csv``."""

    time: float
    index: int
    uuid: str
    util: int | None
    mem_used_mb: int
    mem_total_mb: int
    n_procs: int


def list_gpus() -> list[GPU]:
    """All GPUs this process sees; ``[]`` without a driver."""
    return probe().gpus


def telemetry() -> list[TelemetrySample]:
    """One sample per GPU, for the sweep's GPU timeline. Empty without GPUs."""
    now = time.time()
    return [{"time": now, "index": g.index, "uuid": g.uuid, "util": g.util, "mem_used_mb": g.used_mb,
             "mem_total_mb": g.total_mb, "n_procs": len(g.processes)} for g in list_gpus()]


def environment_summary() -> dict[str, Any]:
    """Versions and GPUs, JSON-safe, for the study's user attributes.

    ``torch.version.cuda`` is the CUDA the wheel was built with; reading it creates no context.
    """
    torch_version, torch_cuda = _torch_build()
    found = probe()
    return {"python": platform.python_version(), "torch": torch_version, "torch_cuda": torch_cuda,
            "driver": found.driver, "fake_gpus": found.fake,
            "gpus": [{"index": g.index, "name": g.name, "uuid": g.uuid, "total_mb": g.total_mb}
                     for g in found.gpus]}


def _torch_build() -> tuple[str | None, str | None]:
    """``torch.__version__`` and ``torch.version.cuda`` without importing torch (2-3 s the
    driver does not otherwise spend): ``torch/version.py`` is a file of plain assignments,
    written when the wheel was built, and is run here on its own."""
    if (loaded := sys.modules.get("torch")) is not None:
        return str(loaded.__version__), loaded.version.cuda
    if (spec := importlib.util.find_spec("torch")) is None or not spec.submodule_search_locations:
        return None, None
    path = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    names: dict[str, Any] = {}
    try:
        exec(compile(path.read_text(), str(path), "exec"), names)  # torch's own build stamp
    except Exception:  # noqa: BLE001 - an odd build stamp only leaves the versions out of the record
        return None, None
    return names.get("__version__"), names.get("cuda")
