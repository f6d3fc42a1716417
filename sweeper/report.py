"""``sweeper report``: one self-contained HTML page about a study.

Eight plotly figures, built here with ``plotly.graph_objects`` from one read of
the study (optuna.visualization re-reads the trials per plot and draws one trace
per trial, which is far too slow at 500 trials):

1. ``history``: the objective per finished trial and the best so far
2. ``importance``: parameter importances (PED-ANOVA: fast, no scikit-learn)
3. ``parallel``: parallel coordinates of params and objective
4. ``curves``: per-epoch objective of every trial, coloured by state
5. ``timeline``: trials per device slot over time, with the slots' utilisation
   (plus GPU telemetry from ``devices.csv`` when the sweep had GPUs)
6. ``overfit``: validation IC against test IC per trial
7. ``daily``: the best trial's daily and cumulative IC on valid and test
8. ``selection``: how much of the best validation IC a signal-free search of
   this many trials would reach anyway (:mod:`sweeper.selection`)

plotly.js is inlined once, so the file works offline. Each figure's JSON sits in
its own ``<script type="application/json" id="fig-NAME">`` tag; machine-readable
figures (counts, utilisation, the selection summary) are in its ``layout.meta``.
"""
from __future__ import annotations

import csv
import html
import math
import os
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import plotly.graph_objects as go
from optuna.trial import FrozenTrial, TrialState

from sweeper import config as C

FIGURES = ("history", "importance", "parallel", "curves", "timeline", "overfit", "daily", "selection")
TITLES = {
    "history": "1. Optimization history", "importance": "2. Parameter importances",
    "parallel": "3. Parallel coordinates", "curves": "4. Learning curves (intermediate values)",
    "timeline": "5. Trials per device", "overfit": "6. Validation IC vs test IC",
    "daily": "7. Best trial: daily and cumulative IC", "selection": "8. Selection bias",
}
STATE_COLORS = {"COMPLETE": "#1f77b4", "PRUNED": "#ff7f0e", "FAIL": "#d62728", "RUNNING": "#2ca02c",
                "WAITING": "#7f7f7f"}
IDLE_GAP = timedelta(minutes=5)  # no trial running for longer than this: the sweep was stopped
LAYOUT = {"height": 420, "margin": {"l": 60, "r": 30, "t": 60, "b": 50}}


@dataclass
class StudyData:
    """Everything the figures read, loaded once."""

    name: str
    metric: str
    maximize: bool
    trials: list[FrozenTrial]
    run_dir: Path
    study: optuna.Study
    best: FrozenTrial | None = None
    daily_valid: dict[int, np.ndarray] = field(default_factory=dict)
    now: datetime = field(default_factory=datetime.now)

    def finished(self, *states: TrialState) -> list[FrozenTrial]:
        return [t for t in self.trials if t.state in states]


def load(study: optuna.Study, run_dir: str | Path, metric: str) -> StudyData:
    from sweeper.results import best_trial, valid_daily_ics

    trials = study.get_trials(deepcopy=False)
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    return StudyData(name=study.study_name, metric=metric, maximize=maximize, trials=trials,
                     run_dir=Path(run_dir), study=study, best=best_trial(study),
                     daily_valid=valid_daily_ics(trials, run_dir))


def build_figures(data: StudyData) -> dict[str, go.Figure]:
    """The eight figures, by name (see FIGURES); ``telemetry`` too when devices.csv exists."""
    figures = {
        "history": history_figure(data), "importance": importance_figure(data),
        "parallel": parallel_figure(data), "curves": curves_figure(data),
        "timeline": timeline_figure(data), "overfit": overfit_figure(data),
        "daily": daily_figure(data), "selection": selection_figure(data),
    }
    telemetry = telemetry_figure(data.run_dir / "devices.csv")
    if telemetry is not None:
        figures["telemetry"] = telemetry
    return figures


