"""Claiming a trial: under the study's lock, fail stale trials, count the budget,
ask Optuna, and make the trial this driver's before anyone else looks."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeper.config import SweeperConfig
from sweeper.errors import StopRequested, StorageOutage
from sweeper.store import optuna_private as private
from sweeper.store.layout import trial_files
from sweeper.sweep.identity import Identity
from sweeper.sweep.retries import reconcile
from sweeper.sweep.space import suggest

# WAITING trials are not counted: they are retries queued for the next free
# slot, and ask() hands them out before sampling anything new, so counting them
# would make a queued retry block itself. Every ask happens under the lock, so
# the count can never overshoot.
BUDGET_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
MAX_LOST_CLAIMS = 3


def claim(study: optuna.Study, cfg: SweeperConfig, lock: Any, ident: Identity, run_dir: Path,
          seen: Callable[[list[FrozenTrial]], None] | None = None) -> optuna.Trial | None:
    """Under the lock, in order: fail stale trials, count the budget, ask, record
    the first heartbeat and the host. None when the budget is used up.

    ``seen`` gets the trials read under the lock, so that a caller can show the
    study's progress without reading them again. Waits (the lock, the store
    through an outage) end with StopRequested on Ctrl-C or SIGTERM."""
    with lock:
        for _ in range(MAX_LOST_CLAIMS):
            trials = reconcile(study, cfg.study, ident)
            if seen is not None:
                seen(trials)
            if sum(t.state in BUDGET_STATES for t in trials) >= cfg.study.n_trials:
                return None
            trial = study.ask()
            try:
                _make_ours(study, trial, cfg, ident, run_dir)
            except optuna.exceptions.UpdateFinishedTrialError:
                # another driver failed it as an orphan while this claim waited out an
                # outage (the lock's session died with the server): it is re-queued; count again
                continue
            except BaseException as exc:
                # a RUNNING trial with no worker would hold the budget until its heartbeat lapses
                _fail_claimed(study, trial, exc)
                raise
            return trial
    raise RuntimeError(f"{MAX_LOST_CLAIMS} claims in a row were failed by other drivers before they were made")


def _make_ours(study: optuna.Study, trial: optuna.Trial, cfg: SweeperConfig, ident: Identity, run_dir: Path) -> None:
    private.backend(study).record_heartbeat(private.trial_id(trial))
    # a retry carries the user attrs of its enqueue only; these make it this host's
    checkpoint = str(trial_files(run_dir, trial.number).checkpoint)
    for key, value in {**ident.attrs(), "checkpoint": checkpoint}.items():
        trial.set_user_attr(key, value)
    suggest(trial, cfg)


def _fail_claimed(study: optuna.Study, trial: optuna.Trial, exc: BaseException) -> None:
    """FAIL a trial whose claim broke off: ``interrupted`` (re-run with its params) after
    Ctrl-C, SIGTERM or an outage past the limit, else ``crash`` with the error. Best
    effort: the store may be what broke."""
    reason = "interrupted" if isinstance(exc, (KeyboardInterrupt, StopRequested, StorageOutage)) else "crash"
    try:
        trial.set_user_attr("fail_reason", reason)
        if reason == "interrupted":
            trial.set_user_attr("stop_reason", "interrupted")
        trial.set_user_attr("error", f"claim broke off: {type(exc).__name__}: {exc}"[:2000])
        study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
    except Exception:  # noqa: BLE001 - the original error is the one to report
        pass
