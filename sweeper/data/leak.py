"""The leak guard: a feature that correlates with the label on the same date is a future return.

A label is a forward return, known only after the fact. A column such as another forward return, or the
label with noise, correlates with it across the assets of each date far above what an honest feature reaches
(typically below 0.1; a daily IC above about 0.3 on real equities almost always means leakage). Left in, it
makes a model look brilliant in backtest and worthless live.

The check: for each feature, the Pearson correlation of the raw feature with the raw label across the assets
of each train target date (rows present, both values finite, at least 3 of them), averaged over those dates.
A feature whose absolute mean exceeds ``data.max_feature_label_corr`` is refused with a DataError that names
it, unless the excess is within the noise of so few rows (3 / sqrt(rows), e.g. 0.07 over 2,000 rows, 0.004
over 500,000): a tiny panel's chance correlation is not a leak."""

import numpy as np

from sweeper.errors import DataError

_CELLS = 1 << 18  # (date, asset, feature) cells per chunk: bounds the float64 temporaries (2 MB each)


def mean_daily_corr(X: np.ndarray, y: np.ndarray, mask: np.ndarray,
                    dates: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """``([F] mean over dates of the per-date Pearson correlation of each feature with y,
    [F] number of rows those dates' correlations used)``."""
    start, stop = dates
    _, N, F = X.shape
    total, count, rows = np.zeros(F), np.zeros(F), np.zeros(F)
    step = max(1, _CELLS // max(N * F, 1))
    for a in range(start, stop, step):
        b = min(a + step, stop)
        # [D, F] Pearson across assets (axis 1) of each date; NaN with < 3 pairs or no spread
        x, lab = X[a:b].astype(np.float64), y[a:b].astype(np.float64)[:, :, None]
        valid = mask[a:b, :, None] & np.isfinite(x) & np.isfinite(lab)
        with np.errstate(invalid="ignore", divide="ignore"):
            n = valid.sum(1)
            dx = np.where(valid, x - (np.where(valid, x, 0).sum(1) / n)[:, None], 0)
            dy = np.where(valid, lab - (np.where(valid, lab, 0).sum(1) / n)[:, None], 0)
            corr = np.where(n >= 3, (dx * dy).sum(1) / np.sqrt((dx * dx).sum(1) * (dy * dy).sum(1)), np.nan)
        ok = np.isfinite(corr)
        total += np.where(ok, corr, 0.0).sum(0)
        count += ok.sum(0)
        rows += np.where(ok, n, 0).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return total / count, rows


def judge_leaks(corr: np.ndarray, rows: np.ndarray, threshold: float, names: list[str], source: str,
                label_col: str) -> None:
    """The verdict on :func:`mean_daily_corr`'s figures: a DataError naming the feature most correlated with
    the label, if any is above ``threshold`` by more than the noise of its rows. Kept apart so that a cached
    panel, which stores the figures, is judged against the current ``data.max_feature_label_corr``."""
    corr, rows = np.asarray(corr, dtype=np.float64), np.asarray(rows, dtype=np.float64)
    with np.errstate(divide="ignore"):
        noise = 3.0 / np.sqrt(rows)
    excess = np.where(np.isfinite(corr), np.abs(corr) - threshold - noise, -np.inf)
    if not len(excess) or excess.max() <= 0:
        return
    k = int(np.argmax(np.where(excess > 0, np.abs(corr), -np.inf)))
    others = [f"'{names[j]}' ({corr[j]:+.2f})" for j in np.argsort(-np.abs(np.nan_to_num(corr)))
              if j != k and excess[j] > 0]
    more = f"; also {', '.join(others[:5])}" if others else ""
    raise DataError(f"{source}: feature column '{names[k]}' has a same-date correlation of {corr[k]:+.2f} "
                    f"with the label '{label_col}' on the train split (mean over its dates, {int(rows[k])} "
                    f"rows), above data.max_feature_label_corr {threshold:g}{more}. A feature that close to "
                    f"the label is usually a future return: drop it with data.exclude, or raise "
                    f"data.max_feature_label_corr")
