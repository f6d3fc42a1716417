"""Average ranks within each row, ties sharing their mean rank: the one ranking of the package
(normalisation's ``cs_rank`` ranks numpy cross-sections, Rank IC ``[T, N]`` tensors on their
device), so that a tie rule is decided once.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported where a function needs it: best and status never do
    import torch


def average_ranks(v: np.ndarray) -> np.ndarray:
    """0-based float32 ranks along the last axis, ties given their average rank. Only rows with a
    tie among finite values take the slower tie-averaging pass (the +inf that pads missing entries
    may tie: those ranks are discarded)."""
    shape, size = v.shape, v.shape[-1]
    v = v.reshape(-1, size)
    order = np.argsort(v, axis=-1)
    s = np.take_along_axis(v, order, -1)
    ranks = np.empty(v.shape, dtype=np.float32)
    np.put_along_axis(ranks, order, np.broadcast_to(np.arange(size, dtype=np.float32), v.shape), -1)
    tied = ((s[:, 1:] == s[:, :-1]) & np.isfinite(s[:, 1:])).any(-1)
    if tied.any():
        rows = np.flatnonzero(tied)
        fixed = np.empty((len(rows), size), dtype=np.float32)
        np.put_along_axis(fixed, order[rows], _tie_average(s[rows]), -1)
        ranks[rows] = fixed
    return ranks.reshape(shape)


def _tie_average(s: np.ndarray) -> np.ndarray:
    """Average positions of equal runs in each sorted row of ``s``."""
    size = s.shape[-1]
    pos = np.broadcast_to(np.arange(size), s.shape)
    starts = np.ones(s.shape, dtype=bool)
    starts[:, 1:] = s[:, 1:] != s[:, :-1]
    ends = np.ones_like(starts)
    ends[:, :-1] = starts[:, 1:]
    first = np.maximum.accumulate(np.where(starts, pos, 0), axis=-1)
    last = np.minimum.accumulate(np.where(ends, pos, size - 1)[:, ::-1], axis=-1)[:, ::-1]
    return ((first + last) / 2).astype(np.float32)


def average_ranks_torch(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """1-based ranks within each row among the valid entries; ties share their average rank.
    Missing entries are sent to +inf so they sort last and never tie with a finite value; the first
    and last position of each value's run come from searchsorted on the sorted row."""
    import torch
    keyed = torch.where(valid, x, torch.tensor(math.inf, dtype=x.dtype, device=x.device))
    ordered, order = torch.sort(keyed, dim=1)
    first = torch.searchsorted(ordered, ordered, right=False)
    last = torch.searchsorted(ordered, ordered, right=True)
    mean_rank = (first + last + 1).to(x.dtype) / 2  # mean of the 1-based ranks first+1 .. last
    return torch.empty_like(mean_rank).scatter_(1, order, mean_rank)