def write_report(cfg: C.SweeperConfig, out: str | Path, storage_url: str | None = None) -> dict[str, Any]:
    """Write the report for ``cfg``'s study to ``out`` (atomically); returns a summary."""
    from sweeper.results import load_existing, run_dir

    started = time.perf_counter()
    study = load_existing(cfg, storage_url)
    data = load(study, run_dir(cfg), cfg.study.metric)
    figures = build_figures(data)
    page = render_html(data, figures, oracle=study.user_attrs.get("oracle_ic"))
    _write_atomic(Path(out), page)
    return {"path": str(out), "trials": len(data.trials), "figures": list(figures),
            "seconds": time.perf_counter() - started}


# ------------------------------------------------------------------ 1-4: the search


def _objective_points(data: StudyData) -> tuple[np.ndarray, np.ndarray]:
    done = [t for t in data.finished(TrialState.COMPLETE) if t.value is not None and math.isfinite(t.value)]
    return (np.array([t.number for t in done], dtype=np.int64),
            np.array([t.value for t in done], dtype=np.float64))


def history_figure(data: StudyData) -> go.Figure:
    numbers, values = _objective_points(data)
    best = (np.maximum if data.maximize else np.minimum).accumulate(values) if len(values) else values
    fig = go.Figure([
        go.Scatter(x=numbers, y=values, mode="markers", name=data.metric, marker={"size": 6, "opacity": 0.7}),
        go.Scatter(x=numbers, y=best, mode="lines", name="best so far", line={"shape": "hv", "color": "#d62728"}),
    ])
    fig.update_layout(**LAYOUT, title=f"{data.metric} of {len(values)} complete trials",
                      xaxis_title="trial", yaxis_title=data.metric, meta={"complete": len(values)})
    return fig


def importance_figure(data: StudyData) -> go.Figure:
    from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            scores = get_param_importances(data.study, evaluator=PedAnovaImportanceEvaluator())
    except (ValueError, RuntimeError) as exc:  # too few trials, or no param that varies
        return _empty(f"parameter importances unavailable: {exc}")
    if not scores:
        return _empty("parameter importances unavailable: no parameter is shared by the complete trials")
    names = list(scores)[::-1]  # most important on top
    # PED-ANOVA says so (and returns equal shares) when there are too few trials to tell
    caveat = "; ".join(str(w.message) for w in caught if issubclass(w.category, UserWarning))
    fig = go.Figure(go.Bar(x=[scores[n] for n in names], y=names, orientation="h", marker_color="#1f77b4"))
    fig.update_layout(**LAYOUT, title="importance for the objective (PED-ANOVA, normalised to sum 1)"
                      + (f"<br><sup>{html.escape(caveat)}</sup>" if caveat else ""),
                      xaxis_title="importance", meta={"importances": dict(scores), "caveat": caveat or None})
    return fig


def parallel_figure(data: StudyData) -> go.Figure:
    done = [t for t in data.finished(TrialState.COMPLETE) if t.value is not None and math.isfinite(t.value)]
    if not done:
        return _empty("no complete trial yet")
    shared = [p for p in done[0].params if all(p in t.params for t in done)]
    dims = [_dimension(name, [t.params[name] for t in done], done[0].distributions[name]) for name in shared]
    values = np.array([t.value for t in done])
    dims.append({"label": data.metric, "values": values})
    fig = go.Figure(go.Parcoords(dimensions=dims, line={"color": values, "colorscale": "Viridis",
                                                          "showscale": True}))
    left_out = sorted({p for t in done for p in t.params} - set(shared))
    note = f" (conditional, left out: {', '.join(left_out)})" if left_out else ""
    fig.update_layout(**{**LAYOUT, "margin": {"l": 80, "r": 80, "t": 80, "b": 40}},
                      title=f"{len(done)} complete trials{note}", meta={"complete": len(done), "params": shared})
    return fig


def _dimension(name: str, values: list[Any], dist: Any) -> dict[str, Any]:
    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        choices = list(dist.choices)
        return {"label": name, "values": [choices.index(v) for v in values],
                "tickvals": list(range(len(choices))), "ticktext": [str(c) for c in choices]}
    x = np.asarray(values, dtype=np.float64)
    if getattr(dist, "log", False):
        return {"label": f"log10({name})", "values": np.log10(x)}
    return {"label": name, "values": x}


