"""Parent: whether the sweep stops, and why; the one home of that decision.

The driver tells :class:`StopRule` what happened (a trial ended, the budget is used up, a
worker cannot start) and asks it whether to go on. Its :meth:`StopRule.ending` is what
``sweeper run`` reports and what its exit code is made from
(:attr:`Outcome.exit_code`).
"""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial

from sweeper.config import StudyConfig
from sweeper.errors import FailReason
from sweeper.interrupt import StopToken
from sweeper.store.layout import logs_dir


class Ending(Enum):
    DONE = "done"  # the budget, study.timeout, or nothing left for this host: exit 0
    FAILED = "failed"  # trials keep failing, or workers cannot start: exit 1
    INTERRUPTED = "interrupted"  # Ctrl-C or SIGTERM: exit 128 + the signal


@dataclass
class TrialEnd:
    """A trial this driver ran has ended, whoever recorded it (its worker, or the driver)."""

    number: int
    state: str  # COMPLETE, PRUNED or FAIL
    value: float | None = None
    reason: str | None = None  # its fail_reason
    metrics: dict[str, Any] = field(default_factory=dict)
    reported: bool = False  # its worker's end event (else the driver saw it end: an exit, a kill)

    @property
    def failed(self) -> bool:
        return self.state == "FAIL"

    @property
    def counts_as_failure(self) -> bool | None:
        """For study.max_consecutive_failures: True counts, False resets the count, None (an
        interruption the driver saw) does neither. A config the model cannot take counts, though
        PRUNED. A reported FAIL counts whatever its reason (one another host failed first, too)."""
        if self.reason == FailReason.INTERRUPTED and not self.reported:
            return None
        return self.failed or self.reason == FailReason.CONFIG


class StopRule:
    """The sweep stops on a stop request, study.timeout, too many failures in a row,
    workers that die before they are ready, or a used-up budget."""

    def __init__(self, cfg: StudyConfig, stop: StopToken, run_dir: Path) -> None:
        self.cfg, self.stop, self.run_dir = cfg, stop, run_dir
        self.started = time.monotonic()
        self.failures_in_row = 0
        self.exhausted = False  # the last claim found the budget used up
        self.broken = False  # a worker exited before it was ready too often
        self.message = ""

    def trial_ended(self, end: TrialEnd) -> None:
        counts = end.counts_as_failure
        if counts is not None:
            self.failures_in_row = self.failures_in_row + 1 if counts else 0
        self.exhausted = False  # an end may free budget (a failure is retried): the next claim re-counts

    def budget_used(self, message: str | None) -> None:
        """The claim found nothing left to run; ``message`` once no trial of ours runs either."""
        self.exhausted = True
        if message:
            self.message = self.message or message

    def worker_broken(self, message: str) -> None:
        if not self.broken:
            self.broken, self.message = True, message

    @property
    def draining(self) -> bool:
        """The first Ctrl-C/SIGTERM: running trials stop at their next step."""
        return self.stop.count == 1

    @property
    def killing(self) -> bool:
        """The second: every worker is killed at once."""
        return self.stop.count >= 2

    @property
    def interrupted(self) -> bool:
        return self.stop.requested

    def stopping(self) -> bool:
        """Whether to start no more trials (those running finish, or drain on a signal)."""
        if self.stop.requested or self.broken:
            return True
        timeout = self.cfg.timeout
        if timeout is not None and time.monotonic() - self.started > timeout:
            self.message = self.message or f"study.timeout ({timeout:g} s) reached"
            return True
        if self._too_many_failures():
            self.message = (f"stopped: the last {self.failures_in_row} trials all failed "
                            f"(study.max_consecutive_failures); see {logs_dir(self.run_dir)}")
            return True
        return self.exhausted

    def ending(self) -> Ending:
        if self.stop.requested:
            return Ending.INTERRUPTED
        return Ending.FAILED if self.broken or self._too_many_failures() else Ending.DONE

    def _too_many_failures(self) -> bool:
        return self.failures_in_row >= self.cfg.max_consecutive_failures


@dataclass
class Outcome:
    """What ``sweeper run`` reports: the study's counts and best trial, how the sweep ended."""

    counts: dict[str, int]
    best: FrozenTrial | None
    ending: Ending
    signum: int = signal.SIGINT  # the signal that interrupted it
    message: str = ""

    @property
    def interrupted(self) -> bool:
        return self.ending is Ending.INTERRUPTED

    @property
    def exit_code(self) -> int:
        """0 done, 1 failed, 130 after Ctrl-C, 143 after SIGTERM."""
        if self.ending is Ending.INTERRUPTED:
            return 128 + self.signum
        return 1 if self.ending is Ending.FAILED else 0
