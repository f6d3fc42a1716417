"""Feature and label normalisation on the dense [dates, assets, columns] layout.

Cross-sectional methods (``cs_zscore``, ``cs_rank``) use only rows of the same
date, so they cannot leak across time. ``robust_zscore`` fits a median and MAD
per feature over the dates the train windows can see, and applies them
everywhere (Qlib's RobustZScoreNorm). Only rows present in the mask and with a
finite value enter any statistic.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

FEATURE_NORMS = ("cs_zscore", "cs_rank", "robust_zscore", "none")
LABEL_NORMS = ("cs_rank", "cs_zscore", "none")

MAD_TO_STD = 1.4826  # MAD of a normal distribution times this is its std (as Qlib)
ROBUST_EPS = 1e-12   # Qlib's EPS: keeps a constant feature from dividing by zero
ROBUST_CLIP = 3.0
_CHUNK = 128         # dates per chunk: bounds the temporaries of a large panel

Method = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cs_zscore(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per-date z-score over the assets (dim 1), std with ddof=1 as pandas/Qlib.

    ``x``: [D, N, C]; ``valid``: [D, N, C] bool. Invalid entries and dates with
    fewer than two valid values (or zero spread) come out NaN.
    """
    n = valid.sum(1, keepdim=True).to(x.dtype)
    mean = torch.where(valid, x, 0).sum(1, keepdim=True) / n
    dev = torch.where(valid, x - mean, 0)
    std = ((dev * dev).sum(1, keepdim=True) / (n - 1)).sqrt()
    out = dev / std
    return torch.where(valid & (std > 0), out, torch.nan)


def cs_rank(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per-date rank over the assets, ties averaged, scaled to [-0.5, 0.5] and
    multiplied by sqrt(12) so a cross-section has std ~1 (as Qlib's CSRankNorm).

    The lowest valid value maps to -sqrt(3), the highest to +sqrt(3).
    """
    n = valid.sum(1, keepdim=True).to(x.dtype)
    ranks = average_ranks(torch.where(valid, x, torch.inf), dim=1)
    out = (ranks / (n - 1) - 0.5) * math.sqrt(12.0)
    return torch.where(valid & (n > 1), out, torch.nan)


def average_ranks(v: torch.Tensor, dim: int) -> torch.Tensor:
    """0-based ranks along ``dim`` with ties given their average rank."""
    v = v.movedim(dim, -1)
    s, order = torch.sort(v, dim=-1)
    size = s.shape[-1]
    pos = torch.arange(size, device=v.device).expand_as(s)
    starts = torch.ones_like(s, dtype=torch.bool)
    starts[..., 1:] = s[..., 1:] != s[..., :-1]
    ends = torch.ones_like(starts)
    ends[..., :-1] = starts[..., 1:]
    first = torch.where(starts, pos, 0).cummax(-1).values
    last = torch.where(ends, pos, size - 1).flip(-1).cummin(-1).values.flip(-1)
    avg = (first + last).to(v.dtype) / 2
    return torch.empty_like(avg).scatter_(-1, order, avg).movedim(-1, dim)


def robust_fit(x: torch.Tensor, valid: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Median and scaled MAD per column over every valid (date, asset) row of ``x``.

    ``scale = (MAD + 1e-12) * 1.4826`` exactly as Qlib's RobustZScoreNorm; float64.
    """
    flat = torch.where(valid, x, torch.nan).reshape(-1, x.shape[-1]).double().numpy()
    median = np.nanmedian(flat, axis=0)
    mad = np.nanmedian(np.abs(flat - median), axis=0)
    return median, (mad + ROBUST_EPS) * MAD_TO_STD


def robust_apply(x: torch.Tensor, valid: torch.Tensor, median: np.ndarray, scale: np.ndarray) -> torch.Tensor:
    med = torch.as_tensor(median, dtype=x.dtype)
    sc = torch.as_tensor(scale, dtype=x.dtype)
    out = ((x - med) / sc).clamp(-ROBUST_CLIP, ROBUST_CLIP)
    return torch.where(valid, out, torch.nan)


def by_date_chunks(method: Method, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Apply a per-date ``method`` in chunks of dates (bounded temporaries)."""
    out = torch.empty_like(x)
    for start in range(0, x.shape[0], _CHUNK):
        part = slice(start, start + _CHUNK)
        out[part] = method(x[part], valid[part])
    return out


def normalize_features(
    x: torch.Tensor, mask: torch.Tensor, method: str, fit_dates: tuple[int, int]
) -> torch.Tensor:
    """[T, N, F] raw features (NaN = missing) -> normalised, NaN replaced by 0.

    ``fit_dates``: [start, stop) date indices whose rows fit robust_zscore.
    """
    valid = mask[:, :, None] & torch.isfinite(x)
    if method == "cs_zscore":
        out = by_date_chunks(cs_zscore, x, valid)
    elif method == "cs_rank":
        out = by_date_chunks(cs_rank, x, valid)
    elif method == "robust_zscore":
        a, b = fit_dates
        median, scale = robust_fit(x[a:b], valid[a:b])
        out = by_date_chunks(lambda xs, vs: robust_apply(xs, vs, median, scale), x, valid)
    elif method == "none":
        out = torch.where(valid, x, torch.nan)
    else:
        raise ValueError(f"unknown feature normalisation {method!r}; expected one of {FEATURE_NORMS}")
    return torch.nan_to_num_(out, nan=0.0)


def normalize_label(y: torch.Tensor, mask: torch.Tensor, method: str) -> torch.Tensor:
    """[T, N] raw label -> training label; NaN where missing (those rows are no samples)."""
    valid = (mask & torch.isfinite(y))[:, :, None]
    col = y[:, :, None]
    if method == "cs_rank":
        out = by_date_chunks(cs_rank, col, valid)
    elif method == "cs_zscore":
        out = by_date_chunks(cs_zscore, col, valid)
    elif method == "none":
        out = torch.where(valid, col, torch.nan)
    else:
        raise ValueError(f"unknown label normalisation {method!r}; expected one of {LABEL_NORMS}")
    return out[:, :, 0]
