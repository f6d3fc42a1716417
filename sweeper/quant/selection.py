"""How much of the best trial's validation IC is luck: selection-bias statistics.

With N trials and no real signal, the best validation score is still high by chance. The statistics here treat
each trial's daily validation IC series as its "returns" (see docs/domain, "Choosing the best of many trials
inflates the result"). An h-day label makes neighbouring daily ICs overlap, so every standard error is
Newey-West with lag h-1 (:mod:`sweeper.quant.hac`), and trials are lined up by date, not by position.
:func:`selection_summary` gives all the figures for a finished study: :func:`null_max_ic`,
:func:`deflated_sharpe` and :func:`pbo` (Probability of Backtest Overfitting, CSCV).

Under walk-forward folds a trial's daily validation ICs are its folds' valid blocks end to end, each block
scored by that fold's model. :func:`selection_summary` then takes each trial's standard error from its fold
ICs (:func:`fold_standard_error`: the spread of the score from one period to the next, which the daily noise
within a block understates) and cuts PBO's blocks along the folds (:func:`fold_blocks`), so that no block
mixes two folds' models (docs/inspect.md, "Selection bias under walk-forward").

Only the standard library's ``NormalDist`` is needed (no scipy)."""

import itertools
import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist

import numpy as np
import pandas as pd

from sweeper.quant.hac import effective_days, finite, hac_standard_error, lag_for_horizon

EULER_GAMMA = 0.5772156649015329
_NORMAL = NormalDist()
_PBO_CHUNK = 2048  # combinations scored per step, bounds memory at ~chunk * n_trials floats
_PBO_COVERAGE = 0.9  # a trial enters PBO when it has a value on this share of the best trial's dates


def expected_max(n: int) -> float:
    """E[max of ``n`` iid standard normals] ~ (1-g)Phi^-1(1-1/n) + g Phi^-1(1-1/(n e)).

    1.58 for n=10, 2.53 for 100, 3.26 for 1000; 0 for a single trial (no selection).
    The cruder sqrt(2 ln n) overstates it by about 0.5 in that range."""
    if n < 1:
        raise ValueError(f"expected_max needs n >= 1 trials, got {n}")
    return 0.0 if n == 1 else ((1 - EULER_GAMMA) * _NORMAL.inv_cdf(1 - 1 / n)
                               + EULER_GAMMA * _NORMAL.inv_cdf(1 - 1 / (n * math.e)))


def null_max_ic(daily_ics: list[np.ndarray], lags: list[int] | None = None) -> float:
    """The mean IC the best of these N trials would reach with no signal: median SE * E[max_N].

    SE is each trial's Newey-West standard error of its mean IC with its ``lags`` entry (default 0: std(daily,
    ddof=1) / sqrt(T)). The median (not the mean) across trials keeps one degenerate trial, e.g. a diverged
    model with wild daily ICs, from inflating the bar. Every trial counts toward N (each one was a chance to
    get lucky) but only trials with >= 2 finite days give an SE. NaN if none does."""
    lags = lags if lags is not None else [0] * len(daily_ics)
    return _null_ic(list(map(hac_standard_error, daily_ics, lags)))


def _null_ic(errors: list[float]) -> float:
    """The median of the trials' finite standard errors times E[max_N], N = every trial (NaN: none)."""
    finite = [se for se in errors if math.isfinite(se)]
    return float(np.median(finite)) * expected_max(len(errors)) if finite else math.nan