def curves_figure(data: StudyData) -> go.Figure:
    """One trace per state; each trial's curve is a run of points ended by a gap (NaN),
    which draws as fast as one line however many trials there are."""
    traces, counts = [], {}
    for state in TrialState:
        trials = [t for t in data.trials if t.state == state and t.intermediate_values]
        if not trials:
            continue
        lengths = [len(t.intermediate_values) + 1 for t in trials]
        xs, ys = np.full(sum(lengths), np.nan), np.full(sum(lengths), np.nan)
        ids = np.repeat(np.array([t.number for t in trials], dtype=np.float64), lengths)
        at = 0
        for t, n in zip(trials, lengths):
            steps = sorted(t.intermediate_values)
            xs[at:at + n - 1] = steps
            ys[at:at + n - 1] = [t.intermediate_values[s] for s in steps]
            ids[at + n - 1] = np.nan
            at += n
        counts[state.name] = len(trials)
        traces.append(go.Scatter(x=xs, y=ys, customdata=ids, mode="lines", name=f"{state.name.lower()} ({len(trials)})",
                                 line={"width": 1, "color": STATE_COLORS.get(state.name)}, opacity=0.6,
                                 hovertemplate="trial %{customdata}<br>epoch %{x}: %{y:.4f}<extra></extra>"))
    fig = go.Figure(traces)
    fig.update_layout(**LAYOUT, title=f"{data.metric} per epoch, by trial state", xaxis_title="epoch",
                      yaxis_title=data.metric, meta={"trials_by_state": counts})
    return fig


# ------------------------------------------------------------------ 5: devices


def _slot(t: FrozenTrial, hosts: int) -> str | None:
    device = t.user_attrs.get("device")
    if device is None:
        return None
    return f"{t.user_attrs.get('host')}/{device}" if hosts > 1 else str(device)


def _spans(data: StudyData) -> dict[str, list[tuple[datetime, datetime, FrozenTrial]]]:
    """Slot -> (start, end, trial), for every trial that started on a known slot."""
    hosts = len({t.user_attrs.get("host") for t in data.trials if "device" in t.user_attrs})
    spans: dict[str, list] = {}
    for t in data.trials:
        slot = _slot(t, hosts)
        if slot is None or t.datetime_start is None:
            continue
        end = t.datetime_complete or (data.now if t.state == TrialState.RUNNING else None)
        if end is not None:
            spans.setdefault(slot, []).append((t.datetime_start, max(end, t.datetime_start), t))
    return spans


def _union(intervals: list[tuple[datetime, datetime]], gap: timedelta = timedelta(0)) -> list[list[datetime]]:
    merged: list[list[datetime]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1] + gap:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def _windows(spans: dict[str, list]) -> list[tuple[datetime, datetime, set[str]]]:
    """The stretches of wall time a sweep ran, each with the slots it used: one per
    ``sweeper run`` (its trials' first start to last end, by their driver_id); trials
    without one are joined unless no trial ran for over IDLE_GAP."""
    runs: dict[Any, list[tuple[str, datetime, datetime]]] = {}
    for slot, rows in spans.items():
        for s, e, t in rows:
            runs.setdefault(t.user_attrs.get("driver_id"), []).append((slot, s, e))
    windows = []
    for driver, rows in runs.items():
        cuts = _union([(s, e) for _, s, e in rows], IDLE_GAP) if driver is None else \
            [[min(s for _, s, _ in rows), max(e for _, _, e in rows)]]
        for a, b in cuts:
            windows.append((a, b, {slot for slot, s, e in rows if a <= s <= b}))
    return windows


