"""The trial's heartbeat, recorded from the worker while it trains.

Other drivers judge a RUNNING trial dead when its heartbeat is older than
``study.grace_period``; the beat therefore runs on its own thread, so a long
epoch or a slow write of results never looks like a dead host.
"""
from __future__ import annotations

import threading
from typing import Any


class Heartbeat:
    """Records the trial's heartbeat every ``interval`` seconds until stopped."""

    def __init__(self, storage: Any, trial_id: int, interval: float) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(storage, trial_id, interval), daemon=True)

    def _beat(self, storage: Any, trial_id: int, interval: float) -> None:
        # beat at once: the driver's first heartbeat was recorded at claim time,
        # and the grace period runs from there
        while True:
            try:
                storage.record_heartbeat(trial_id)
            except Exception:  # noqa: BLE001 - a missed beat is retried next interval
                pass
            if self._stop.wait(interval):
                return

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