def deflated_sharpe(daily_best: np.ndarray, sr_trials: list[float], n_trials: int, *,
                    null_ic: float | None = None, lag: int = 0) -> dict[str, float]:
    """Deflated Sharpe Ratio of the selected trial's daily ICs (Bailey & Lopez de Prado 2014).

    DSR = Phi((SR - SR0) sqrt(T'-1) / sqrt(1 - g3 SR + (g4-1)/4 SR^2)), SR0 = sd(sr_trials) E[max_N], where SR
    = mean/std(ddof=1) of the daily ICs (the ICIR), g3 their skew and g4 their (non-excess) kurtosis. T' is
    the number of days the series is worth once their overlap is counted: T / the Newey-West variance ratio
    with ``lag`` (T itself for lag 0). ``dsr`` is the probability that the true SR beats the best a
    signal-free search of ``n_trials`` would find; ``p_fluke = 1 - dsr``.

    ``deflated_ic`` = mean IC - ``null_ic``; without ``null_ic`` the best trial's own SE
    stands in for the trials' median SE (see :func:`null_max_ic`).
    Undefined values are NaN: fewer than 3 days, no spread, or ``n_trials`` > 1 with
    fewer than 2 finite ``sr_trials``. With ``n_trials == 1`` SR0 is 0 (nothing was selected)."""
    x = finite(daily_best)
    sr = _sharpe(x)
    spread = finite(sr_trials)  # SR0 is 0 when nothing was selected; a spread needs two trials
    sr0 = (0.0 if n_trials == 1 else math.nan if len(spread) < 2
           else float(np.std(spread, ddof=1)) * expected_max(n_trials))
    null_ic = hac_standard_error(x, lag) * expected_max(n_trials) if null_ic is None else null_ic
    mean_ic = float(x.mean()) if len(x) else math.nan
    dsr = _probabilistic_sharpe(x, sr, sr0, effective_days(x, lag))
    return {"sr": sr, "sr0": sr0, "dsr": dsr, "p_fluke": 1 - dsr, "deflated_ic": mean_ic - null_ic}


def _probabilistic_sharpe(x: np.ndarray, sr: float, sr0: float, days: float) -> float:
    if len(x) < 3 or days <= 1 or not (math.isfinite(sr) and math.isfinite(sr0)):
        return math.nan
    centred = x - x.mean()
    m2 = float(np.mean(centred**2))
    skew, kurt = float(np.mean(centred**3)) / m2**1.5, float(np.mean(centred**4)) / m2**2
    var = 1 - skew * sr + (kurt - 1) / 4 * sr**2
    return _NORMAL.cdf((sr - sr0) * math.sqrt(days - 1) / math.sqrt(var)) if var > 0 else math.nan


