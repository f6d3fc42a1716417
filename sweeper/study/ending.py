"""How a trial ends in the store, for both sides: the one place that records why a trial
ended and then its state.

The reason is written first: Optuna refuses user attributes on a finished trial (which is
why its own stale-trial callback cannot record one). A trial can finish under our feet:
another host judged it stale, its worker told the store before the driver failed it, or a
claim's ask was failed as an orphan. Those races end here as ``False``, never as an error."""

from collections.abc import Callable, Mapping
from typing import Any

import optuna
from optuna.trial import TrialState

from sweeper.errors import FailReason, StopReason
from sweeper.store import optuna_private as private

ERROR_CHARS = 2000  # the stored error text is cut here: a traceback's last lines are in the trial's log


def fail_attrs(reason: FailReason | str, error: str, **extra: Any) -> dict[str, Any]:
    """The user attributes of a failed trial; an interrupted one also stopped for that reason.
    A reason of a user's own TrialFailure need not be one of FailReason's."""
    stopped = {"stop_reason": str(StopReason.INTERRUPTED)} if reason == FailReason.INTERRUPTED else {}
    return {"fail_reason": str(reason), "error": error[:ERROR_CHARS], **extra, **stopped}


def end_trial(study: optuna.Study, trial: optuna.Trial | int, state: TrialState, attrs: Mapping[str, Any],
              value: float | None = None, recorded: Callable[[], None] | None = None) -> bool:
    """Record ``attrs`` on ``trial`` (an ``optuna.Trial`` or a trial id), run ``recorded``
    (artifacts that must land before the state does), then tell ``state``. False when the
    trial had finished already: the outcome stored first stands."""
    trial_id = trial if isinstance(trial, int) else private.trial_id(trial)
    storage = private.backend(study)
    try:
        if storage.get_trial(trial_id).state.is_finished():
            return False
        for key, val in attrs.items():
            storage.set_trial_user_attr(trial_id, key, val)
        if recorded is not None:
            recorded()
        if state == TrialState.FAIL:
            # by id: the failing side (a driver, another host) holds no optuna.Trial of it
            return storage.set_trial_state_values(trial_id, state=TrialState.FAIL)
        told = trial if isinstance(trial, optuna.Trial) else optuna.Trial(study, trial_id)
        # tell, not the storage: a PRUNED trial takes its last intermediate value as its value
        study.tell(told, value if state == TrialState.COMPLETE else None, state=state, skip_if_finished=True)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    return True


def fail_trial(study: optuna.Study, trial_id: int, reason: FailReason, error: str, **extra: Any) -> bool:
    """FAIL a RUNNING trial with its reason; False when it had finished meanwhile."""
    return end_trial(study, trial_id, TrialState.FAIL, fail_attrs(reason, error, **extra))