def utilisation(data: StudyData) -> dict[str, Any]:
    """busy / (slots x wall span), summed over sweeper runs: busy is the time each slot
    held a trial; a run's capacity is its slots times its wall span (see _windows), so
    the hours between two runs of a resumed study count for neither."""
    spans = _spans(data)
    if not spans:
        return {"slots": 0, "busy_s": 0.0, "span_s": 0.0, "capacity_s": 0.0, "fraction": None, "per_slot": {}}
    busy = {slot: sum((e - s).total_seconds() for s, e in _union([(s, e) for s, e, _ in rows]))
            for slot, rows in sorted(spans.items())}
    windows = _windows(spans)
    capacity = {slot: sum((b - a).total_seconds() for a, b, used in windows if slot in used) for slot in busy}
    span = sum((b - a).total_seconds() for a, b in _union([(a, b) for a, b, _ in windows]))
    total = sum(capacity.values())
    return {"slots": len(busy), "busy_s": sum(busy.values()), "span_s": span, "capacity_s": total,
            "runs": len(windows), "fraction": sum(busy.values()) / total if total > 0 else None,
            "per_slot": {k: (busy[k] / capacity[k] if capacity[k] > 0 else None) for k in busy}}


def timeline_figure(data: StudyData) -> go.Figure:
    spans = _spans(data)
    use = utilisation(data)
    traces = []
    for state in TrialState:
        rows = [(slot, s, e, t) for slot, items in spans.items() for s, e, t in items if t.state == state]
        if not rows:
            continue
        traces.append(go.Bar(
            y=[r[0] for r in rows], base=[r[1].isoformat() for r in rows],
            x=[(r[2] - r[1]).total_seconds() * 1000 for r in rows], customdata=[r[3].number for r in rows],
            orientation="h", name=state.name.lower(), marker_color=STATE_COLORS.get(state.name),
            hovertemplate="trial %{customdata}<br>%{base} for %{x:.0f} ms<extra></extra>"))
    fig = go.Figure(traces)
    frac = use["fraction"]
    title = f"{use['slots']} slots, utilisation {frac:.1%}" if frac is not None else "no trial has started on a slot"
    fig.update_layout(**LAYOUT, title=title, barmode="overlay", xaxis={"type": "date", "title": "time"},
                      yaxis={"title": "slot", "categoryorder": "category descending"}, meta={"utilisation": use})
    return fig


def telemetry_figure(path: Path) -> go.Figure | None:
    """GPU utilisation and memory over time from the driver's devices.csv (None without it)."""
    try:
        with path.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    except FileNotFoundError:
        return None
    if not rows or "time" not in rows[0]:
        return None
    traces = []
    for index in sorted({r.get("index", "") for r in rows}):
        mine = [r for r in rows if r.get("index", "") == index]
        # Optuna's trial times are naive local time: show the samples the same way
        when = [datetime.fromtimestamp(float(r["time"])).isoformat() for r in mine]
        traces.append(go.Scatter(x=when, y=[_number(r.get("util")) for r in mine], name=f"GPU {index} util %"))
        traces.append(go.Scatter(x=when, y=[_number(r.get("mem_used_mb")) for r in mine], yaxis="y2",
                                 name=f"GPU {index} memory MB", line={"dash": "dot"}))
    fig = go.Figure(traces)
    fig.update_layout(**LAYOUT, title="GPU telemetry (devices.csv)", xaxis={"type": "date"},
                      yaxis={"title": "utilisation %", "range": [0, 100]},
                      yaxis2={"title": "memory MB", "overlaying": "y", "side": "right"},
                      meta={"samples": len(rows)})
    return fig


def _number(cell: str | None) -> float | None:
    try:
        return float(cell) if cell not in (None, "") else None
    except ValueError:
        return None


# ------------------------------------------------------------------ 6-8: trusting the IC


