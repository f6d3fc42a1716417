"""Report figure: the cumulative daily IC of the best trial and of the LightGBM baseline
(:mod:`sweeper.baseline`), valid and test, on the dates each was scored on."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from sweeper.baseline.compare import baseline_daily
from sweeper.inspect.figures_base import LAYOUT, SPLIT_COLORS, StudyData, empty
from sweeper.inspect.results import read_daily
from sweeper.store.layout import trial_files


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
