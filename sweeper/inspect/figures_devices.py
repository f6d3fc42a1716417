"""Report figure 5, the devices: trials per slot over time with the slots' utilisation,
and (5b) GPU telemetry from the driver's ``devices.csv`` when the sweep had GPUs."""

import csv
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from optuna.trial import FrozenTrial, TrialState

from sweeper.inspect.figures_base import LAYOUT, STATE_COLORS, TWO_AXES, StudyData

IDLE_GAP = timedelta(minutes=5)  # no trial running for longer than this: the sweep was stopped
Spans = dict[str, list[tuple[datetime, datetime, FrozenTrial]]]  # slot -> (start, end, trial)


def _spans(data: StudyData) -> Spans:
    """Slot -> (start, end, trial), for every trial that started on a known slot."""
    hosts = len({t.user_attrs.get("host") for t in data.trials if "device" in t.user_attrs})
    spans: Spans = {}
    for t in data.trials:
        if (device := t.user_attrs.get("device")) is None or t.datetime_start is None:
            continue
        slot = f"{t.user_attrs.get('host')}/{device}" if hosts > 1 else str(device)
        if (end := t.datetime_complete or (data.now if t.state == TrialState.RUNNING else None)) is not None:
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


def _windows(spans: Spans) -> list[tuple[datetime, datetime, set[str]]]:
    """The stretches of wall time a sweep ran, each with the slots it used: one per
    ``sweeper run`` (its trials' first start to last end, by their driver_id); trials
    without one are joined unless no trial ran for over IDLE_GAP."""
    runs: dict[str | None, list[tuple[str, datetime, datetime]]] = {}  # by driver_id
    for slot, rows in spans.items():
        for s, e, t in rows:
            runs.setdefault(t.user_attrs.get("driver_id"), []).append((slot, s, e))
    windows = []
    for driver, spans_of_run in runs.items():
        cuts = _union([(s, e) for _, s, e in spans_of_run], IDLE_GAP) if driver is None else \
            [[min(s for _, s, _ in spans_of_run), max(e for _, _, e in spans_of_run)]]
        windows += [(a, b, {slot for slot, s, _ in spans_of_run if a <= s <= b}) for a, b in cuts]
    return windows


def utilisation(data: StudyData) -> dict[str, Any]:
    """busy / (slots x wall span), summed over sweeper runs: busy is the time each slot
    held a trial; a run's capacity is its slots times its wall span (see _windows), so
    the hours between two runs of a resumed study count for neither."""
    if not (spans := _spans(data)):
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
    spans, use = _spans(data), utilisation(data)
    traces = []
    for state in TrialState:
        rows = [(slot, s, e, t) for slot, items in spans.items() for s, e, t in items if t.state == state]
        if not rows:
            continue
        traces.append(go.Bar(
            y=[r[0] for r in rows], base=[r[1].isoformat() for r in rows],
            x=[(r[2] - r[1]).total_seconds() * 1000 for r in rows],
            customdata=[[r[3].number, _sharing(r[3])] for r in rows],
            orientation="h", name=state.name.lower(), marker_color=STATE_COLORS.get(state.name),
            hovertemplate="trial %{customdata[0]}<br>%{base} for %{x:.0f} ms%{customdata[1]}<extra></extra>"))
    title = (f"{use['slots']} slots, utilisation {frac:.1%}" if (frac := use["fraction"]) is not None
             else "no trial has started on a slot")
    return go.Figure(traces).update_layout(
        **LAYOUT, title=title, barmode="overlay", xaxis={"type": "date", "title": "time"},
        yaxis={"title": "slot", "categoryorder": "category descending"}, meta={"utilisation": use})


def _sharing(t: FrozenTrial) -> str:
    """A packed trial's GPU (trials_per_gpu: auto): the trials beside it, its allotment and peak."""
    if (ua := t.user_attrs).get("gpu_mem_allotted_mb") is None:
        return ""
    peak = ua.get("peak_mem_mb")
    return (f"<br>GPU shared with {ua.get('gpu_shared_with', 0)} other trial(s); allotted "
            f"{ua['gpu_mem_allotted_mb']:.0f} MB, peak {'?' if peak is None else f'{peak:.0f}'} MB")


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
        traces.append(go.Scatter(x=when, y=[_number(r.get("util")) for r in mine],
                                 name=f"GPU {index} util %"))
        traces.append(go.Scatter(x=when, y=[_number(r.get("mem_used_mb")) for r in mine], yaxis="y2",
                                 name=f"GPU {index} memory MB", line={"dash": "dot"}))
    return go.Figure(traces).update_layout(
        **TWO_AXES, title="GPU telemetry (devices.csv)", xaxis={"type": "date"},
        yaxis={"title": "utilisation %", "range": [0, 100]},
        yaxis2={"title": "memory MB", "overlaying": "y", "side": "right"}, meta={"samples": len(rows)})


def _number(cell: str | None) -> float | None:
    try:
        return float(cell) if cell not in (None, "") else None
    except ValueError:
        return None
