"""Report figures 9-10, the long-short view of the best trial (:mod:`sweeper.quant.portfolio`):
the mean label of each prediction bucket, and the cumulative long-short return, on valid
and test. Gross figures: equal weights, no costs."""
from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go
from optuna.trial import FrozenTrial

from sweeper.inspect.figures_base import LAYOUT, SPLIT_COLORS, StudyData, empty
from sweeper.inspect.printing import scope_words
from sweeper.inspect.results import scored_on
from sweeper.quant.portfolio import LongShort


def _unavailable(data: StudyData) -> go.Figure:
    """The placeholder when there is no best trial or no long-short view of it."""
    if data.best is None:
        return empty("no complete trial yet")
    return empty(f"no long-short view: {data.long_short_note or 'not computed'}")


def _meta(data: StudyData, best: FrozenTrial, long_short: dict[str, LongShort]) -> dict[str, Any]:
    """The figures' numbers, and ``scored_on``: the dates of valid and test (``best --json``'s)."""
    first = next(iter(long_short.values()))
    return {"trial": best.number, "quantiles": first.quantiles, "horizon": first.horizon,
            "scored_on": scored_on(data.study.user_attrs, True)["portfolio"],
            **{split: view.summary() for split, view in long_short.items()}}


def _valid_dates(meta: dict[str, Any]) -> str:
    said = scope_words(meta["scored_on"]["valid"])  # under walk-forward: the last fold's block
    return f"; valid: {said}" if said else ""


def buckets_figure(data: StudyData) -> go.Figure:
    """Bars: the mean label of each of the q buckets of the best trial's prediction."""
    if data.best is None or not data.long_short:
        return _unavailable(data)
    meta = _meta(data, data.best, data.long_short)
    q = meta["quantiles"]
    names = [f"{k + 1}" + (" (low)" if k == 0 else " (high)" if k == q - 1 else "") for k in range(q)]
    traces = [go.Bar(x=names, y=meta[split]["bucket_mean_label"], name=split,
                     marker_color=SPLIT_COLORS[split]) for split in data.long_short]
    fig = go.Figure(traces)
    fig.update_layout(**LAYOUT, barmode="group", meta=meta,
                      title=f"trial {data.best.number}: mean label per prediction bucket "
                            f"(q={q}, dates {max(meta['horizon'], 1)} apart){_valid_dates(meta)}",
                      xaxis_title="bucket of the prediction", yaxis_title="mean label")
    return fig


def longshort_figure(data: StudyData) -> go.Figure:
    """Lines: the cumulative top-minus-bottom return (non-compounded) on valid and test."""
    if data.best is None or not data.long_short:
        return _unavailable(data)
    meta = _meta(data, data.best, data.long_short)
    traces = []
    for split, view in data.long_short.items():
        dates = [str(d)[:10] for d in view.dates]
        traces.append(go.Scatter(x=dates, y=np.cumsum(view.ls), mode="lines", name=f"{split}",
                                 line={"color": SPLIT_COLORS[split], "width": 2}))
    title = (f"trial {data.best.number}: cumulative long-short return (top - bottom bucket, gross)"
             + _valid_dates(meta))
    fig = go.Figure(traces)
    fig.update_layout(**LAYOUT, title=title, xaxis={"type": "date"}, yaxis_title="cumulative return",
                      meta=meta)
    return fig
