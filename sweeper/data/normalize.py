"""Feature and label normalisation on the dense [dates, assets, columns] layout.

Cross-sectional methods (``cs_zscore``, ``cs_rank``) use only rows of the same date, so they cannot leak
across time. ``robust_zscore`` fits a median and MAD per feature over the dates the train windows can see,
and applies them everywhere (Qlib's RobustZScoreNorm). Only rows present in the mask and with a finite value
enter any statistic.

The work is done once, on the host, with numpy: it is single-threaded, so a busy machine cannot stall it the
way it stalls torch's OpenMP threads, and numpy's argsort is several times faster than torch.sort here."""

import math
from collections.abc import Callable
from typing import TypedDict

import numpy as np
import torch

from sweeper.quant.ranks import average_ranks

FEATURE_NORMS = ("cs_zscore", "cs_rank", "robust_zscore", "none")
LABEL_NORMS = ("cs_rank", "cs_zscore", "none")

MAD_TO_STD = 1.4826  # MAD of a normal distribution times this is its std (as Qlib)
ROBUST_EPS = 1e-12   # Qlib's EPS: keeps a constant feature from dividing by zero
ROBUST_CLIP = 3.0
_CHUNK = 128         # dates per chunk: bounds the temporaries of a large panel
_CELLS = 1 << 22     # and at most this many values per chunk of the panel being built

Method = Callable[[np.ndarray, np.ndarray], np.ndarray]


class NormStats(TypedDict):
    """What ``data.feature_norm`` fitted over time (:func:`fit_stats`), JSON-ready."""

    method: str
    features: list[str]
    median: list[float | None] | None  # robust_zscore: per feature (None: it had no value); else None
    scale: list[float | None] | None


