"""Report figures 9-10, the long-short view of the best trial (:mod:`sweeper.quant.portfolio`):
the mean label of each prediction bucket, and the cumulative long-short return, on valid
and test. Gross figures: equal weights, no costs."""

from typing import Any

import numpy as np
import plotly.graph_objects as go

from sweeper.inspect.figures_base import LAYOUT, SPLIT_COLORS, StudyData, empty
from sweeper.inspect.printing import scope_words
from sweeper.inspect.results import scored_on
from sweeper.store.studies import no_best


def _meta(data: StudyData) -> dict[str, Any] | go.Figure:
    """The figures' numbers, and ``scored_on``: the dates of valid and test (``best --json``'s); the
    placeholder figure when there is no best trial or no long-short view of it."""
    if data.best is None:
        return empty(no_best(data.study))
    if not data.long_short:
        return empty(f"no long-short view: {data.long_short_note or 'not computed'}")
    first = next(iter(data.long_short.values()))
    return {"trial": data.best.number, "quantiles": first.quantiles, "horizon": first.horizon,
            "scored_on": scored_on(data.study.user_attrs, True)["portfolio"],
            **{split: view.summary() for split, view in data.long_short.items()}}


def _valid_dates(meta: dict[str, Any]) -> str:
    said = scope_words(meta["scored_on"]["valid"])  # under walk-forward: the last fold's block
    return f"; valid: {said}" if said else ""


def buckets_figure(data: StudyData) -> go.Figure:
    """Bars: the mean label of each of the q buckets of the best trial's prediction."""
    if isinstance(meta := _meta(data), go.Figure):
        return meta
    q = meta["quantiles"]
    names = [f"{k + 1}" + (" (low)" if k == 0 else " (high)" if k == q - 1 else "") for k in range(q)]
    traces = [go.Bar(x=names, y=meta[split]["bucket_mean_label"], name=split,
                     marker_color=SPLIT_COLORS[split]) for split in data.long_short]
    return go.Figure(traces).update_layout(
        **LAYOUT, barmode="group", title=f"trial {meta['trial']}: mean label per prediction bucket "
        f"(q={q}, dates {max(meta['horizon'], 1)} apart){_valid_dates(meta)}",
        xaxis_title="bucket of the prediction", yaxis_title="mean label", meta=meta)


def longshort_figure(data: StudyData) -> go.Figure:
    """Lines: the cumulative top-minus-bottom return (non-compounded) on valid and test."""
    if isinstance(meta := _meta(data), go.Figure):
        return meta
    traces = [go.Scatter(x=[str(d)[:10] for d in view.dates], y=np.cumsum(view.ls), mode="lines", name=split,
                         line={"color": SPLIT_COLORS[split], "width": 2})
              for split, view in data.long_short.items()]
    title = (f"trial {meta['trial']}: cumulative long-short return (top - bottom bucket, gross)"
             + _valid_dates(meta))
    return go.Figure(traces).update_layout(**LAYOUT, title=title, xaxis={"type": "date"},
                                           yaxis_title="cumulative return", meta=meta)
