"""Report figure 11, IC through time: a year x month heatmap of mean daily IC, one panel per split (valid,
test) for the best trial and, when its daily IC files exist, for the LightGBM baseline. A model whose IC comes
from one good year shows it here, where the mean over the split hides it.

``layout.meta``: ``months`` (``{"best"|"baseline": {split: {year: [12 means, null for a month without a
day]}}}``), ``ic_by_year`` (the best trial's, as ``best --json`` has it) and, with ``data.group_col``,
``group_neutral`` and ``group_col``."""

import math
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sweeper.inspect.figures_base import LAYOUT, StudyData, empty
from sweeper.inspect.ic_views import daily_frames, ic_by_year_report
from sweeper.quant.ic_time import ic_by_month
from sweeper.store.layout import SPLITS, baseline_files, trial_files
from sweeper.store.studies import no_best

MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
ROW_HEIGHT = 28  # pixels per year row, so a long split stays readable


def month_heatmap(daily: pd.DataFrame, name: str) -> tuple[go.Heatmap, dict[str, list[float | None]]]:
    """The heatmap trace of any daily IC frame (``date, ic, ...``: a trial's, the baseline's)
    and the year x month table it draws (``{year: [12 means, None for a month without a day]}``)."""
    table = ic_by_month(daily)
    rows = {str(y): [None if math.isnan(v) else v for v in row]
            for y, row in zip(table.index, table.to_numpy().tolist())}
    text = [["" if v is None else f"{v:.3f}" for v in row] for row in rows.values()]
    trace = go.Heatmap(z=list(rows.values()), x=list(MONTHS), y=list(rows), text=text,
                       texttemplate="%{text}", coloraxis="coloraxis", name=name,
                       hovertemplate=name + " %{y} %{x}: mean daily IC %{z:.4f}<extra></extra>")
    return trace, rows


def ic_time_figure(data: StudyData) -> go.Figure:
    if data.best is None:
        return empty(no_best(data.study))
    panels = {"best": daily_frames(trial_files(data.run_dir, data.best.number))}
    if baseline := daily_frames(baseline_files(data.run_dir)):
        panels["baseline"] = baseline
    if not panels["best"]:
        return empty(f"trial {data.best.number} has no daily IC files in {data.run_dir / 'trials'}")
    who = {"best": f"trial {data.best.number}", "baseline": "LightGBM baseline"}
    titles = [f"{who[k]}: {split}" for k in panels for split in SPLITS]
    fig = make_subplots(rows=len(panels), cols=len(SPLITS), subplot_titles=titles,
                        horizontal_spacing=0.08, vertical_spacing=0.12)
    months: dict[str, dict[str, Any]] = {}
    for row, (kind, frames) in enumerate(panels.items(), start=1):
        months[kind] = {}
        for col, split in enumerate(SPLITS, start=1):
            if split in frames:
                trace, months[kind][split] = month_heatmap(frames[split], f"{who[kind]} {split}")
                fig.add_trace(trace, row=row, col=col)
    years = max([1, *(len(table) for tables in months.values() for table in tables.values())])
    meta: dict[str, Any] = {"trial": data.best.number, "months": months,
                            "ic_by_year": ic_by_year_report(panels["best"]), **data.group_neutral}
    height = max(int(LAYOUT["height"]), len(panels) * (120 + ROW_HEIGHT * years))
    fig.update_layout(**{**LAYOUT, "height": height}, meta=meta,
                      title=f"mean daily IC by year and month (trial {data.best.number}"
                      + (" and the LightGBM baseline)" if "baseline" in panels else ")"),
                      coloraxis={"colorscale": "RdBu", "cmid": 0, "colorbar": {"title": "IC"}})
    return fig.update_yaxes(type="category", autorange="reversed")