def overfit_figure(data: StudyData) -> go.Figure:
    rows = [(t.number, t.user_attrs.get("val_ic"), t.user_attrs.get("test_ic")) for t in data.finished(TrialState.COMPLETE)]
    rows = [r for r in rows if _finite(r[1]) and _finite(r[2])]
    if not rows:
        return _empty("no complete trial has both val_ic and test_ic")
    numbers, val, test = (np.array(c) for c in zip(*rows))
    traces = [go.Scatter(x=val, y=test, mode="markers", customdata=numbers, name="trials",
                         marker={"size": 6, "opacity": 0.6},
                         hovertemplate="trial %{customdata}<br>val %{x:.4f} test %{y:.4f}<extra></extra>")]
    if data.best is not None and data.best.number in set(numbers.tolist()):
        k = int(np.flatnonzero(numbers == data.best.number)[0])
        traces.append(go.Scatter(x=[val[k]], y=[test[k]], mode="markers", name=f"best (trial {data.best.number})",
                                 marker={"size": 14, "symbol": "star", "color": "#d62728"}))
    lo, hi = float(min(val.min(), test.min())), float(max(val.max(), test.max()))
    traces.append(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="test = valid",
                             line={"dash": "dash", "color": "#7f7f7f"}))
    corr = float(np.corrcoef(val, test)[0, 1]) if len(val) > 2 and val.std() > 0 and test.std() > 0 else None
    title = f"{len(val)} complete trials; mean test - valid {float((test - val).mean()):+.4f}"
    title += f"; correlation {corr:.2f}" if corr is not None else ""
    fig = go.Figure(traces)
    fig.update_layout(**LAYOUT, title=title, xaxis_title="validation IC", yaxis_title="test IC",
                      meta={"complete": len(val), "correlation": corr})
    return fig


def daily_figure(data: StudyData) -> go.Figure:
    from sweeper.results import daily_ic_file, read_daily

    if data.best is None:
        return _empty("no complete trial yet")
    traces, days = [], {}
    colors = {"valid": "#1f77b4", "test": "#ff7f0e"}
    for split in ("valid", "test"):
        daily = read_daily(daily_ic_file(data.run_dir, data.best.number, split))
        if daily is None:
            continue
        days[split] = len(daily["ic"])
        dates = daily["date"].tolist() if "date" in daily else list(range(len(daily["ic"])))
        traces.append(go.Bar(x=dates, y=daily["ic"], name=f"daily IC ({split})", marker_color=colors[split],
                             opacity=0.45))
        traces.append(go.Scatter(x=dates, y=np.nancumsum(daily["ic"]), name=f"cumulative IC ({split})",
                                 yaxis="y2", line={"color": colors[split], "width": 2}))
    if not traces:
        return _empty(f"trial {data.best.number} has no daily IC files in {data.run_dir / 'trials'}")
    fig = go.Figure(traces)
    fig.update_layout(**LAYOUT, title=f"trial {data.best.number}: daily IC (bars) and cumulative IC (lines)",
                      xaxis={"type": "date"}, yaxis={"title": "daily IC"}, bargap=0,
                      yaxis2={"title": "cumulative IC", "overlaying": "y", "side": "right"},
                      meta={"trial": data.best.number, "days": days})
    return fig


