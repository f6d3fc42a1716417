"""Average ranks within each row, ties sharing their mean rank: the one ranking of the package
(normalisation's ``cs_rank`` ranks numpy cross-sections, Rank IC ``[T, N]`` tensors on their
device), so that a tie rule is decided once."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

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
    if tied.any():  # pandas' average rank, 1-based, of those rows (faster there than a sort's runs)
        rows = np.flatnonzero(tied)
        ranks[rows] = pd.DataFrame(v[rows]).rank(axis=1, method="average").to_numpy(np.float32) - 1
    return ranks.reshape(shape)


def average_ranks_torch(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """1-based ranks within each row among the valid entries; ties share their average rank.
    Missing entries are sent to +inf so they sort last and never tie with a finite value; the first
    and last position of each value's run come from searchsorted on the sorted row."""
    import torch
    keyed = torch.where(valid, x, torch.tensor(math.inf, dtype=x.dtype, device=x.device))
    ordered, order = torch.sort(keyed, dim=1)
    first, last = (torch.searchsorted(ordered, ordered, right=right) for right in (False, True))
    mean_rank = (first + last + 1).to(x.dtype) / 2  # mean of the 1-based ranks first+1 .. last
    return torch.empty_like(mean_rank).scatter_(1, order, mean_rank)