def pbo(matrix: np.ndarray, n_blocks: int = 16, blocks: list[np.ndarray] | None = None) -> float:
    """Probability of Backtest Overfitting of a T x N matrix of daily ICs (dates x trials).

    CSCV: cut the dates into ``n_blocks`` contiguous blocks (or take ``blocks``, lists of row positions, e.g.
    :func:`fold_blocks`; then ``n_blocks`` is their count); for every way of choosing half of them as
    in-sample, pick the trial with the best in-sample mean IC and rank its out-of-sample mean IC among all
    trials (average rank for ties). PBO is the share of splits where that rank is below the median, i.e.
    logit(rank / (N+1)) < 0; a rank exactly at the median counts one half, so that pure noise scores 0.5 on
    average. NaN days are left out of the means; a trial with no day in a half ranks last there."""
    if (m := np.asarray(matrix, dtype=np.float64)).ndim != 2 or m.shape[1] < 2:
        raise ValueError(f"pbo needs a [dates, trials] matrix with >= 2 trials, got shape {m.shape}")
    n_blocks = len(blocks) if blocks is not None else n_blocks
    if n_blocks < 2 or n_blocks % 2 or m.shape[0] < n_blocks:
        raise ValueError(f"pbo needs an even n_blocks >= 2 and at least that many dates; "
                         f"got {n_blocks} for {m.shape[0]}")
    finite = np.isfinite(m)
    blocks = blocks if blocks is not None else np.array_split(np.arange(len(m)), n_blocks)
    sums = np.stack([np.where(finite[b], m[b], 0.0).sum(0) for b in blocks])  # [S, N]
    counts = np.stack([finite[b].sum(0) for b in blocks]).astype(np.float64)
    combos = np.array(list(itertools.combinations(range(n_blocks), n_blocks // 2)))
    below = 0.0
    for start in range(0, len(combos), _PBO_CHUNK):
        chosen = np.zeros((len(combos[start:start + _PBO_CHUNK]), n_blocks))
        np.put_along_axis(chosen, combos[start:start + _PBO_CHUNK], 1.0, axis=1)
        below += _overfit_splits(chosen, sums, counts)
    return below / len(combos)


def _overfit_splits(in_sample: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> float:
    """How many of these splits (rows of a 0/1 block mask) rank the in-sample winner below the median."""
    is_mean = _safe_mean(in_sample @ sums, in_sample @ counts)
    oos_mean = _safe_mean((1 - in_sample) @ sums, (1 - in_sample) @ counts)
    score = np.take_along_axis(oos_mean, np.argmax(is_mean, axis=1)[:, None], axis=1)  # the winner's
    rank = (oos_mean < score).sum(1) + 1 + ((oos_mean == score).sum(1) - 1) / 2
    median = (oos_mean.shape[1] + 1) / 2
    return float((rank < median).sum() + 0.5 * (rank == median).sum())


def _safe_mean(total: np.ndarray, count: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / count, -np.inf)


def selection_summary(daily: Mapping[int, np.ndarray | pd.Series], best: int,
                      horizon: int | Mapping[int, int] = 1,
                      fold_ics: Mapping[int, Sequence[float]] | None = None,
                      folds: np.ndarray | None = None) -> dict[str, int | float | str | None]:
    """Selection-bias figures for a study whose trials have these daily validation ICs.

    ``daily`` maps trial number -> daily IC series (NaN days allowed): a ``pd.Series`` indexed by date, or an
    array (then its position is its date). Every series is lined up on the best trial's dates, so a trial
    scored on other dates is compared on the dates it shares with the best (and one that shares none adds only
    to N). ``horizon`` is the label horizon (one for all, or per trial): the Newey-West lag is horizon - 1.
    PBO takes the trials with a value on at least 90% of the best trial's dates and needs >= 2 of them and >=
    16 dates (4 blocks of 4); otherwise it is None. Every undefined figure is None, so the dict is JSON-safe.

    Walk-forward (``fold_ics``: trial number -> its fold ICs, ``fold_val_ic``): each trial's standard error is
    :func:`fold_standard_error` of its fold ICs (a trial with fewer than two, e.g. pruned in fold 1, still
    counts toward N), ``best_val_ic`` is the mean of the best's fold ICs and ``deflated_ic`` that less the
    no-signal best; the DSR still reads the best's daily ICs. ``folds`` (the fold of each of the best trial's
    dates) cuts PBO's blocks along the folds (:func:`fold_blocks`). Added keys: ``se_from`` ("folds"),
    ``best_val_ic_se``, ``n_folds`` (the best's) and ``pbo_blocks`` ("folds", or "dates" where the folds
    cannot be cut evenly)."""
    if best not in daily:
        raise KeyError(f"best trial {best} has no daily IC series")
    series = _align(daily, best)
    lags = {k: lag_for_horizon(horizon.get(k, 1) if isinstance(horizon, Mapping) else horizon)
            for k in series}
    null_ic = (null_max_ic(list(series.values()), [lags[k] for k in series]) if fold_ics is None
               else _null_ic([fold_standard_error(fold_ics.get(k, [])) for k in series]))
    blocks = fold_blocks(folds) if fold_ics is not None and folds is not None else None
    out = _daily_figures(series, best, null_ic, lags[best], blocks)
    if fold_ics is not None:
        out.update(_fold_figures(finite(fold_ics.get(best, [])), null_ic, blocks))
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}


def _daily_figures(series: dict[int, np.ndarray], best: int, null_ic: float, lag: int,
                   blocks: list[np.ndarray] | None) -> dict[str, int | float | str | None]:
    """The figures read from the daily ICs: the best's IC, its deflated IC and Sharpe, and PBO."""
    sr_trials = [_sharpe(finite(v)) for v in series.values()]
    stats = deflated_sharpe(series[best], sr_trials, len(series), null_ic=null_ic, lag=lag)
    best_ic = finite(series[best]).mean() if len(finite(series[best])) else math.nan
    # PBO: the trials with a value on _PBO_COVERAGE of the best's dates, >= 2 of them and >= 4 blocks
    need = _PBO_COVERAGE * np.isfinite(series[best]).sum()
    columns = [v for v in series.values() if np.isfinite(v).sum() >= need]
    n_blocks = len(blocks) if blocks is not None else min(16, (len(series[best]) // 4) // 2 * 2)
    return {"n_trials": len(series), "expected_max_null_ic": null_ic, "best_val_ic": float(best_ic),
            **{k: stats[k] for k in ("deflated_ic", "sr", "sr0", "dsr", "p_fluke")},
            "pbo": pbo(np.column_stack(columns), n_blocks=n_blocks, blocks=blocks)
            if len(columns) >= 2 and n_blocks >= 4 else None}


def fold_standard_error(fold_ics: Sequence[float] | np.ndarray) -> float:
    """std(ddof=1) / sqrt(k) of a trial's k finite fold ICs (its ``val_ic_se``); NaN for k < 2."""
    return float(np.std(x, ddof=1)) / math.sqrt(len(x)) if len(x := finite(fold_ics)) >= 2 else math.nan


def fold_blocks(folds: np.ndarray, max_blocks: int = 16) -> list[np.ndarray] | None:
    """PBO's blocks cut along the folds: each fold's dates (``folds``: the fold of each date,
    in date order) in the same number m of contiguous parts, m the largest with folds x m even
    and <= ``max_blocks`` and every part >= 4 dates (4 folds: 16 blocks). None when no such m
    gives >= 4 blocks (9 folds or more, odd; or blocks that short): PBO then cuts the dates."""
    labels = np.asarray(folds, dtype=np.float64)
    names = [f for f in dict.fromkeys(labels.tolist()) if math.isfinite(f)]
    rows = [np.flatnonzero(labels == f) for f in names]
    k = len(rows)
    shortest = min((len(r) for r in rows), default=0)
    fits = [m for m in range(1, max_blocks + 1) if k * m <= max_blocks and k * m % 2 == 0
            and k * m >= 4 and shortest // m >= 4]
    return [part for r in rows for part in np.array_split(r, max(fits))] if fits else None


def _fold_figures(best_folds: np.ndarray, null_ic: float,
                  blocks: list[np.ndarray] | None) -> dict[str, int | float | str | None]:
    best_ic = float(best_folds.mean()) if len(best_folds) else math.nan
    return {"best_val_ic": best_ic, "deflated_ic": best_ic - null_ic, "se_from": "folds",
            "best_val_ic_se": fold_standard_error(best_folds), "n_folds": len(best_folds),
            "pbo_blocks": "folds" if blocks is not None else "dates"}


def _align(daily: Mapping[int, np.ndarray | pd.Series], best: int) -> dict[int, np.ndarray]:
    """Every series as float64 values on the best trial's dates (NaN where a trial has none)."""
    as_series = {k: v if isinstance(v, pd.Series) else pd.Series(np.asarray(v, dtype=np.float64))
                 for k, v in daily.items()}
    numeric = {k: pd.to_numeric(v, errors="coerce") for k, v in as_series.items()}
    unique = {k: v if v.index.is_unique else v.groupby(level=0).mean() for k, v in numeric.items()}
    return {k: v.reindex(as_series[best].index).to_numpy(np.float64) for k, v in unique.items()}


def _sharpe(x: np.ndarray) -> float:
    if len(x) < 2:
        return math.nan
    std, mean = float(np.std(x, ddof=1)), float(x.mean())
    # a spread at rounding level (three days of 0.1 don't average to exactly 0.1) is no spread
    return mean / std if std > 1e-10 * abs(mean) else math.nan

