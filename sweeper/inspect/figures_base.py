"""What every figure of the report shares: the study data they read (loaded once),
the plotly layout, the colour of each trial state and the placeholder figure."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
import plotly.graph_objects as go
from optuna.trial import FrozenTrial

from sweeper.baseline.compare import finite as finite  # the report's figures read it from here
from sweeper.validation import contract as K

if TYPE_CHECKING:
    import pandas as pd

    from sweeper.quant.portfolio import LongShort

STATE_COLORS = {"COMPLETE": "#1f77b4", "PRUNED": "#ff7f0e", "FAIL": "#d62728", "RUNNING": "#2ca02c",
                "WAITING": "#7f7f7f"}
SPLIT_COLORS = {"valid": "#1f77b4", "test": "#ff7f0e"}
MARGIN = {"l": 60, "r": 30, "t": 60, "b": 50}
LAYOUT: dict[str, Any] = {"height": 420, "margin": MARGIN}
# a figure with a right-hand axis: its labels and title need a right margin, and the legend, which
# plotly puts over that margin, goes under the plot so that it hides neither
TWO_AXES = {**LAYOUT, "margin": {**MARGIN, "r": 70, "b": 100},
            "legend": {"orientation": "h", "x": 0, "y": -0.2, "yanchor": "top"}}


@dataclass
class StudyData:
    """Everything the figures read, loaded once."""

    name: str
    metric: str  # what a trial's value is called (lcb(val_ic) under validation.aggregate: lcb)
    maximize: bool
    trials: list[FrozenTrial]
    run_dir: Path
    study: optuna.Study
    best: FrozenTrial | None = None
    daily_valid: dict[int, pd.Series] = field(default_factory=dict)  # trial -> daily valid IC by date
    now: datetime = field(default_factory=datetime.now)
    horizons: dict[int, int] | int = 1        # each trial's label horizon (Newey-West lags)
    long_short: dict[str, LongShort] = field(default_factory=dict)  # split -> the best trial's view
    long_short_note: str | None = None       # why there is no long-short view
    # with data.group_col: best --json's group_neutral (and group_col or the reason it is missing)
    group_neutral: dict[str, Any] = field(default_factory=dict)
    epoch_metric: str = "val_ic"  # what each epoch reports (curves), where metric may be an aggregate of it

    @property
    def folded(self) -> bool:
        """The study validates on walk-forward folds (:func:`sweeper.validation.contract.folded`)."""
        return K.folded(self.study.user_attrs)


def empty(message: str) -> go.Figure:
    """A small figure that says why there is nothing to plot (its ``layout.meta.empty``)."""
    return go.Figure().update_layout(
        **{**LAYOUT, "height": 200}, xaxis={"visible": False}, yaxis={"visible": False},
        annotations=[{"text": message, "showarrow": False, "font": {"size": 14}}], meta={"empty": message})
