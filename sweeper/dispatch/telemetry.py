"""GPU telemetry during a sweep."""
from __future__ import annotations

import csv
import threading
from pathlib import Path
from typing import Any

from sweeper.devices import fake, telemetry
from sweeper.errors import one_line, say

INTERVAL_S = 5.0  # seconds between samples (a test shortens it through sweeper.devices.fake)


class Telemetry:
    """Samples each GPU through NVML every few seconds into devices.csv (no CUDA context)."""

    def __init__(self, path: Path, slots: list[Any], interval: float | None = None) -> None:
        self.path = path
        self.enabled = any(s.kind == "gpu" for s in slots)
        self.interval = interval or fake.telemetry_interval_s(INTERVAL_S)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="telemetry")
        self._told: set[str] = set()  # errors already reported: each distinct one once

    def start(self) -> None:
        if self.enabled:
            self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                self._sample()
            except Exception as exc:  # noqa: BLE001 - samples are a report's extra; the sweep goes on
                if (error := one_line(exc)) not in self._told:
                    self._told.add(error)
                    say(f"GPU telemetry failed ({error}); {self.path} misses samples while it does "
                        "(the sweep goes on)")
            if self._stop.wait(self.interval):
                return

    def _sample(self) -> None:
        if rows := telemetry():
            new = not self.path.exists()
            with self.path.open("a", newline="") as fh:
                writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
                if new:
                    writer.writeheader()
                writer.writerows(rows)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
