"""The trial's heartbeat, recorded from the worker while it trains.

Other drivers judge a RUNNING trial dead when its heartbeat is older than ``study.grace_period``; the beat
therefore runs on its own thread, so a long epoch or a slow write of results never looks like a dead host.
(For the same reason it beats through a hung training step: the driver's stall watchdog, fed by progress
events, catches those.)"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sweeper.errors import StopRequested, one_line


class Heartbeat:
    """Records the trial's heartbeat every ``interval`` seconds until stopped.

    A failed beat is retried at the next interval; ``warn`` hears of the first failure of a run of them (and
    of each new kind of error), and of the recovery, so an outage is told once, not every few seconds."""

    def __init__(self, storage: Any, trial_id: int, interval: float,
                 warn: Callable[[str], None] = lambda text: None) -> None:
        self._stop, self._warn = threading.Event(), warn
        self._thread = threading.Thread(target=self._beat, args=(storage, trial_id, interval), daemon=True,
                                        name="heartbeat")

    def _beat(self, storage: Any, trial_id: int, interval: float) -> None:
        # beat at once: the driver recorded the first heartbeat at claim time; the grace runs from there
        failing: str | None = None
        misses = 0
        while True:
            try:
                storage.record_heartbeat(trial_id)
                if failing is not None:
                    self._warn(f"heartbeat recorded again after {misses} failed beat(s)")
                failing, misses = None, 0
            # a stopping worker's beat gives up at once while the store is away (StopRequested):
            # still retried, so that a long final scoring keeps its trial alive once the store is back
            except (Exception, StopRequested) as exc:  # noqa: BLE001 - a missed beat is retried next interval
                text = one_line(exc)
                misses += 1
                if text != failing:
                    self._warn(f"heartbeat failed ({text}); retrying every {interval:g} s")
                failing = text
            if self._stop.wait(interval):
                return

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
