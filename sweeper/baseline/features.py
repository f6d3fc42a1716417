"""The baseline's design matrix: for a split's rows exactly (the trials' sample index: dates in the split,
row present, finite training label), each row's features at its date, then at ``lags`` earlier dates, read
from the normalised ``[dates, assets, features]`` array the trials' windows are gathered from (missing
values already 0, as the trials see them). A lag before the panel's first date is NaN (LightGBM's missing
value); the study's pinned lookback makes that rare, since the train split starts at ``lookback - 1``.

Too many train rows for ``baseline.max_rows``, or for a quarter of the memory available now (the design
matrix, LightGBM's binned copy and the valid split's matrix side by side), keep every k-th train date (whole
dates, so each kept date's cross-section is complete) and say so in :attr:`Design.subsampled`."""

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from sweeper.data.panel import Panel


@dataclass
class Design:
    """One split's rows and their features."""

    t: np.ndarray            # [S] int64 date index into the panel
    i: np.ndarray            # [S] int64 asset index
    X: np.ndarray            # [S, F * (lags + 1)] float32
    y: np.ndarray            # [S] float32 normalised training label (what the trials fit)
    y_raw: np.ndarray        # [S] float32 raw label (what IC is scored on)
    names: list[str]         # column names: feature, then feature@lag1, ...
    # {dates_kept, dates_total, rows_kept, rows_total, limit, by} when subsampled
    subsampled: dict[str, Any] | None = None


def split_rows(panel: Panel, split: str) -> tuple[np.ndarray, np.ndarray]:
    """The split's ``(t, i)`` rows: exactly the rows the trials train on or are scored on."""
    idx = panel.sample_index(split).cpu().numpy()
    return idx[:, 0].astype(np.int64), idx[:, 1].astype(np.int64)


def memory_rows(columns: int, share: float = 0.25) -> int | None:
    """How many float32 rows of ``columns`` fit, three copies side by side, in ``share`` of the
    memory available now (``MemAvailable``); None where that is unknown (not Linux)."""
    try:
        with open("/proc/meminfo") as fh:
            kib = next(int(line.split()[1]) for line in fh if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None
    return max(1, int(kib * 1024 * share) // (max(columns, 1) * 4 * 3))


def every_kth_date(t: np.ndarray, max_rows: int, by: str) -> tuple[np.ndarray, dict[str, Any] | None]:
    """A row mask keeping every k-th date of ``t`` (sorted), the smallest k that brings the rows to
    at most ``max_rows`` (the limit, set ``by``); all rows and None when they already fit."""
    if len(t) <= max_rows:
        return np.ones(len(t), dtype=bool), None
    dates = np.unique(t)
    step = max(2, math.ceil(len(t) / max_rows))
    while int(np.isin(t, kept := dates[::step]).sum()) > max_rows and step < len(dates):
        step += 1
    keep = np.isin(t, kept)
    return keep, {"dates_kept": len(kept), "dates_total": len(dates), "rows_total": len(t),
                  "rows_kept": int(keep.sum()), "limit": max_rows, "by": by}


def design(panel: Panel, split: str, lags: int, max_rows: int | None = None) -> Design:
    """The design matrix of ``split``'s rows; ``max_rows`` subsamples them by dates."""
    t, i = split_rows(panel, split)
    X = panel.X.cpu().numpy()
    F = X.shape[2]
    subsampled = None
    if max_rows is not None:
        fits = memory_rows(F * (lags + 1))
        limit, by = (max_rows, "baseline.max_rows") if fits is None or fits >= max_rows else (fits, "memory")
        keep, subsampled = every_kth_date(t, limit, by)
        t, i = t[keep], i[keep]
    out = np.full((len(t), F * (lags + 1)), np.nan, dtype=np.float32)
    for k in range(lags + 1):
        inside = t >= k  # a lag before the panel's first date stays NaN
        out[inside, k * F:(k + 1) * F] = X[t[inside] - k, i[inside]]
    y, y_raw = (values.cpu().numpy()[t, i] for values in (panel.y, panel.y_raw))
    names = [f if k == 0 else f"{f}@lag{k}" for k in range(lags + 1) for f in panel.features]
    return Design(t=t, i=i, X=out, y=y, y_raw=y_raw, names=names, subsampled=subsampled)
