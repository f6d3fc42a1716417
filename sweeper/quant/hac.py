"""Newey-West (HAC) standard errors of a mean, for daily series whose days overlap.

An h-day label makes neighbouring labels share h-1 days of returns, so the daily ICs of a model
whose predictions persist are autocorrelated up to lag h-1, and std/sqrt(T) understates the
uncertainty of the mean IC by up to about sqrt(h). The Newey-West long-run variance with Bartlett
weights and ``lag = h - 1`` corrects for that:

    LRV = s^2 * (1 + 2 * sum_{k=1..lag} (1 - k/(lag+1)) * rho_k)

where ``s^2`` is the variance with ddof=1 and ``rho_k`` the lag-k autocorrelation (sums over the T-k pairs
over T times the lag-0 moment, the usual biased estimate). With ``lag = 0`` it is ``s^2``: a 1-day label
keeps the plain standard error. NaN days are dropped, the rest taken as consecutive."""

import math
from collections.abc import Sequence

import numpy as np


def lag_for_horizon(horizon: int) -> int:
    """The Newey-West lag for an ``horizon``-day label: ``horizon - 1`` (0 for horizon 0 or 1)."""
    return max(int(horizon) - 1, 0)


def variance_ratio(x: np.ndarray, lag: int) -> float:
    """``LRV / s^2 = 1 + 2 sum w_k rho_k``, floored at 1 (a negative autocorrelation is not taken as
    extra information); NaN for fewer than 2 finite days or no spread."""
    if len(v := finite(x)) < 2:
        return math.nan
    centred = v - v.mean()
    if (m0 := float(np.dot(centred, centred))) <= 0:
        return math.nan
    ratio = 1.0
    for k in range(1, min(lag, len(v) - 1) + 1):
        ratio += 2.0 * (1.0 - k / (lag + 1)) * (float(np.dot(centred[k:], centred[:-k])) / m0)
    return max(ratio, 1.0)


def hac_standard_error(x: np.ndarray, lag: int) -> float:
    """Newey-West standard error of the mean of ``x``: ``sqrt(s^2 * ratio / T)``."""
    v = finite(x)
    if not math.isfinite(ratio := variance_ratio(v, lag)):
        return float(np.std(v, ddof=1)) / math.sqrt(len(v)) if len(v) >= 2 else math.nan
    return math.sqrt(float(np.var(v, ddof=1)) * ratio / len(v))


def effective_days(x: np.ndarray, lag: int) -> float:
    """How many independent days the series is worth: ``T / ratio`` (T itself with lag 0)."""
    v = finite(x)
    return len(v) / ratio if math.isfinite(ratio := variance_ratio(v, lag)) else float(len(v))


def finite(x: np.ndarray | Sequence[float]) -> np.ndarray:
    """The finite values of ``x``, flattened, as float64."""
    v = np.asarray(x, dtype=np.float64).ravel()
    return v[np.isfinite(v)]
