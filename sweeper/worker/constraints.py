"""``study.constraints``: a trial's valid-split long-short figures and Optuna's constraint values.

The worker records, before the trial's tell:

- the user attributes ``valid_top_turnover`` and ``valid_long_short_sharpe`` (always: ``best``
  and the dashboard show them whether or not the study bounds them);
- with ``study.constraints``, one Optuna constraint per bounded figure, named after it, set with
  Optuna 5's public ``Trial.set_constraint`` (stored as the trial system attribute
  ``constraints:<figure>``): the amount by which the figure leaves its bound, so ``<= 0`` is
  feasible (Optuna's convention); and the user attribute ``feasible``.

Optuna 5's TPESampler and GPSampler read those stored values themselves (``trial.constraints``),
so the samplers need no ``constraints_func`` (deprecated in 5.0). Which trials count as feasible
when picking the best is :func:`sweeper.store.studies.feasible`."""

from collections.abc import Mapping
from typing import Any

import optuna
import pandas as pd

from sweeper.config import SweeperConfig
from sweeper.config.long_sweeps import Bound
from sweeper.quant.portfolio import long_short

FIGURES = {"top_turnover": "valid_top_turnover", "long_short_sharpe": "valid_long_short_sharpe"}
FEASIBLE = "feasible"  # the user attribute: the dashboard shows it (it cannot read the constraints)
# The violation of a figure the valid split leaves undefined (too few dates or assets): not
# feasible, since nothing shows it keeps its bound. Finite, because GPSampler fits a model on the
# constraint values (Optuna refuses NaN; an infinity would break the fit).
UNDEFINED = 1.0


def valid_figures(frame: pd.DataFrame, horizon: int, quantiles: int) -> dict[str, float | None]:
    """``{"valid_top_turnover": .., "valid_long_short_sharpe": ..}`` of a valid-split prediction
    frame (``date, asset, pred, label``), as ``sweeper best``'s long-short view computes them."""
    summary = long_short(frame, horizon, quantiles).summary()
    return {attr: summary[figure] for figure, attr in FIGURES.items()}


def violation(value: float | None, bound: Bound) -> float:
    """How far ``value`` lies outside ``bound``: <= 0 inside it (the larger excess of both ends)."""
    if value is None:
        return UNDEFINED
    above = [value - bound.max] if bound.max is not None else []
    return max(above + ([bound.min - value] if bound.min is not None else []))


def constraint_values(figures: Mapping[str, float | None], bounds: Mapping[Any, Bound]) -> dict[str, float]:
    """Optuna's constraint value of each bounded figure, by figure name (sorted: every trial of
    a study stores the same keys in the same order, as GPSampler needs)."""
    return {name: violation(figures[FIGURES[name]], bounds[name]) for name in sorted(bounds)}


def record(trial: optuna.Trial, figures: Mapping[str, float | None],
           bounds: Mapping[Any, Bound]) -> dict[str, Any]:
    """Set the trial's constraint values (none without bounds); the user attributes to record
    with its other results: the figures, and ``feasible`` when the study has bounds."""
    values = constraint_values(figures, bounds)
    for name, value in values.items():
        trial.set_constraint(name, value)
    return {**figures, **({FEASIBLE: all(v <= 0 for v in values.values())} if values else {})}


def record_constraints(trial: optuna.Trial, cfg: SweeperConfig,
                       predictions: Mapping[str, pd.DataFrame]) -> dict[str, Any]:
    """:func:`record` of the trial's valid-split predictions (``cfg``: the trial's own config,
    whose horizon its labels have): it writes the constraint values on the running trial, which
    the samplers read; the user attributes to store come back. Nothing when it has none."""
    if (frame := predictions.get("valid")) is None:
        return {}
    return record(trial, valid_figures(frame, cfg.data.horizon, cfg.report.quantiles), cfg.study.constraints)
