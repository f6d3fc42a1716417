"""A panel of new data to score with a trained model (``sweeper predict --data``).

Unlike :func:`~sweeper.data.load.load_panel`, nothing is fitted on the new file and
nothing about it needs a label:

- the features are exactly the trial's, in its order;
- cross-sectional normalisations work per date as ever; ``robust_zscore`` applies the
  statistics the trial fitted on its own train split (never re-fitted on this file);
- every present (date, asset) row is a sample, with its label when the file has one
  (NaN otherwise: "today's" signal has no return yet);
- the splits are ``all`` (every date with a full lookback window, so the file needs only
  ``lookback - 1`` dates of history before the first date to score) and the study's
  train / valid / test date ranges, matched by date."""

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from sweeper.config import DataConfig
from sweeper.data.build import in_memory, scatter
from sweeper.data.columns import row_codes, user_day
from sweeper.data.normalize import NormStats, normalize_features
from sweeper.data.panel import Panel
from sweeper.data.parquet import file_fingerprint, read_scoring_columns
from sweeper.errors import DataError


def scoring_panel(cfg: DataConfig, path: str | Path, features: list[str], stats: NormStats | None,
                  split_dates: dict[str, list[str]] | None = None) -> Panel:
    """The panel of ``path`` (see the module docstring); ``stats`` from ``fit_stats``."""
    path = Path(path)
    if len((cols := read_scoring_columns(path, cfg, features)).label) == 0:
        raise DataError(f"{path}: no rows to score")
    if cfg.feature_norm == "robust_zscore" and (stats is None or stats.get("median") is None):
        raise DataError(f"{path}: robust_zscore needs the trial's fitted statistics, and none were given")
    codes = row_codes(cols)
    raw_X, y_raw, present = scatter(cols, codes, [(0, cols.features)], in_memory)
    mask = torch.from_numpy(present)
    X = normalize_features(torch.from_numpy(raw_X), mask, cfg.feature_norm, (0, 0), stats)
    y = torch.where(mask, torch.zeros(mask.shape), torch.full(mask.shape, float("nan")))
    dates = codes.dates
    splits = {"all": (min(cfg.lookback - 1, len(dates)), len(dates)),
              **{name: date_range(dates, days, cfg.lookback) for name, days in (split_dates or {}).items()}}
    selection = {"date": cols.date_col, "asset": cols.asset_col, "label": cols.label_col,
                 "features": features}
    return Panel(X=X, y=y, y_raw=torch.from_numpy(y_raw), mask=mask, dates=dates, assets=codes.assets,
                 features=list(features), splits=splits, lookback=cfg.lookback, oracle_ic=None,
                 source=str(path), fingerprint=file_fingerprint(path, selection), norm_stats=stats)


def date_range(dates: np.ndarray, days: Sequence[str | None], lookback: int,
               where: str = "date") -> tuple[int, int]:
    """``[start, stop)`` of the dates within the inclusive ``[first, last]`` days (an open end
    when one is None), never before ``lookback - 1`` (a target needs a full window)."""
    if not days:
        return (0, 0)
    first, last = days
    start = 0 if first is None else int(np.searchsorted(dates, user_day(first, where), side="left"))
    stop = len(dates) if last is None else int(np.searchsorted(dates, user_day(last, where, True), "right"))
    start = max(start, lookback - 1)
    return (start, max(stop, start))


def own_scoring_panel(panel: Panel) -> Panel:
    """The panel with every present row scoreable (unknown labels stay NaN in y_raw) and
    an ``all`` split: every date with a full lookback window."""
    y = torch.where(panel.mask & ~torch.isfinite(panel.y), torch.zeros_like(panel.y), panel.y)
    splits = {**panel.splits, "all": (panel.lookback - 1, len(panel.dates))}
    return dataclasses.replace(panel, y=y, splits=splits, _cache={})
