"""Batches of windows gathered from the resident panel tensor.

A sample (t, i) is the window X[t-lookback+1 .. t, i, :] with target y[t, i]. A batch is one gather
(``index_select`` on a GPU, a single-threaded ``np.take`` on the host) of the [T*N, F] view of X at the flat
row numbers (t + k) * N + i, so there is no per-sample Python. When X stays on the host while training runs
on CUDA, each batch is gathered into pinned memory and copied with ``non_blocking=True``."""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from sweeper.data.panel import Panel


class Batch(NamedTuple):
    x: torch.Tensor      # [B, lookback, F] float32
    y: torch.Tensor      # [B] normalised label (train target)
    y_raw: torch.Tensor  # [B] raw label
    t: torch.Tensor      # [B] int64 date index
    i: torch.Tensor      # [B] int64 asset index


class Batcher:
    """Gathered batches of one split: of any sample pairs (an epoch's order is
    :func:`sweeper.core.schedule.epoch_rows`), or of every sample in order, to evaluate."""

    def __init__(self, panel: Panel, split: str, device: torch.device | str) -> None:
        self.panel, self.split, self.device = panel, split, torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._home = panel.X.device
        T, N, F = panel.X.shape
        self._n_assets = N
        self._xflat = panel.X.reshape(T * N, F)
        self._yflat, self._rawflat = panel.y.reshape(-1), panel.y_raw.reshape(-1)
        # flat-row offsets of a window's dates: (t + k) * N + i = cell + k * N
        self._row_offsets = torch.arange(-panel.lookback + 1, 1, device=self._home) * N
        self._copy = self._home != self.device
        self.index = panel.sample_index(split)
        self.n_samples = int(self.index.shape[0])
        self.n_dates = int(torch.unique_consecutive(self.index[:, 0]).shape[0])  # the index is sorted by date

    def gather(self, idx: torch.Tensor) -> Batch:
        """int64 [B, 2] (t, i) pairs -> Batch on the training device."""
        idx = idx.to(self._home)
        t, i = idx[:, 0], idx[:, 1]
        if self._home.type == "cpu":
            self._check(t, i)
        cells = t * self._n_assets + i
        rows = (cells[:, None] + self._row_offsets).reshape(-1)
        x = self._take(self._xflat, rows).view(len(idx), -1, self._xflat.shape[1])
        return Batch(x, self._take(self._yflat, cells), self._take(self._rawflat, cells),
                     self._move(t), self._move(i))

    def same_split(self, other: Batcher) -> bool:
        """Whether both serve the same rows of the same panel tensors (one fold's split, however
        its panel is wrapped). One comparison of the sample indices: ask it once per pass."""
        mine, theirs = self.index, other.index
        return (self.reads_same(other) and mine.shape == theirs.shape
                and (mine.data_ptr() == theirs.data_ptr() or bool(torch.equal(mine, theirs))))

    def reads_same(self, other: Batcher) -> bool:
        """Whether both gather from the same panel tensors (one fold's panel, however wrapped)."""
        mine, theirs = (self._xflat, self._yflat), (other._xflat, other._yflat)
        return (self.device == other.device
                and all(a.data_ptr() == b.data_ptr() and a.shape == b.shape for a, b in zip(mine, theirs)))

    def _check(self, t: torch.Tensor, i: torch.Tensor) -> None:
        # the host gather clips indices, so a bad pair must be refused here
        if len(t) and (int(t.min()) < self.panel.lookback - 1 or int(t.max()) >= self.panel.X.shape[0]
                       or int(i.min()) < 0 or int(i.max()) >= self._n_assets):
            raise IndexError("gather: (t, i) pairs need lookback-1 <= t < T and 0 <= i < N")

    def _take(self, src: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        if self._home.type != "cpu":
            out = torch.index_select(src, 0, rows)
            return out.to(self.device) if self._copy else out
        # One thread on purpose: a 2-thread OpenMP gather runs ~10x slower when another process holds a
        # core, and one thread already outruns any model. A CUDA-bound batch lands in pinned memory (the
        # caching host allocator keeps the block until the async copy is done).
        out = torch.empty((len(rows), *src.shape[1:]), dtype=src.dtype, pin_memory=self.device.type == "cuda")
        np.take(src.numpy(), rows.numpy(), axis=0, out=out.numpy(), mode="clip")
        return out.to(self.device, non_blocking=True) if self._copy else out

    def _move(self, v: torch.Tensor) -> torch.Tensor:
        return v.to(self.device, non_blocking=True) if self._copy else v


def gather_stack(batchers: Sequence[Batcher], rows: Sequence[torch.Tensor], width: int,
                 same_rows: bool = False) -> StackBatch:
    """A stack's batch: member k's ``rows[k]`` from ``batchers[k]``, each repeated to ``width``
    rows (a shorter member's extra rows are its own again, and its loss reads only its first
    ``len(rows[k])``). Members that read the same panel tensor gather in one call, straight into
    the stacked layout. ``same_rows`` (the caller knows every member reads the same rows of the
    same panel: seeds of one fold, validated) gathers them once and shares them."""
    padded = [r if len(r) == width else r[torch.arange(width, device=r.device) % len(r)] for r in rows]
    first = batchers[0]
    if all(b.reads_same(first) for b in batchers):
        if same_rows:
            one = first.gather(padded[0])
            k = len(batchers)
            return StackBatch(one.x.expand(k, *one.x.shape), one.y.expand(k, -1), one.t.expand(k, -1))
        got = first.gather(torch.cat(padded))
        shape = (len(batchers), width)
        return StackBatch(got.x.view(*shape, *got.x.shape[1:]), got.y.view(shape), got.t.view(shape))
    parts = [b.gather(r) for b, r in zip(batchers, padded)]
    return StackBatch(torch.stack([p.x for p in parts]), torch.stack([p.y for p in parts]),
                      torch.stack([p.t for p in parts]))


class StackBatch(NamedTuple):
    x: torch.Tensor  # [K, b, lookback, F]
    y: torch.Tensor  # [K, b] normalised labels
    t: torch.Tensor  # [K, b] date indices
