"""Report figures 1-4, the search itself: optimisation history, parameter importances (PED-ANOVA:
fast, no scikit-learn), parallel coordinates and learning curves."""

import html
import warnings
from typing import Any

import numpy as np
import plotly.graph_objects as go
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import TrialState

from sweeper.inspect.figures_base import LAYOUT, STATE_COLORS, StudyData, empty
from sweeper.store.studies import feasible, scored


def history_figure(data: StudyData) -> go.Figure:
    done = scored(data.trials)
    numbers = np.array([t.number for t in done], dtype=np.int64)
    values = np.array([t.value for t in done], dtype=np.float64)
    ok = np.where([feasible(t) for t in done], values, np.nan)  # the best so far: of the feasible trials
    best = (np.fmax if data.maximize else np.fmin).accumulate(ok) if len(values) else values
    return go.Figure([go.Scatter(x=numbers, y=values, mode="markers", name=data.metric,
                                 marker={"size": 6, "opacity": 0.7}),
                      go.Scatter(x=numbers, y=best, mode="lines", name="best so far",
                                 line={"shape": "hv", "color": "#d62728"})]).update_layout(
        **LAYOUT, title=f"{data.metric} of {len(values)} complete trials", xaxis_title="trial",
        yaxis_title=data.metric, meta={"complete": len(values)})


def importance_figure(data: StudyData) -> go.Figure:
    from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            scores = get_param_importances(data.study, evaluator=PedAnovaImportanceEvaluator())
    except (ValueError, RuntimeError) as exc:  # too few trials, or no param that varies
        return empty(f"parameter importances unavailable: {exc}")
    if not scores:
        return empty("parameter importances unavailable: no parameter is shared by the complete trials")
    names = list(scores)[::-1]  # most important on top
    # PED-ANOVA says so (and returns equal shares) when there are too few trials to tell
    caveat = "; ".join(str(w.message) for w in caught if issubclass(w.category, UserWarning))
    bars = go.Bar(x=[scores[n] for n in names], y=names, orientation="h", marker_color="#1f77b4")
    return go.Figure(bars).update_layout(
        **LAYOUT, title="importance for the objective (PED-ANOVA, normalised to sum 1)"
        + (f"<br><sup>{html.escape(caveat)}</sup>" if caveat else ""),
        xaxis_title="importance", meta={"importances": dict(scores), "caveat": caveat or None})


def parallel_figure(data: StudyData) -> go.Figure:
    if not (done := scored(data.trials)):
        return empty("no complete trial yet")
    shared = [p for p in done[0].params if all(p in t.params for t in done)]
    dims = [_dimension(name, [t.params[name] for t in done], done[0].distributions[name]) for name in shared]
    values = np.array([t.value for t in done])
    dims.append({"label": data.metric, "values": values})
    left_out = sorted({p for t in done for p in t.params} - set(shared))
    note = f" (conditional, left out: {', '.join(left_out)})" if left_out else ""
    line = {"color": values, "colorscale": "Viridis", "showscale": True}
    return go.Figure(go.Parcoords(dimensions=dims, line=line)).update_layout(
        **{**LAYOUT, "margin": {"l": 80, "r": 80, "t": 80, "b": 40}},
        title=f"{len(done)} complete trials{note}", meta={"complete": len(done), "params": shared})


def _dimension(name: str, values: list[Any], dist: BaseDistribution) -> dict[str, Any]:
    if isinstance(dist, CategoricalDistribution):
        choices = list(dist.choices)
        return {"label": name, "values": [choices.index(v) for v in values],
                "tickvals": list(range(len(choices))), "ticktext": [str(c) for c in choices]}
    x = np.asarray(values, dtype=np.float64)
    log = getattr(dist, "log", False)
    return {"label": f"log10({name})" if log else name, "values": np.log10(x) if log else x}


def curves_figure(data: StudyData) -> go.Figure:
    """One trace per state; each trial's curve is a run of points ended by a gap (NaN),
    which draws as fast as one line however many trials there are."""
    traces, counts = [], {}
    for state in TrialState:
        if not (trials := [t for t in data.trials if t.state == state and t.intermediate_values]):
            continue
        steps = [sorted(t.intermediate_values) for t in trials]
        xs = [x for s in steps for x in (*s, np.nan)]
        ys = [y for t, s in zip(trials, steps) for y in (*(t.intermediate_values[k] for k in s), np.nan)]
        ids = [i for t, s in zip(trials, steps) for i in (*[t.number] * len(s), np.nan)]
        counts[state.name] = len(trials)
        traces.append(go.Scatter(x=np.array(xs, dtype=np.float64), y=np.array(ys, dtype=np.float64),
                                 customdata=np.array(ids, dtype=np.float64), mode="lines",
                                 name=f"{state.name.lower()} ({len(trials)})",
                                 line={"width": 1, "color": STATE_COLORS.get(state.name)}, opacity=0.6,
                                 hovertemplate="trial %{customdata}<br>epoch %{x}: %{y:.4f}<extra></extra>"))
    return go.Figure(traces).update_layout(**LAYOUT, title=f"{data.epoch_metric} per epoch, by trial state",
                                           xaxis_title="epoch", yaxis_title=data.epoch_metric,
                                           meta={"trials_by_state": counts})

