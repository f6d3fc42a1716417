"""What a study records of its panel, fixed for the whole study: written to the study's
attributes by the parent, read back by the view and ``inspect``."""
from __future__ import annotations

from dataclasses import dataclass, field

from sweeper import config as C
from sweeper.data.folds import fold_layout, fold_spans
from sweeper.data.panel import Panel
from sweeper.validation.grid import RunGrid


@dataclass(frozen=True)
class PanelSummary:
    """What the study records of the panel: it is fixed for the whole study (the split uses
    the widest lookback, horizon and embargo the search space allows, ``data.split.*``)."""

    source: str
    fingerprint: str
    features: list[str]
    split_dates: dict[str, list[str]]  # {split: [first, last]} target dates as ISO days
    oracle_ic: dict[str, float] | None
    # walk-forward folds' [{"train": [first, last], "valid": [first, last]}] (empty: one fold)
    folds: list[dict[str, list[str]]] = field(default_factory=list)

    @classmethod
    def of(cls, panel: Panel, cfg: C.SweeperConfig | None = None) -> PanelSummary:
        """``cfg``: the study's, whose walk-forward folds are laid out on the panel here (the
        check that they fit: a ConfigError naming the keys before anything is written)."""
        folds = []
        if cfg is not None and RunGrid.of(cfg).folded:
            folds = fold_spans(panel, fold_layout(panel, cfg))
        return cls(source=panel.source, fingerprint=panel.fingerprint, features=list(panel.features),
                   split_dates=panel.split_dates(), oracle_ic=panel.oracle_ic, folds=folds)
