"""Report figures 6-8, 12 and 13, trusting the IC: validation against test IC per trial, the best
trial's daily and cumulative IC, the selection bias of picking the best of many
(:mod:`sweeper.quant.selection`), its cumulative daily IC against the LightGBM baseline's, and the
top trials' fold ICs: under walk-forward folds a trial's objective is their mean, and how they spread
says whether the winner is good on every period or lucky on one (figure 8 takes its standard errors
from them; a study of one fold has none, and its report no figure 13)."""

import numpy as np
import plotly.graph_objects as go
from optuna.trial import TrialState

from sweeper.baseline.compare import baseline_daily
from sweeper.inspect.figures_base import LAYOUT, SPLIT_COLORS, TWO_AXES, StudyData, empty, finite
from sweeper.inspect.results import read_daily, selection_report
from sweeper.store.layout import trial_files
from sweeper.store.studies import no_best, ranked
from sweeper.validation import contract as K


def overfit_figure(data: StudyData) -> go.Figure:
    rows = [(t.number, t.user_attrs.get("val_ic"), t.user_attrs.get("test_ic"))
            for t in data.trials if t.state == TrialState.COMPLETE]
    if not (rows := [r for r in rows if finite(r[1]) and finite(r[2])]):
        return empty("no complete trial has both val_ic and test_ic")
    numbers, val, test = (np.array(c) for c in zip(*rows))
    traces = [go.Scatter(x=val, y=test, mode="markers", customdata=numbers, name="trials",
                         marker={"size": 6, "opacity": 0.6},
                         hovertemplate="trial %{customdata}<br>val %{x:.4f} test %{y:.4f}<extra></extra>")]
    if data.best is not None and data.best.number in set(numbers.tolist()):
        k = int(np.flatnonzero(numbers == data.best.number)[0])
        traces.append(go.Scatter(x=[val[k]], y=[test[k]], mode="markers",
                                 name=f"best (trial {data.best.number})",
                                 marker={"size": 14, "symbol": "star", "color": "#d62728"}))
    lo, hi = float(min(val.min(), test.min())), float(max(val.max(), test.max()))
    traces.append(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="test = valid",
                             line={"dash": "dash", "color": "#7f7f7f"}))
    corr = float(np.corrcoef(val, test)[0, 1]) if len(val) > 2 and val.std() > 0 and test.std() > 0 else None
    title = f"{len(val)} complete trials; mean test - valid {float((test - val).mean()):+.4f}"
    title += f"; correlation {corr:.2f}" if corr is not None else ""
    # under walk-forward a trial's val_ic is the mean over its folds; its test_ic, the last fold's model
    valid = "validation IC (mean over the folds)" if data.folded else "validation IC"
    return go.Figure(traces).update_layout(**LAYOUT, title=title, xaxis_title=valid, yaxis_title="test IC",
                                           meta={"complete": len(val), "correlation": corr})


def daily_figure(data: StudyData) -> go.Figure:
    if data.best is None:
        return empty(no_best(data.study))
    files = trial_files(data.run_dir, data.best.number)
    traces, days = [], {}
    folds = data.folded  # the daily file holds every fold's valid block
    for split, color in SPLIT_COLORS.items():
        if (daily := read_daily(files.daily_ic(split))) is None:
            continue
        days[split] = len(daily["ic"])
        dates = daily["date"].tolist() if "date" in daily else list(range(len(daily["ic"])))
        named = f"{split}, every fold" if folds and split == "valid" else split
        traces.append(go.Bar(x=dates, y=daily["ic"], name=f"daily IC ({named})", marker_color=color,
                             opacity=0.45))
        traces.append(go.Scatter(x=dates, y=np.nancumsum(daily["ic"]), name=f"cumulative IC ({named})",
                                 yaxis="y2", line={"color": color, "width": 2}))
    if not traces:
        return empty(f"trial {data.best.number} has no daily IC files in {files.folder.parent}")
    return go.Figure(traces).update_layout(
        **TWO_AXES, title=f"trial {data.best.number}: daily IC (bars) and cumulative IC (lines)",
        xaxis={"type": "date"}, yaxis={"title": "daily IC"}, bargap=0,
        yaxis2={"title": "cumulative IC", "overlaying": "y", "side": "right"},
        meta={"trial": data.best.number, "days": days})


