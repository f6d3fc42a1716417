"""Optuna's Terminator: each trial's fold scores (worker) and whether the study has converged
(parent, ``study.stop_when_converged``). The one home of ``optuna.terminator``.

``optuna.terminator`` is deprecated since Optuna 4.9 (to leave in 6.0, which ``optuna<6``
keeps out); it is still the field's own implementation of the rule (Makarova et al. 2022: stop
when the regret bound of the GP falls below the cross-validation error of the best trial), so
it is used here, behind this module, with its FutureWarning silenced in one place."""

import warnings
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from sweeper.store.studies import scored


def report_scores(trial: optuna.Trial, scores: list[float]) -> None:
    """The trial's per-fold scores (or per-seed, for seed repeats of one fold), for the
    Terminator's cross-validation error. Needs two scores or more; fewer report nothing."""
    if len(scores) < 2:
        return
    from optuna.terminator import report_cross_validation_scores

    with warnings.catch_warnings(action="ignore", category=FutureWarning):  # see the module docstring
        report_cross_validation_scores(trial, [float(s) for s in scores])


# Optuna's Terminator judges nothing before 20 COMPLETE trials; a sampler's start-up trials
# (random draws) say little about the regret left, so the floor is at least their count
TERMINATOR_MIN_TRIALS = 20
JUDGE_SEED = 0  # the regret bound's random search: the same trials get the same judgement


@dataclass(frozen=True)
class Judgement:
    """One judgement by the Terminator's rule (``Terminator.should_terminate``): converged when the regret
    bound of a GP over the top trials is below the cross-validation error of the best trial's scores."""

    complete: int  # the COMPLETE trials judged
    best: int  # the best trial's number
    regret_bound: float
    error: float

    @property
    def converged(self) -> bool:
        return self.regret_bound < self.error

    def reason(self) -> str:
        return (f"Optuna's Terminator judges the study converged after {self.complete} complete "
                f"trials: the regret bound {self.regret_bound:.2g} is below the cross-validation "
                f"error {self.error:.2g} of the best trial's scores (trial {self.best})")


def min_trials(sampler_options: dict[str, Any]) -> int:
    """The COMPLETE trials before any judgement: Optuna's 20, or the sampler's
    ``n_startup_trials`` when that is more."""
    return max(TERMINATOR_MIN_TRIALS, int(sampler_options.get("n_startup_trials", 0)))


def judge(trials: list[FrozenTrial], maximize: bool, min_n_trials: int) -> Judgement | None:
    """The Terminator's judgement on the study's trials, or None when it cannot judge: fewer
    than ``min_n_trials`` COMPLETE trials, a best trial that reported no scores (one from
    before scores were reported, or one that told its value without them), or a search space
    the GP cannot model (no parameter common to every trial).

    The evaluators are called on the trials the caller already holds (the claim's), not on a
    study: ``should_terminate(study)`` would read every trial again, and it gives only the
    verdict, not the two figures the log line quotes. The GP runs with torch on the CPU."""
    if len(complete := scored(trials)) < min_n_trials:
        return None
    from optuna.terminator import CrossValidationErrorEvaluator, RegretBoundEvaluator

    direction = StudyDirection.MAXIMIZE if maximize else StudyDirection.MINIMIZE
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the module's deprecation: see the docstring
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        try:  # first the error: it is cheap, and it raises when the best trial has no scores
            error = CrossValidationErrorEvaluator().evaluate(complete, direction)
            bound = RegretBoundEvaluator(seed=JUDGE_SEED).evaluate(complete, direction)
        except ValueError:  # no scores reported by the best trial, or an empty intersection space
            return None
    # the best trial as the error evaluator picks it: max/min by value, the first of equals
    best = (max if maximize else min)(complete, key=lambda t: float(t.value))  # type: ignore[arg-type]
    return Judgement(len(complete), best.number, float(bound), float(error))


class Watch:
    """``study.stop_when_converged`` for one driver: judges again only when the number of
    COMPLETE trials has changed since its last judgement (the claim reads the trials far more
    often than trials complete, and each judgement fits a GP)."""

    def __init__(self, maximize: bool, min_n_trials: int) -> None:
        self.maximize, self.min_n_trials = maximize, min_n_trials
        self.judged_at = -1  # the COMPLETE count of the last judgement
        self.last: Judgement | None = None

    def converged(self, trials: list[FrozenTrial]) -> Judgement | None:
        """The judgement when it says converged, else None."""
        count = sum(t.state == TrialState.COMPLETE for t in trials)
        if count == self.judged_at or count < self.min_n_trials:
            return None
        self.judged_at = count
        self.last = judge(trials, self.maximize, self.min_n_trials)
        return self.last if self.last is not None and self.last.converged else None