def selection_figure(data: StudyData) -> go.Figure:
    """Histogram of the trials' mean validation IC with the signal-free bar, the best
    and the deflated IC marked; ``layout.meta`` is selection_summary itself."""
    from sweeper.selection import selection_summary

    if data.best is None or data.best.number not in data.daily_valid:
        return _empty("selection bias unavailable: the best trial has no daily_ic_valid.csv")
    summary = selection_summary(data.daily_valid, data.best.number)
    means = [float(np.nanmean(v)) for v in data.daily_valid.values() if np.isfinite(v).any()]
    fig = go.Figure(go.Histogram(x=means, nbinsx=min(40, max(5, len(means) // 3)), name="trials",
                                 marker_color="#9ecae1"))
    marks = [("expected_max_null_ic", "no-signal best", "#d62728"), ("best_val_ic", "best", "#1f77b4"),
             ("deflated_ic", "deflated", "#2ca02c")]
    for key, label, color in marks:
        if summary.get(key) is not None:
            fig.add_vline(x=summary[key], line={"color": color, "dash": "dash"},
                          annotation={"text": f"{label} {summary[key]:.4f}", "textangle": -90})
    p = summary.get("p_fluke")
    fig.update_layout(**LAYOUT, title=f"{summary['n_trials']} trials; P(best IC is a fluke) "
                      + (f"{p:.1%}" if p is not None else "-"), xaxis_title="mean daily validation IC",
                      yaxis_title="trials", meta={"selection": summary})
    return fig


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _empty(message: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(**{**LAYOUT, "height": 200}, xaxis={"visible": False}, yaxis={"visible": False},
                      annotations=[{"text": message, "showarrow": False, "font": {"size": 14}}],
                      meta={"empty": message})
    return fig


# ------------------------------------------------------------------ the page


def render_html(data: StudyData, figures: dict[str, go.Figure], oracle: dict[str, float] | None = None) -> str:
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    sections = []
    for name, fig in figures.items():
        payload = pio.to_json(fig, validate=False).replace("</", "<\\/")
        heading = TITLES.get(name, "5b. GPU telemetry")
        notes = "".join(f"<p>{html.escape(line)}</p>" for line in _notes(name, fig))
        sections.append(f'<section><h2>{heading}</h2>{notes}<div id="plot-{name}" class="plot"></div>'
                        f'<script type="application/json" id="fig-{name}" class="fig">{payload}</script></section>')
    return _PAGE.format(title=html.escape(f"sweeper report: {data.name}"), plotlyjs=get_plotlyjs(),
                        header="".join(f"<p>{html.escape(line)}</p>" for line in _header(data, oracle)),
                        sections="\n".join(sections))


def _header(data: StudyData, oracle: dict[str, float] | None) -> list[str]:
    counts = {s.name.lower(): sum(t.state == s for t in data.trials) for s in TrialState}
    lines = [f"{len(data.trials)} trials: " + ", ".join(f"{k} {v}" for k, v in counts.items() if v),
             f"generated {data.now:%Y-%m-%d %H:%M:%S} from {data.run_dir}"]
    if data.best is not None:
        ua = data.best.user_attrs
        line = f"best: trial {data.best.number}, {data.metric} {data.best.value:.4f}"
        for split, key in (("valid", "val_ic"), ("test", "test_ic")):
            if _finite(ua.get(key)):
                line += f", {split} IC {ua[key]:.4f}"
                if oracle and oracle.get(split):
                    line += f" ({ua[key] / oracle[split]:.0%} of the oracle {oracle[split]:.4f})"
        lines.append(line)
    return lines


def _notes(name: str, fig: go.Figure) -> list[str]:
    meta = fig.layout.meta or {}
    if name == "timeline" and "utilisation" in meta:
        use = meta["utilisation"]
        if use["fraction"] is None:
            return []
        per = ", ".join(f"{k} {v:.0%}" for k, v in use["per_slot"].items() if v is not None)
        runs = f" in {use['runs']} runs" if use["runs"] > 1 else ""
        return [f"Utilisation {use['fraction']:.1%}: busy {use['busy_s']:.0f} s of {use['capacity_s']:.0f} "
                f"slot-seconds ({use['slots']} slots x {use['span_s']:.0f} s of wall time{runs}; the time "
                f"between runs is left out). Per slot: {per}."]
    if name == "selection" and "selection" in meta:
        from sweeper.view import selection_lines

        return [line.strip() for line in selection_lines(meta["selection"])] + [
            "The no-signal best is the median standard error of the trials' mean daily IC times the expected "
            "maximum of N standard normals (Bailey & Lopez de Prado); deflated IC = best - that. P(fluke) = 1 - "
            "the Deflated Sharpe Ratio of the best trial's daily ICs; PBO = probability of backtest overfitting "
            "(CSCV)."]
    return []


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; color: #222; }}
h1 {{ font-size: 1.5em; }} h2 {{ font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ddd; }}
p {{ margin: 0.3em 0; }} .plot {{ width: 100%; }}
</style>
<script type="text/javascript">{plotlyjs}</script>
</head><body>
<h1>{title}</h1>
{header}
{sections}
<script type="text/javascript">
document.querySelectorAll("script.fig").forEach(function (node) {{
  var fig = JSON.parse(node.textContent);
  Plotly.newPlot("plot-" + node.id.slice(4), fig.data, fig.layout, {{responsive: true, displaylogo: false}});
}});
</script>
</body></html>
"""
