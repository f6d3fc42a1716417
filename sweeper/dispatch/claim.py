"""Claiming a trial: under the study's lock, fail stale trials, count the budget, ask Optuna, and
make the trial this driver's before anyone else looks."""

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeper.config import SweeperConfig
from sweeper.dispatch.retries import reconcile
from sweeper.errors import FailReason, StopRequested, StorageOutage
from sweeper.store import optuna_private as private
from sweeper.store.identity import Identity
from sweeper.store.layout import trial_files
from sweeper.store.locks import ClaimLock
from sweeper.study.ending import fail_trial
from sweeper.study.space import suggest
from sweeper.study.stacking import shape_of

# WAITING trials are not counted: they are retries queued for the next free slot, and ask() hands
# them out before sampling anything new, so counting them would make a queued retry block itself.
# Every ask happens under the lock, so the count can never overshoot.
BUDGET_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
MAX_LOST_CLAIMS = 3
WAIT_POLL_S = 0.5


def claim(study: optuna.Study, cfg: SweeperConfig, lock: ClaimLock, ident: Identity, run_dir: Path,
          seen: Callable[[list[FrozenTrial]], bool] | None = None, size: int = 1) -> list[optuna.Trial]:
    """Under the lock: fail stale trials, count the budget, ask, record the first heartbeat and the
    host. ``size`` > 1: a population, up to ``size`` trials of the first one's shape (within the
    budget, and only when no queued trial waits: a retry or an enqueued one runs alone). Empty when
    the budget is used up, or when ``seen`` (given the trials read under the lock, to show and judge
    the study's progress without reading them again) says to stop. Waits (the lock, the store
    through an outage) end with StopRequested on Ctrl-C or SIGTERM."""
    with lock:
        for _ in range(MAX_LOST_CLAIMS):
            trials = reconcile(study, cfg.study, ident, run_dir)
            if seen is not None and not seen(trials):
                return []
            if (left := cfg.study.n_trials - sum(t.state in BUDGET_STATES for t in trials)) <= 0:
                return []
            if size > 1 and study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                size = 1
            if (first := _ask(study, cfg, ident, run_dir)) is not None:
                return [first, *_followers(study, cfg, ident, run_dir, first, min(size, left) - 1)]
    raise RuntimeError(f"{MAX_LOST_CLAIMS} claims in a row were failed by other drivers "
                       "before they were made")


def _ask(study: optuna.Study, cfg: SweeperConfig, ident: Identity, run_dir: Path,
         params: dict[str, Any] | None = None) -> optuna.Trial | None:
    """A new trial of ours (``params``: enqueued first, the sampler drawing the rest); None when
    another driver failed it before it was made ours."""
    if params is not None:
        study.enqueue_trial(params)
    trial = study.ask()
    try:
        private.backend(study).record_heartbeat(private.trial_id(trial))
        # a retry carries the user attrs of its enqueue only; these make it this host's
        checkpoint = str(trial_files(run_dir, trial.number).checkpoint)
        for key, value in {**ident.attrs(), "checkpoint": checkpoint}.items():
            trial.set_user_attr(key, value)
        suggest(trial, cfg)
    except optuna.exceptions.UpdateFinishedTrialError:
        # another driver failed it as an orphan while this claim waited out an
        # outage (the lock's session died with the server): it is re-queued; count again
        return None
    except BaseException as exc:
        # a RUNNING trial with no worker would hold the budget until its heartbeat lapses: FAIL it,
        # ``interrupted`` (re-run with its params) after Ctrl-C, SIGTERM or an outage past the limit,
        # else ``crash`` (KeyboardInterrupt: a library caller's Ctrl-C, and a sweep's signals, a
        # StopRequested). Best effort: the store may be what broke; the original error is the one to report
        stopped = isinstance(exc, (KeyboardInterrupt, StorageOutage))
        reason = FailReason.INTERRUPTED if stopped else FailReason.CRASH
        with contextlib.suppress(Exception, StopRequested):
            fail_trial(study, private.trial_id(trial), reason,
                       f"claim broke off: {type(exc).__name__}: {exc}")
        raise
    return trial


def _followers(study: optuna.Study, cfg: SweeperConfig, ident: Identity, run_dir: Path,
               first: optuna.Trial, n: int) -> list[optuna.Trial]:
    """``n`` more trials of ``first``'s shape: its shape params enqueued, the sampler drawing each
    one's per-member params (study.stacking.member_keys) as it draws any trial's."""
    shape, out = shape_of(first.params, cfg), []
    for _ in range(n):
        if (trial := _ask(study, cfg, ident, run_dir, shape)) is None:
            break
        if shape_of(trial.params, cfg) != shape:  # not the one enqueued: it runs alone, as a retry
            fail_trial(study, private.trial_id(trial), FailReason.INTERRUPTED,
                       "claimed for a population of another shape")
            break
        out.append(trial)
    return out


class ClaimSchedule:
    """When the driver claims next: whenever it has room, except while the budget is held by other
    drivers' RUNNING trials, which may finish or die and need re-running: then each heartbeat
    interval, and at once when one of them ends (a cheap poll every WAIT_POLL_S)."""

    def __init__(self, interval: float, foreign_running: Callable[[], set[int]]) -> None:
        self.interval, self.foreign_running = interval, foreign_running
        self.waiting_on: set[int] = set()
        self.next_claim = self.next_poll = 0.0

    def due(self) -> bool:
        if (now := time.monotonic()) >= self.next_claim:
            return True
        if self.waiting_on and now >= self.next_poll:
            self.next_poll = now + WAIT_POLL_S
            return not self.waiting_on <= self.foreign_running()
        return False

    def wait_on(self, foreign: set[int]) -> None:
        self.waiting_on, self.next_claim = foreign, time.monotonic() + self.interval

    def clear(self) -> None:
        self.waiting_on = set()
