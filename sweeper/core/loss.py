"""``train.loss`` -> the :class:`Loss` a run trains and validates with, picked once. A loss is two
rules that must agree: its value on a batch, and how a batch's rows split into micro-batches whose
weighted losses add up to the loss of the whole batch."""

from abc import ABC, abstractmethod
from typing import ClassVar

import torch
from torch import nn

from sweeper.core.schedule import Rows
from sweeper.quant import ic as M

Part = tuple[torch.Tensor, float]  # a micro-batch: its sample pairs [b, 2] and its weight


class Loss(ABC):
    """One training loss (:data:`LOSSES`, by its ``train.loss`` value)."""

    name: ClassVar[str]          # its ``train.loss`` value
    whole_dates: ClassVar[bool]  # its micro-batches hold whole dates, so none is smaller than a date

    @abstractmethod
    def __call__(self, pred: torch.Tensor, label: torch.Tensor, dates: torch.Tensor) -> torch.Tensor:
        """The loss of ``pred`` [B] against ``label`` [B] on rows of dates ``dates`` [B], in fp32."""

    def stacked(self, pred: torch.Tensor, label: torch.Tensor, dates: torch.Tensor,
                sizes: list[int]) -> torch.Tensor:
        """Each member's loss [K] of a stack's ``pred`` [K, b] (member k's first ``sizes[k]`` rows are
        its own; size 0 scores 0): the stack backwards their sum, so no member sees another's rows."""
        return torch.stack([self(pred[k, :n], label[k, :n], dates[k, :n]) if n else pred[k, :1].sum() * 0
                            for k, n in enumerate(sizes)])

    def split(self, rows: Rows, micro: int) -> list[Part]:
        """``rows`` in micro-batches of at most ``micro`` rows, each with the weight that makes
        the sum of their losses equal the loss of the whole batch."""
        return [(rows.idx, 1.0)] if micro >= len(rows.idx) else self._split(rows, micro)

    @abstractmethod
    def _split(self, rows: Rows, micro: int) -> list[Part]:
        """:meth:`split` of a batch of more than ``micro`` rows."""


class MeanSquaredError(Loss):
    name = "mse"
    whole_dates = False

    def __call__(self, pred: torch.Tensor, label: torch.Tensor, dates: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(pred.float(), label)

    def stacked(self, pred: torch.Tensor, label: torch.Tensor, dates: torch.Tensor,
                sizes: list[int]) -> torch.Tensor:
        # no member padded: one kernel (a stack of one keeps mse_loss's own, as a lone run's)
        if len(sizes) > 1 and all(n in (0, pred.shape[1]) for n in sizes):
            return (pred.float() - label).square().mean(dim=1)  # (a member of size 0 is weighted 0)
        return super().stacked(pred, label, dates, sizes)

    def _split(self, rows: Rows, micro: int) -> list[Part]:
        idx, n = rows.idx, len(rows.idx)  # a mean over rows: weight = share of rows
        return [(idx[s:s + micro], min(micro, n - s) / n) for s in range(0, n, micro)]


class DailyIC(Loss):
    """Minus the mean over dates of the per-date Pearson IC (:func:`sweeper.quant.ic.ic_loss`)."""

    name = "ic"
    whole_dates = True

    def __call__(self, pred: torch.Tensor, label: torch.Tensor, dates: torch.Tensor) -> torch.Tensor:
        return M.ic_loss(pred.float(), label, dates)

    def _split(self, rows: Rows, micro: int) -> list[Part]:
        """The loss averages over dates, so its micro-batches hold whole dates (a date larger than
        ``micro`` is one of its own) weighted by the share of the dates ``ic_loss`` counts. A random-
        order batch is grouped by date here, which reads the counts back (one sync, only then)."""
        idx, counts = rows.idx, rows.date_counts
        if counts is None:
            idx = idx[torch.argsort(idx[:, 0], stable=True)]
            counts = torch.unique_consecutive(idx[:, 0], return_counts=True)[1].tolist()
        usable = sum(c >= 2 for c in counts) or 1  # ic_loss skips dates of one row
        parts: list[Part] = []
        start, size, dates = 0, 0, 0
        for c in [*counts, None]:
            if c is None or (size and size + c > micro):
                if dates:
                    parts.append((idx[start:start + size], dates / usable))
                start, size, dates = start + size, 0, 0
            if c is not None:
                size, dates = size + c, dates + (c >= 2)
        return parts


LOSSES: dict[str, Loss] = {loss.name: loss for loss in (MeanSquaredError(), DailyIC())}
