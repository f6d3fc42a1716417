"""The GPUs this process sees, and what is reported of them: telemetry samples (and the sweep's thread that
takes them, :class:`Telemetry`) and the study's environment, read by :func:`~sweeper.devices.fake.probe`. No
CUDA context, ever (see :mod:`~sweeper.devices.nvml`)."""

import importlib.util
import platform
import sys
import threading
import time
from pathlib import Path
from typing import Any, TypedDict

from sweeper.atomic import append_csv
from sweeper.devices.fake import probe, telemetry_interval_s
from sweeper.devices.nvml import GPU
from sweeper.errors import one_line, say

INTERVAL_S = 5.0  # seconds between a sweep's GPU samples (a test shortens it through sweeper.devices.fake)


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

    ``torch.version.cuda`` is the CUDA the wheel was built with; reading it creates no context."""
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


class Telemetry:
    """The sweep's GPU timeline: a thread that samples each GPU every few seconds into devices.csv."""

    def __init__(self, path: Path, slots: list[Any], interval: float | None = None) -> None:
        self.path = path
        self.gpus = {s.gpu.uuid for s in slots if s.gpu is not None}  # the sweep's own, not all the node's
        self.interval = interval or telemetry_interval_s(INTERVAL_S)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="telemetry")
        self._told: set[str] = set()  # errors already reported: each distinct one once

    def start(self) -> None:
        if self.gpus:
            self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                if rows := [row for row in telemetry() if row["uuid"] in self.gpus]:
                    append_csv(self.path, rows)
            except Exception as exc:  # noqa: BLE001 - samples are a report's extra; the sweep goes on
                if (error := one_line(exc)) not in self._told:
                    self._told.add(error)
                    say(f"GPU telemetry failed ({error}); {self.path} misses samples while it does "
                        "(the sweep goes on)")
            if self._stop.wait(self.interval):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
