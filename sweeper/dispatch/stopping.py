"""Parent: whether the sweep stops, and why; the one home of that decision. The driver tells
:class:`StopRule` what happened and asks it whether to go on; :meth:`StopRule.ending` is what
``sweeper run`` reports and its exit code is made from (:attr:`SweepResult.exit_code`)."""

import math
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from sweeper.config import StudyConfig
from sweeper.errors import FailReason
from sweeper.interrupt import StopToken
from sweeper.store.layout import logs_dir
from sweeper.store.studies import FINISHED
from sweeper.study.convergence import Watch, min_trials


class Ending(Enum):
    # the budget, study.timeout, study.patience_trials, study.stop_when_converged, or nothing
    # left for this host: exit 0
    DONE = "done"
    FAILED = "failed"  # trials keep failing, workers cannot start, or the disk is full: exit 1
    INTERRUPTED = "interrupted"  # Ctrl-C or SIGTERM: exit 128 + the signal


@dataclass
class TrialEnd:
    """A trial this driver ran has ended, whoever recorded it (its worker, or the driver)."""

    number: int
    state: TrialState  # COMPLETE, PRUNED or FAIL
    value: float | None = None
    reason: str | None = None  # its fail_reason
    metrics: dict[str, Any] = field(default_factory=dict)
    reported: bool = False  # its worker's end event (else the driver saw it end: an exit, a kill)

    @property
    def failed(self) -> bool:
        return self.state == TrialState.FAIL

    @property
    def counts_as_failure(self) -> bool | None:
        """For study.max_consecutive_failures: True counts, False resets the count, None (an
        interruption the driver saw) does neither. A config the model cannot take counts, though
        PRUNED; a reported FAIL counts whatever its reason."""
        if self.reason == FailReason.INTERRUPTED and not self.reported:
            return None
        return self.failed or self.reason == FailReason.CONFIG


@dataclass(frozen=True)
class Patience:
    """study.patience_trials' count: finished trials since the last new best, and that best."""

    count: int
    best: FrozenTrial | None


def patience(trials: Iterable[FrozenTrial], maximize: bool, min_improvement: float) -> Patience:
    """Over the finished trials in the order they finished, a COMPLETE trial whose value beats the
    best so far by more than ``min_improvement`` is a new best and resets the count; every other
    adds one. From stored trials, so every driver of the study counts the same."""
    finished = sorted((t for t in trials if t.state in FINISHED and t.datetime_complete is not None),
                      key=lambda t: (t.datetime_complete, t.number))
    best: FrozenTrial | None = None
    best_value, count = math.nan, 0
    for t in finished:
        value = t.value if t.state == TrialState.COMPLETE else None
        if value is not None and math.isfinite(value) and (best is None or (
                value > best_value + min_improvement if maximize else value < best_value - min_improvement)):
            best, best_value, count = t, value, 0
        else:
            count += 1
    return Patience(count, best)


class StopRule:
    """The sweep stops on a stop request, study.timeout, too many failures in a row, workers that
    die before they are ready, a full disk, study.patience_trials, study.stop_when_converged, or a
    used-up budget. What the driver tells it records the reason found first in :attr:`message`;
    :meth:`stopping` and :meth:`ending` only answer."""

    def __init__(self, cfg: StudyConfig, stop: StopToken, run_dir: Path) -> None:
        self.cfg, self.stop, self.run_dir = cfg, stop, run_dir
        self.started, self.failures_in_row = time.monotonic(), 0
        self.exhausted = False  # the last claim found the budget used up
        self.broken = False  # a worker exited before it was ready too often
        self.disk_full = False  # a trial failed as disk: start no more (each would fail the same way)
        self.patient_out = False  # study.patience_trials finished trials without a new best
        self.converged = False  # study.stop_when_converged: Optuna's Terminator says stop
        self.timed_out = False  # study.timeout passed (judged by clock(), once per loop turn)
        maximize = cfg.resolved_direction == "maximize"
        self.watch = Watch(maximize, min_trials(cfg.sampler.options)) if cfg.stop_when_converged else None
        self.message = ""  # why the sweep stopped, in the words of the reason recorded first

    def trial_ended(self, end: TrialEnd) -> None:
        if (counts := end.counts_as_failure) is not None:
            self.failures_in_row = self.failures_in_row + 1 if counts else 0
        self.exhausted = False  # an end may free budget (a failure is retried): the next claim re-counts
        if end.reason == FailReason.DISK and not self.disk_full:
            self.disk_full = True
            lines = str(end.metrics.get("error") or "").strip().splitlines()
            error = lines[0] if lines else f"a write under {self.run_dir} found no space"
            self.message = (f"stopped: trial {end.number} failed as disk: {error}; free space under "
                            f"{self.run_dir} and run `sweeper run` again to resume")
        elif counts and self._too_many_failures() and not (self._halted() or self.timed_out):
            # the count in the message is the latest: trials that were running fail after it
            self.message = (f"stopped: the last {self.failures_in_row} trials all failed "
                            f"(study.max_consecutive_failures); see {logs_dir(self.run_dir)}")

    def seen(self, trials: list[FrozenTrial]) -> None:
        """The trials a claim read under the lock: study.patience_trials and stop_when_converged."""
        if (limit := self.cfg.patience_trials) is not None and not self.patient_out:
            got = patience(trials, self.cfg.resolved_direction == "maximize", self.cfg.min_improvement)
            if got.count >= limit:
                self.patient_out = True  # no best named: a running trial may be one
                self.message = self.message or (
                    f"stopped: no new best beyond study.min_improvement ({self.cfg.min_improvement:g}) in "
                    f"the last {got.count} finished trials (study.patience_trials)")
        if (self.watch is not None and not self.converged
                and (judged := self.watch.converged(trials)) is not None):
            self.converged = True
            self.message = self.message or f"stopped: {judged.reason()} (study.stop_when_converged)"

    def budget_used(self, message: str | None) -> None:
        """The claim found nothing left to run; ``message`` once no trial of ours runs either."""
        self.exhausted = True
        if message:
            self.message = self.message or message

    def worker_broken(self, message: str) -> None:
        if not self.broken:
            self.broken, self.message = True, message

    def clock(self, now: float | None = None) -> None:
        """A turn of the driver's loop: study.timeout judged on the clock (``now``: monotonic)."""
        if self.timed_out or (timeout := self.cfg.timeout) is None:
            return
        if (time.monotonic() if now is None else now) - self.started > timeout:
            self.timed_out = True
            if not self._halted():
                self.message = self.message or f"study.timeout ({timeout:g} s) reached"

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
        return self._halted() or self.timed_out or self._too_many_failures() or self.exhausted

    def ending(self) -> Ending:
        if self.stop.requested:
            return Ending.INTERRUPTED
        return Ending.FAILED if self.broken or self.disk_full or self._too_many_failures() else Ending.DONE

    def _halted(self) -> bool:
        """A reason that stops the sweep for good, whatever the clock and the counts say."""
        return self.stop.requested or self.broken or self.disk_full or self.patient_out or self.converged

    def _too_many_failures(self) -> bool:
        return self.failures_in_row >= self.cfg.max_consecutive_failures


@dataclass
class SweepResult:
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
        return 128 + self.signum if self.interrupted else 1 if self.ending is Ending.FAILED else 0
