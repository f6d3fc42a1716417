"""Scoring a model on a split: predictions in sample order (halving the batch on OOM), the
per-epoch validation scores, and the final valid and test scores through ``predict``."""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd
import torch
from torch import nn

from sweeper.core.batch_search import is_oom, release_memory
from sweeper.core.loss import Loss
from sweeper.data import Batcher, Panel
from sweeper.quant import ic as M

SPLIT_PREFIX = {"valid": "val", "test": "test"}
Tick = Callable[[], None]  # called once per evaluated batch: scoring is progress too


def _no_tick() -> None:
    return None


def predict_rows(model: nn.Module, batcher: Batcher, batch_size: int, tick: Tick = _no_tick) -> torch.Tensor:
    """Predictions [S] (fp32, eval mode) for the split's samples in sample-index order.
    Out of memory halves the evaluation batch and starts over."""
    while True:
        oom = False
        try:
            return _forward_all(model, batcher, batch_size, tick)
        except Exception as exc:
            if not is_oom(exc) or batch_size == 1:
                raise
            oom = True
        if oom:
            release_memory()
            batch_size //= 2


@torch.no_grad()
def _forward_all(model: nn.Module, batcher: Batcher, batch_size: int, tick: Tick) -> torch.Tensor:
    was_training = model.training
    model.eval()
    out = []
    try:
        for b in batcher.eval_batches(batch_size):
            out.append(model(b.x).float())
            tick()
    finally:
        model.train(was_training)
    return torch.cat(out) if out else torch.zeros(0, device=batcher.device)


def predict(model: nn.Module, panel: Panel, split: str, device: torch.device | str,
            batch_size: int, tick: Tick = _no_tick) -> pd.DataFrame:
    """Long frame ``date, asset, pred, label`` (label = raw) of one split. With the trial's
    best weights and ``train.eval_batch_size`` its IC is exactly the stored val_ic / test_ic."""
    batcher = Batcher(panel, split, torch.device(device))
    pred = predict_rows(model, batcher, batch_size, tick).cpu().numpy()
    idx = batcher.index.cpu().numpy()
    t, i = idx[:, 0], idx[:, 1]
    label = panel.y_raw.cpu().numpy()[t, i] if len(t) else np.zeros(0, np.float32)
    return pd.DataFrame({"date": panel.dates[t], "asset": panel.assets[i], "pred": pred, "label": label})


def evaluate(model: nn.Module, panel: Panel, split: str, device: torch.device, batch_size: int,
             criterion: Loss, tick: Tick = _no_tick) -> dict[str, float]:
    """Per-epoch scores of a split: {val_loss, val_ic, val_rank_ic, val_icir} (vectorised torch)."""
    batcher = Batcher(panel, split, device)
    pred = predict_rows(model, batcher, batch_size, tick)
    start, stop = panel.splits[split]
    idx = batcher.index.to(pred.device)
    matrix = torch.full((stop - start, panel.y.shape[1]), math.nan, device=pred.device)
    matrix[idx[:, 0] - start, idx[:, 1]] = pred
    report = M.ic_report_torch(matrix, panel.y_raw[start:stop].to(pred.device))
    y = panel.y.to(pred.device)[idx[:, 0], idx[:, 1]]
    loss = float(criterion(pred, y, idx[:, 0])) if len(pred) else math.nan
    p = SPLIT_PREFIX[split]
    return {f"{p}_loss": loss, f"{p}_ic": report["ic"], f"{p}_rank_ic": report["rank_ic"],
            f"{p}_icir": report["icir"]}


Frames = dict[str, pd.DataFrame]  # split -> a frame of it


def final_scores(model: nn.Module, panel: Panel, device: torch.device, batch_size: int,
                 tick: Tick = _no_tick) -> tuple[dict[str, float], Frames, Frames]:
    """IC metrics, daily ICs and predictions of valid and test, from ``predict``'s frames."""
    scores: dict[str, float] = {}
    daily, predictions = {}, {}
    for split, p in SPLIT_PREFIX.items():
        frame = predict(model, panel, split, device, batch_size, tick)
        tick()
        report = M.ic_report(frame)
        scores.update({f"{p}_ic": report["ic"], f"{p}_rank_ic": report["rank_ic"],
                       f"{p}_icir": report["icir"]})
        daily[split], predictions[split] = M.daily_ic(frame), frame
    return scores, daily, predictions
