"""The resident panel: dense tensors, mask, split indices and sample index."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch

from sweeper.data.normalize import NormStats
from sweeper.data.placement import ON_DEVICE, free_device_bytes, placement

_TENSORS = ("X", "y", "y_raw", "mask")


@dataclass
class Panel:
    X: torch.Tensor          # [T, N, F] float32 normalised features, NaN -> 0
    y: torch.Tensor          # [T, N] float32 normalised training label, NaN = no usable label
    y_raw: torch.Tensor      # [T, N] float32 raw label (metrics use it), NaN where missing
    mask: torch.Tensor       # [T, N] bool: the (date, asset) row is present
    dates: np.ndarray        # [T] datetime64[ns], ascending
    assets: np.ndarray       # [N] str (object)
    features: list[str]
    splits: dict[str, tuple[int, int]]   # split -> [start, stop) target-date indices, purged
    lookback: int
    oracle_ic: dict[str, float] | None
    source: str
    fingerprint: str
    # what normalisation fitted over time (normalize.fit_stats): saved with a trial's weights
    norm_stats: NormStats | None = None
    # the panel cache entry whose read-only maps X, y, y_raw and mask are (sweeper.data.cache);
    # None: they live in this process's memory
    cache_entry: str | None = None
    _cache: dict[str, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    def sample_index(self, split: str) -> torch.Tensor:
        """int64 [S, 2] of (t, i), sorted by t then i: t in the split (so
        t >= lookback-1), row present and training label finite. Cached."""
        if split not in self._cache:
            if split not in self.splits:
                raise KeyError(f"unknown split {split!r}; expected one of {sorted(self.splits)}")
            start, stop = self.splits[split]
            idx = (self.mask[start:stop] & torch.isfinite(self.y[start:stop])).nonzero()
            idx[:, 0] += start
            self._cache[split] = idx
        return self._cache[split]

    def days(self, span: tuple[int, int]) -> list[str]:
        """``[first, last]`` of the ``[start, stop)`` date indices as ISO days (empty list: no date)."""
        start, stop = span
        if stop <= start:
            return []
        return [str(np.datetime_as_string(self.dates[k], unit="D")) for k in (start, stop - 1)]

    def split_dates(self) -> dict[str, list[str]]:
        """``{split: [first, last]}`` target dates as ISO days (empty list: no date)."""
        return {name: self.days(span) for name, span in self.splits.items()}

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors that move with the panel, sample indices included."""
        tensors = sum(getattr(self, name).nbytes for name in _TENSORS)
        return tensors + int((self.mask & torch.isfinite(self.y)).sum()) * 2 * 8

    def to(self, device: torch.device | str, share: float) -> Panel:
        """Move to ``device`` when the panel fits in ``share`` of its free memory; else stay on the host in
        pinned memory (batches then copy non_blocking). On the CPU a no-op that queries nothing."""
        if (device := torch.device(device)).type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if self.X.device == device:
            return self
        # to the device straight from the host tensors (a cache entry's maps included):
        # the copy reads the mapped pages, no host copy of the panel is made first
        if device.type != "cuda" or placement(self.nbytes, free_device_bytes(device), share) == ON_DEVICE:
            return self._moved(lambda t: t.to(device))
        # a cache entry is not pinned: pinning would copy the shared map into this process; the batcher
        # already gathers each batch into pinned memory, so the map itself serves as the host copy
        return self if self.cache_entry is not None else self._moved(lambda t: t.cpu().pin_memory())

    def _moved(self, move) -> Panel:
        moved = {name: move(getattr(self, name)) for name in _TENSORS}
        return dataclasses.replace(self, **moved, cache_entry=None, _cache={})
