"""Report figure 13: the top trials' fold ICs (figure 8, the selection bias, takes its standard
errors from them under walk-forward: :mod:`sweeper.inspect.figures_ic`).

Under walk-forward folds a trial's objective is the mean of its fold ICs (``fold_val_ic``),
and how they spread is what says whether the winner is good on every period or lucky on one.
A study of one fold has none, and its report no figure 13.
"""
from __future__ import annotations

import plotly.graph_objects as go

from sweeper.inspect.figures_base import LAYOUT, StudyData, empty, finite
from sweeper.store.studies import ranked
from sweeper.validation import contract as K

TOP = 10  # trials drawn in figure 13: more lines than this are a tangle


def folds_figure(data: StudyData) -> go.Figure:
    """One line per trial across its folds' val IC, for the ``TOP`` best trials by objective (the
    order of ``sweeper best``); ``layout.meta``: ``trials`` (best first), ``fold_val_ic`` and
    ``value`` by trial number (as text, as JSON keys are), and the study's fold layout."""
    spans = K.layout(data.study.user_attrs)
    top = [t for t in ranked(data.trials, data.maximize) if t.user_attrs.get("fold_val_ic")][:TOP]
    if not top:
        return empty("no complete trial with fold ICs (fold_val_ic) yet")
    width = max(len(t.user_attrs["fold_val_ic"]) for t in top)
    # the x labels: fold k and its valid block's first and last target date
    valid = [spans[k]["valid"] if k < len(spans) else None for k in range(width)]
    labels = [f"fold {k + 1}<br>{v[0]} to {v[1]}" if v else f"fold {k + 1}" for k, v in enumerate(valid)]
    traces = []
    for rank, t in enumerate(top):
        ics = [v if finite(v) else None for v in t.user_attrs["fold_val_ic"]]
        traces.append(go.Scatter(
            x=labels[:len(ics)], y=ics, mode="lines+markers",
            name=f"trial {t.number} ({data.metric} {t.value:.4f})",
            line={"width": 3 if rank == 0 else 1.5}, opacity=1.0 if rank == 0 else 0.7,
            hovertemplate=f"trial {t.number}<br>%{{x}}<br>val IC %{{y:.4f}}<extra></extra>"))
    title = f"val IC per fold of the top {len(top)} trials (best: trial {top[0].number}, thick)"
    return go.Figure(traces).update_layout(
        **LAYOUT, title=title, xaxis_title="fold (valid block)", yaxis_title="validation IC",
        meta={"trials": [t.number for t in top], K.FOLD_DATES: spans,
              "fold_val_ic": {str(t.number): t.user_attrs["fold_val_ic"] for t in top},
              "value": {str(t.number): t.value for t in top}})

