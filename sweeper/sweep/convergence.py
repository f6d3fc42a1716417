"""Optuna's Terminator: each trial's fold scores (worker) and whether the study has converged
(parent, ``study.stop_when_converged``). The one home of ``optuna.terminator``.

``optuna.terminator`` is deprecated since Optuna 4.9 (to leave in 6.0, which ``optuna<6``
keeps out); it is still the field's own implementation of the rule (Makarova et al. 2022: stop
when the regret bound of the GP falls below the cross-validation error of the best trial), so
it is used here, behind this module, with its FutureWarning silenced in one place.
"""
from __future__ import annotations

import warnings

import optuna


def report_scores(trial: optuna.Trial, scores: list[float]) -> None:
    """The trial's per-fold scores (or per-seed, under holdout with repeats), for the
    Terminator's cross-validation error. Needs two scores or more; fewer report nothing."""
    if len(scores) < 2:
        return
    from optuna.terminator import report_cross_validation_scores

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the module's deprecation: see the docstring
        report_cross_validation_scores(trial, [float(s) for s in scores])
