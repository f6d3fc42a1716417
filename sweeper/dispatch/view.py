"""Parent: what the driver shows while it runs goes through a :class:`View`. The views
themselves (a rich live panel, plain log lines, nothing) live in :mod:`sweeper.dispatch.live`;
each is fed by these calls alone and never polls the study. Every call does nothing here, so a
view overrides only what it shows (``NullView`` is this protocol as it is).

Worker warnings reach it through :class:`Warnings`, never as a flood: a store outage or a failing
heartbeat makes every worker repeat the same line every few seconds; the user needs to see it
once, then how often it came back."""

import math
import time
from typing import Any, Protocol

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeper.config import SweeperConfig
from sweeper.devices import Slot
from sweeper.dispatch.plan import Plan
from sweeper.dispatch.stopping import SweepResult

WARN_REPEAT_S = 60.0  # an identical warning from one slot is shown at most this often


class View(Protocol):
    def start(self, cfg: SweeperConfig, plan: Plan, study: optuna.Study) -> None: return
    def trial_started(self, slot: Slot, number: int, params: dict[str, Any]) -> None: return
    def population(self, slot: Slot, numbers: list[int]) -> None: return  # the trials just started, one stack
    def epoch(self, slot: Slot, number: int, epoch: int, metrics: dict[str, Any]) -> None: return
    def trial_ended(self, slot: Slot, number: int, state: TrialState, value: float | None,
                    reason: str | None) -> None: return
    def progress(self, finished: int, best: FrozenTrial | None) -> None: return  # as the last claim read it
    def warn(self, slot: Slot, text: str) -> None: return  # a worker's problem that did not end its trial
    def tick(self) -> None: return  # once per loop turn: redraw, if it is time
    def end(self) -> None: return  # the loop is over, however it ended: let the terminal go
    def close(self, result: SweepResult, cfg: SweeperConfig, plan: Plan) -> None: return


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
