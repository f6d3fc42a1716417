"""One optimizer step, with no host sync: a batch's rows in the micro-batches its loss
splits them into (:meth:`~sweeper.core.loss.Loss.split`), forward and backward of each,
then unscale, clip and update unless the loss or a gradient is non-finite.

Nothing here reads a value back from the device: whether a step was non-finite stays a
device-side flag that the optimizer itself obeys, and the loop reads the step's loss and
flag later, many steps at a time (see ``loop.SYNC_EVERY``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from sweeper.core.loss import Loss
from sweeper.core.precision import Precision
from sweeper.core.schedule import Rows
from sweeper.data import Batch

Gather = Callable[[torch.Tensor], Batch]  # sample pairs [B, 2] -> the batch on the training device


def accumulate(model: nn.Module, gather: Gather, rows: Rows, micro: int, criterion: Loss,
               precision: Precision, scaler: torch.amp.GradScaler) -> torch.Tensor:
    """Gather, forward and backward every micro-batch; returns the (detached) loss of the whole batch."""
    total = None
    for part, weight in criterion.split(rows, micro):
        batch = gather(part)  # per micro-batch: a smaller micro-batch gathers less too
        with precision.autocast():
            pred = model(batch.x)
        loss = criterion(pred, batch.y, batch.t)
        if weight != 1.0:
            loss = loss * weight
        scaler.scale(loss).backward()
        total = loss.detach() if total is None else total + loss.detach()
        del batch, pred, loss  # the next micro-batch's gather must not find this one's still alive
    assert total is not None, "a batch has at least one row"
    return total


def finish_step(params: list[nn.Parameter], optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                loss: torch.Tensor, grad_clip: float | None) -> torch.Tensor:
    """Unscale, clip, and update unless the loss or the gradient norm is non-finite.

    Returns the step's skip flag, a float32 device scalar: 1.0 when no update was made.
    With fp16 the gradients are unscaled first, so a non-finite norm is the same test the
    GradScaler makes (an inf or NaN gradient): its skipped steps are non-finite steps
    like any other."""
    scaler.unscale_(optimizer)  # a no-op unless fp16
    try:
        if grad_clip:
            norm = nn.utils.clip_grad_norm_(params, grad_clip)
        else:
            norm = nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        # (loss + norm) x 0 is 0 when both are finite and NaN otherwise: three small kernels, no read
        skipped = torch.add(loss, norm).mul_(0).nan_to_num_(nan=1.0, posinf=1.0, neginf=1.0).to(torch.float32)
        update_unless(optimizer, skipped)
    finally:
        # closes the scaler's iteration even when the update ran out of memory, so that the
        # step can be redone; fp16: lowers the scale after an overflow, as scaler.step would
        scaler.update()
    return skipped


def update_unless(optimizer: torch.optim.Optimizer, skip: torch.Tensor) -> None:
    """``optimizer.step()`` unless the device flag ``skip`` (float32 1.0) is set, without reading it.

    torch's fused AdamW skips a step on the device when its ``found_inf`` is set (steps,
    moments and weights untouched): the GradScaler hands it the flag through the
    ``found_inf`` / ``grad_scale`` attributes, and so do we. Other optimizers read the
    flag on the host (a sync per step). The groups decide, not the defaults: a state loaded
    from an older checkpoint brings its groups' ``fused`` setting with it."""
    if not all(group.get("fused") for group in optimizer.param_groups):
        if not bool(skip):
            optimizer.step()
        return
    fused: Any = optimizer  # the two attributes are the GradScaler's protocol, not declared on Optimizer
    fused.grad_scale = None  # gradients are already unscaled
    fused.found_inf = skip
    try:
        optimizer.step()
    finally:
        del fused.grad_scale, fused.found_inf


def train_step(model: nn.Module, params: list[nn.Parameter], optimizer: torch.optim.Optimizer,
               scaler: torch.amp.GradScaler, precision: Precision, gather: Gather, rows: Rows, micro: int,
               criterion: Loss, grad_clip: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step over ``rows``: (the batch's loss, the skip flag), both on the device."""
    optimizer.zero_grad(set_to_none=True)
    loss = accumulate(model, gather, rows, micro, criterion, precision, scaler)
    return loss, finish_step(params, optimizer, scaler, loss, grad_clip)
