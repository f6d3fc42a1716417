"""One optimizer step's forward and backward: the loss, and the split of a batch into
micro-batches whose weighted losses add up to the whole batch's loss."""
from __future__ import annotations

import torch
from torch import nn

from sweeper.core.precision import Precision
from sweeper.data import Batch
from sweeper.quant import ic as M


def compute_loss(loss_name: str, pred: torch.Tensor, batch: Batch) -> torch.Tensor:
    pred = pred.float()  # losses in fp32 whatever the autocast dtype
    if loss_name == "mse":
        return nn.functional.mse_loss(pred, batch.y)
    return M.ic_loss(pred, batch.y, batch.t)


def micro_batches(batch: Batch, micro: int, loss_name: str) -> list[tuple[Batch, float]]:
    """Split a batch into micro-batches of at most ``micro`` rows, each with the weight that
    makes the sum of their losses equal the loss of the whole batch."""
    n = len(batch.y)
    if micro >= n:
        return [(batch, 1.0)]
    if loss_name == "mse":  # mean over rows: weight = share of rows
        return [(Batch(*(v[s:s + micro] for v in batch)), min(micro, n - s) / n) for s in range(0, n, micro)]
    # ic: mean over dates; whole dates per micro-batch, weight = share of the dates ic_loss averages
    batch = Batch(*(v[torch.argsort(batch.t, stable=True)] for v in batch))
    counts = torch.unique_consecutive(batch.t, return_counts=True)[1].tolist()
    usable = sum(c >= 2 for c in counts) or 1
    parts, start, rows, dates = [], 0, 0, 0
    for c in counts + [None]:
        if c is None or (rows and rows + c > micro):
            if dates:
                parts.append((Batch(*(v[start:start + rows] for v in batch)), dates / usable))
            start, rows, dates = start + rows, 0, 0
        if c is not None:
            rows, dates = rows + c, dates + (c >= 2)
    return parts


def accumulate(model: nn.Module, batch: Batch, micro: int, loss_name: str, precision: Precision,
               scaler: torch.amp.GradScaler) -> torch.Tensor:
    """Forward and backward every micro-batch; returns the (detached) loss of the whole batch."""
    total = torch.zeros((), device=batch.y.device)
    for part, weight in micro_batches(batch, micro, loss_name):
        with precision.autocast():
            pred = model(part.x)
        loss = compute_loss(loss_name, pred, part) * weight
        scaler.scale(loss).backward()
        total += loss.detach()
    return total