def cs_zscore(x: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Per-date z-score over the assets (axis 1), std with ddof=1 as pandas/Qlib.

    ``x``: [D, N, C]; ``valid``: [D, N, C] bool. Invalid entries and dates with
    fewer than two valid values (or zero spread) come out NaN."""
    with np.errstate(invalid="ignore", divide="ignore"):
        n = valid.sum(1, keepdims=True, dtype=x.dtype)
        mean = np.where(valid, x, 0).sum(1, keepdims=True) / n
        dev = np.where(valid, x - mean, 0)
        std = np.sqrt((dev * dev).sum(1, keepdims=True) / (n - 1))
        return np.where(valid & (std > 0), dev / std, np.nan).astype(x.dtype, copy=False)


def cs_rank(x: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Per-date rank over the assets, ties averaged, scaled to [-0.5, 0.5] and
    multiplied by sqrt(12) so a cross-section has std ~1 (as Qlib's CSRankNorm).

    The lowest valid value maps to -sqrt(3), the highest to +sqrt(3)."""
    n = valid.sum(1, keepdims=True, dtype=np.float32)
    filled = np.ascontiguousarray(np.moveaxis(np.where(valid, x, np.inf), 1, -1))
    ranks = np.moveaxis(average_ranks(filled), -1, 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (ranks / (n - 1) - 0.5) * np.float32(math.sqrt(12.0))
    return np.where(valid & (n > 1), out, np.nan).astype(x.dtype, copy=False)


PER_DATE: dict[str, Method] = {"cs_zscore": cs_zscore, "cs_rank": cs_rank,
                               "none": lambda x, v: np.where(v, x, np.nan).astype(x.dtype, copy=False)}


def fit_stats(x: torch.Tensor, mask: torch.Tensor, method: str, fit_dates: tuple[int, int],
              features: list[str]) -> NormStats:
    """What ``method`` fits over time, JSON-ready: ``{method, features, median, scale}``.

    Only ``robust_zscore`` fits anything (median and scaled MAD per feature over
    ``fit_dates``); the per-date methods have ``median`` and ``scale`` None. A trial stores
    this beside its weights, so that new data is normalised with the train statistics."""
    median: list[float | None] | None = None
    scale: list[float | None] | None = None
    if method == "robust_zscore":
        a, b = fit_dates
        xs, present = x.numpy()[a:b], mask.numpy()[a:b]
        median, scale = [], []
        # one feature at a time (the temporaries are one column's values, never a copy of x): a plain
        # median of its valid values and scale = (MAD + 1e-12) * 1.4826 in float64, exactly as Qlib's
        # RobustZScoreNorm; None for a feature without a value
        for k in range(xs.shape[-1]):
            values = xs[..., k][present & np.isfinite(xs[..., k])].astype(np.float64)
            centre = float(np.median(values)) if values.size else None
            median.append(centre)
            scale.append(None if centre is None
                          else float((np.median(np.abs(values - centre)) + ROBUST_EPS) * MAD_TO_STD))
    return {"method": method, "features": list(features), "median": median, "scale": scale}


def normalize_features(x: torch.Tensor, mask: torch.Tensor, method: str, fit_dates: tuple[int, int],
                       stats: NormStats | None = None) -> torch.Tensor:
    """[T, N, F] raw features (NaN = missing) -> normalised, NaN replaced by 0 (a new tensor).

    ``fit_dates``: [start, stop) date indices whose rows fit robust_zscore, unless ``stats``
    (from :func:`fit_stats`, e.g. a trial's saved statistics) already hold the fit."""
    if method == "robust_zscore" and (stats is None or stats.get("median") is None):
        stats = fit_stats(x, mask, method, fit_dates, [])
    out = x.numpy().copy()
    normalize_inplace(out, mask.numpy(), method, stats)
    return torch.from_numpy(out)


def normalize_inplace(x: np.ndarray, mask: np.ndarray, method: str, stats: NormStats | None) -> None:
    """Normalise the [T, N, F] raw features ``x`` where they lie, NaN replaced by 0.

    Chunks of dates bound the temporaries to a chunk's size: the panel being built
    (perhaps a file-backed map in the panel cache) is the only full-size array.
    ``stats`` holds robust_zscore's fit (:func:`fit_stats`); other methods ignore it."""
    if method == "robust_zscore":
        median, scale = (stats.get("median"), stats.get("scale")) if stats is not None else (None, None)
        assert median is not None and scale is not None, "robust_zscore needs fitted statistics"
        centre, spread = np.array(median, dtype=np.float64), np.array(scale, dtype=np.float64)  # None -> NaN
        fn: Method = lambda xc, vc: np.where(  # noqa: E731
            vc, np.clip((xc - centre.astype(xc.dtype)) / spread.astype(xc.dtype), -ROBUST_CLIP, ROBUST_CLIP),
            np.nan).astype(xc.dtype, copy=False)
    elif method in PER_DATE:
        fn = PER_DATE[method]
    else:
        raise ValueError(f"unknown feature normalisation {method!r}; expected one of {FEATURE_NORMS}")
    # every method works per date (or per value), so the chunking never changes a bit
    step = max(1, min(_CHUNK, _CELLS // max(x[0].size, 1)))
    for start in range(0, x.shape[0], step):
        part = slice(start, start + step)
        valid = mask[part][:, :, None] & np.isfinite(x[part])
        x[part] = np.nan_to_num(fn(x[part], valid), copy=False, nan=0.0)


def normalize_label(y: torch.Tensor, mask: torch.Tensor, method: str) -> torch.Tensor:
    """[T, N] raw label -> training label; NaN where missing (those rows are no samples)."""
    col = y.numpy()[:, :, None]
    valid = (mask.numpy() & np.isfinite(y.numpy()))[:, :, None]
    if method not in LABEL_NORMS:
        raise ValueError(f"unknown label normalisation {method!r}; expected one of {LABEL_NORMS}")
    out = np.empty_like(col)
    for start in range(0, col.shape[0], _CHUNK):  # in chunks of dates: bounded temporaries
        part = slice(start, start + _CHUNK)
        out[part] = PER_DATE[method](col[part], valid[part])
    return torch.from_numpy(np.ascontiguousarray(out[:, :, 0]))
