"""Worker warnings as the driver shows them: through the view, and never as a flood.

A store outage or a failing heartbeat makes every worker repeat the same line every
few seconds; the user needs to see it once, then how often it came back.
"""
from __future__ import annotations

import math
import time

from sweeper.devices import Slot
from sweeper.dispatch.view import View

WARN_REPEAT_S = 60.0  # an identical warning from one slot is shown at most this often


class Warnings:
    """The same line from the same slot at most once per ``WARN_REPEAT_S``, with a count of the
    repeats it held back."""

    def __init__(self, view: View) -> None:
        self.view = view
        self.shown: dict[tuple[str, str], tuple[float, int]] = {}

    def __call__(self, slot: Slot, text: str) -> None:
        key, now = (slot.label, text), time.monotonic()
        last, held = self.shown.get(key, (-math.inf, 0))
        if now - last < WARN_REPEAT_S:
            self.shown[key] = (last, held + 1)
            return
        self.shown[key] = (now, 0)
        self.view.warn(slot, f"{text} (and {held} more times)" if held else text)
