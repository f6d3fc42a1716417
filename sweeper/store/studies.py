"""Opening a study that must already exist, and reading its best trial.

Read-only: nothing here creates a study or a database file."""

import math

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeper.config import SweeperConfig
from sweeper.errors import StudyNotFound
from sweeper.store.engine import open_storage

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


def load_existing(cfg: SweeperConfig, storage_url: str | None = None) -> optuna.Study:
    url = storage_url or cfg.study.resolved_storage
    storage = open_storage(url, create=False)
    if cfg.study.name not in (names := [s.study_name for s in storage.get_all_studies()]):
        known = f" (it holds: {', '.join(names)})" if names else ""
        raise StudyNotFound(f"study {cfg.study.name!r} not found in {url}{known}; "
                            "start it with `sweeper run`")
    return optuna.load_study(study_name=cfg.study.name, storage=storage)


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """The best COMPLETE trial with a finite value, or None."""
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return best_in(done, study.direction == optuna.study.StudyDirection.MAXIMIZE)


def best_in(trials: list[FrozenTrial], maximize: bool) -> FrozenTrial | None:
    """The best COMPLETE trial with a finite value among ``trials``, or None."""
    return next(iter(ranked(trials, maximize)), None)


def no_best(study: optuna.Study) -> str:
    """Why no trial ranks: the one wording of ``best``, ``predict`` and ``refit``."""
    if out := n_infeasible(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))):
        return (f"study {study.study_name!r} has no completed feasible trial yet: every completed trial with "
                f"a value ({out}) is outside study.constraints")
    return f"study {study.study_name!r} has no completed trial yet"


def ranked(trials: list[FrozenTrial], maximize: bool) -> list[FrozenTrial]:
    """The feasible COMPLETE trials with a finite value, best first; of equal values the lower number first.
    The one order of ``best``, ``predict --trial topK``, ``study.keep``'s top k and a warm start's top k."""
    sign = -1.0 if maximize else 1.0
    return sorted([t for t in scored(trials) if feasible(t)],
                  key=lambda t: (sign * float(t.value or 0.0), t.number))


def scored(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The COMPLETE trials with a finite value: those a best could be, feasible or not."""
    return [t for t in trials
            if t.state == TrialState.COMPLETE and t.value is not None and math.isfinite(t.value)]


def n_infeasible(trials: list[FrozenTrial]) -> int:
    """How many COMPLETE trials with a finite value :func:`ranked` leaves out as infeasible."""
    return sum(not feasible(t) for t in scored(trials))


def feasible(trial: FrozenTrial) -> bool:
    """Every constraint value the trial stored (``study.constraints``, Optuna's
    ``Trial.set_constraint``) is <= 0, Optuna's convention; a trial with none is feasible."""
    return all(value <= 0.0 for value in trial.constraints.values())