def selection_figure(data: StudyData) -> go.Figure:
    """Histogram of the trials' mean validation IC (under walk-forward, of their fold ICs: their
    objective's mean) with the no-signal best, the best and the deflated IC marked, all from
    :func:`sweeper.inspect.results.selection_report` (under walk-forward, standard errors from the
    fold ICs and PBO along the folds); ``layout.meta.selection`` is that summary."""
    summary = None if data.best is None else selection_report(
        data.study, data.run_dir, data.best, data.trials, data.horizons, data.daily_valid)
    if summary is None:
        return empty("selection bias unavailable: the best trial has no daily_ic_valid.csv")
    if data.folded:
        folds = ([v for v in t.user_attrs.get("fold_val_ic") or [] if finite(v)]
                 for t in data.trials if t.number in data.daily_valid)
        means, axis = [float(np.mean(ics)) for ics in folds if ics], "mean fold validation IC"
    else:
        means = [float(np.nanmean(v)) for v in data.daily_valid.values() if np.isfinite(v).any()]
        axis = "mean daily validation IC"
    fig = go.Figure(go.Histogram(x=means, nbinsx=min(40, max(5, len(means) // 3)), name="trials",
                                 marker_color="#9ecae1"))
    marks = [("expected_max_null_ic", "no-signal best", "#d62728"), ("best_val_ic", "best", "#1f77b4"),
             ("deflated_ic", "deflated", "#2ca02c")]
    for key, label, color in marks:
        if summary.get(key) is not None:
            fig.add_vline(x=summary[key], line={"color": color, "dash": "dash"},
                          annotation={"text": f"{label} {summary[key]:.4f}", "textangle": -90})
    return fig.update_layout(**LAYOUT, title=f"{summary['n_trials']} trials; P(best IC is a fluke) "
                             + (f"{p:.1%}" if (p := summary.get("p_fluke")) is not None else "-"),
                             xaxis_title=axis, yaxis_title="trials", meta={"selection": summary})


def baseline_figure(data: StudyData) -> go.Figure:
    """Cumulative daily IC, best trial (solid) and baseline (dashed), per split."""
    if not (attr := data.study.user_attrs.get("baseline")):
        return empty("no LightGBM baseline yet (sweeper baseline STUDY, or report.baseline in a sweep)")
    traces = []
    files = trial_files(data.run_dir, data.best.number) if data.best is not None else None
    for split, color in SPLIT_COLORS.items():
        if (base := baseline_daily(attr, split)) is not None:
            traces.append(go.Scatter(x=base[0], y=np.nancumsum(base[1]), name=f"baseline ({split})",
                                     line={"color": color, "dash": "dash"}))
        daily = read_daily(files.daily_ic(split)) if files is not None else None
        if daily is not None and data.best is not None:
            dates = daily["date"].tolist() if "date" in daily else list(range(len(daily["ic"])))
            traces.append(go.Scatter(x=dates, y=np.nancumsum(daily["ic"]), line={"color": color},
                                     name=f"trial {data.best.number} ({split})"))
    return go.Figure(traces).update_layout(
        **LAYOUT, title="cumulative daily IC: best trial (solid) and LightGBM baseline (dashed)",
        xaxis_title="date", yaxis_title="cumulative IC",
        meta={"baseline": {k: attr.get(k) for k in ("val_ic", "test_ic")}})


TOP = 10  # trials drawn in figure 13: more lines than this are a tangle


def folds_figure(data: StudyData) -> go.Figure:
    """One line per trial across its folds' val IC, for the ``TOP`` best trials by objective (the
    order of ``sweeper best``); ``layout.meta``: ``trials`` (best first), ``fold_val_ic`` and
    ``value`` by trial number (as text, as JSON keys are), and the study's fold layout."""
    spans = K.layout(data.study.user_attrs)
    if not (top := [t for t in ranked(data.trials, data.maximize) if t.user_attrs.get("fold_val_ic")][:TOP]):
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

