"""The long-short view of a prediction frame (``date, asset, pred, label``, as ``sweeper predict``
writes it): quantile buckets, the top-minus-bottom return, its annualised return, Sharpe ratio,
drawdown and the top bucket's turnover. Every definition is in docs/inspect.md ("The long-short
view"), with ``h`` the label horizon and ``q`` the number of buckets (``report.quantiles``).

Gross figures: equal weights, no costs, no borrow, labels as given."""

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from sweeper.plain import plain

PERIODS_PER_YEAR = 252
SUMMARY_KEYS = ("long_short_ann_return", "long_short_sharpe", "long_short_max_drawdown", "top_turnover",
                "n_periods")


@dataclass
class LongShort:
    """The long-short series of one frame and what it was computed with."""

    dates: np.ndarray          # [P] the dates used
    ls: np.ndarray             # [P] top - bottom mean label
    buckets: np.ndarray        # [P, q] mean label per bucket (bottom first)
    turnover: np.ndarray       # [P-1] 1 - overlap of consecutive top buckets
    horizon: int
    quantiles: int

    def summary(self) -> dict[str, Any]:
        """The figures of docs/inspect.md; None where undefined (JSON-safe)."""
        step = max(int(self.horizon), 1)
        mean = float(self.ls.mean()) if len(self.ls) else math.nan
        std = float(self.ls.std(ddof=1)) if len(self.ls) >= 2 else math.nan
        buckets = self.buckets.mean(axis=0) if len(self.buckets) else np.full(self.quantiles, np.nan)
        return {"long_short_ann_return": plain(mean * PERIODS_PER_YEAR / step),
                "long_short_sharpe": plain(mean / std * math.sqrt(PERIODS_PER_YEAR / step)
                                           if std > 0 else math.nan),
                "long_short_max_drawdown": plain(max_drawdown(self.ls)),
                "top_turnover": plain(float(self.turnover.mean()) if len(self.turnover) else math.nan),
                "n_periods": len(self.ls), "bucket_mean_label": [plain(float(v)) for v in buckets],
                "quantiles": self.quantiles, "horizon": self.horizon}


def long_short(frame: pd.DataFrame, horizon: int, quantiles: int = 5) -> LongShort:
    """The long-short series of ``frame`` (docs/inspect.md has every definition)."""
    if quantiles < 2:
        raise ValueError(f"quantiles must be >= 2, got {quantiles}")
    # rows with a finite pred and label on every h-th date that has >= 2q of them, in frame order
    x, y = (pd.to_numeric(frame[c], errors="coerce").to_numpy(np.float64) for c in ("pred", "label"))
    rows = frame[np.isfinite(x) & np.isfinite(y) & frame["date"].notna().to_numpy()]
    per_date = rows.groupby("date", sort=True).size()
    used = per_date.index[per_date.to_numpy() >= 2 * quantiles][::max(int(horizon), 1)]
    if (rows := rows[rows["date"].isin(used)]).empty:
        empty = np.zeros(0)
        return LongShort(np.array([], dtype=object), empty, np.zeros((0, quantiles)), empty,
                         horizon, quantiles)
    period, dates = pd.factorize(rows["date"], sort=True)
    bucket = _buckets(rows, period, quantiles)
    key = period * quantiles + bucket
    sums = np.bincount(key, rows["label"].to_numpy(np.float64), len(dates) * quantiles).reshape(-1, quantiles)
    counts = np.bincount(key, minlength=len(dates) * quantiles).reshape(-1, quantiles)
    means = sums / counts  # every bucket of a used date holds at least 2 rows
    codes, _ = pd.factorize(rows["asset"])
    top = bucket == quantiles - 1
    return LongShort(np.asarray(dates), means[:, -1] - means[:, 0], means,
                     _turnover(period[top], codes[top], len(dates)), horizon, quantiles)


def _buckets(rows: pd.DataFrame, period: np.ndarray, quantiles: int) -> np.ndarray:
    """0-based bucket of each row: ``pd.qcut`` of its ``rank(method="first")`` within its date.

    A date with n rows has the ranks 1..n, so its buckets are those of ``pd.qcut(1..n)``:
    one qcut per distinct n (pandas' own edges, float rounding included), then a lookup."""
    by_date = pd.Series(rows["pred"].to_numpy(np.float64)).groupby(period)
    ranks = by_date.rank(method="first").to_numpy().astype(np.int64)
    sizes = np.bincount(period)[period]
    out = np.empty(len(rows), dtype=np.int64)
    for n in np.unique(sizes):
        table = pd.qcut(np.arange(1, n + 1, dtype=np.float64), quantiles, labels=False)
        at = sizes == n
        out[at] = np.asarray(table, dtype=np.int64)[ranks[at] - 1]
    return out


def _turnover(period: np.ndarray, codes: np.ndarray, n_periods: int) -> np.ndarray:
    """[P-1]: 1 - |top_t & top_{t-1}| / |top_t| for t = 1..P-1."""
    if n_periods < 2:
        return np.zeros(0)
    n_assets = int(codes.max()) + 1
    key = period.astype(np.int64) * n_assets + codes
    stayed = np.isin(key - n_assets, key) & (period > 0)
    size = np.bincount(period, minlength=n_periods).astype(np.float64)
    return (1.0 - np.bincount(period, stayed.astype(np.float64), n_periods) / size)[1:]


def max_drawdown(ls: np.ndarray) -> float:
    """Largest fall of ``cumsum(ls)`` below its running peak, the curve starting at 0; NaN if empty."""
    if len(ls) == 0:
        return math.nan
    curve = np.concatenate([[0.0], np.cumsum(np.asarray(ls, dtype=np.float64))])
    return float((np.maximum.accumulate(curve) - curve).max())
