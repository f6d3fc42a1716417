"""Scoring a model on a split: predictions in sample order (halving the batch on OOM), the
per-epoch validation scores, and the final valid and test scores through ``predict``."""

import math
from collections.abc import Callable

import numpy as np
import pandas as pd
import torch
from torch import nn

from sweeper.core.batch_search import is_oom, release_memory
from sweeper.core.loss import Loss
from sweeper.data import Batcher, Panel
from sweeper.data.batches import gather_stack
from sweeper.data.scoring import own_scoring_panel
from sweeper.models.stacked.base import SoloStack
from sweeper.quant import ic as M

SPLIT_PREFIX = {"valid": "val", "test": "test"}
Tick = Callable[[], None]  # called once per evaluated batch: scoring is progress too


def predict_rows(model: nn.Module, batcher: Batcher, batch_size: int,
                 tick: Tick = lambda: None) -> torch.Tensor:
    """Predictions [S] (fp32, eval mode) for the split's samples in sample-index order: the one
    evaluation (:func:`stacked_predict_rows`) of ``model`` as a stack of one."""
    return stacked_predict_rows(SoloStack(model), [batcher], batch_size, tick)[0]


def predict(model: nn.Module, panel: Panel, split: str, device: torch.device | str,
            batch_size: int, tick: Tick = lambda: None) -> pd.DataFrame:
    """Long frame ``date, asset, pred, label`` (label = raw) of one split. With the trial's
    best weights and ``train.eval_batch_size`` its IC is exactly the stored val_ic, and on the
    panel's ``own_scoring_panel`` (every present row) test's is exactly the stored test_ic."""
    batcher = Batcher(panel, split, torch.device(device))
    return _frame(batcher, predict_rows(model, batcher, batch_size, tick))


def _frame(batcher: Batcher, rows: torch.Tensor) -> pd.DataFrame:
    """The long frame of a split's predictions in sample-index order."""
    panel, pred = batcher.panel, rows.cpu().numpy()
    idx = batcher.index.cpu().numpy()
    t, i = idx[:, 0], idx[:, 1]
    label = panel.y_raw.cpu().numpy()[t, i] if len(t) else np.zeros(0, np.float32)
    return pd.DataFrame({"date": panel.dates[t], "asset": panel.assets[i], "pred": pred, "label": label})


def split_scores(pred: torch.Tensor, batcher: Batcher, criterion: Loss) -> dict[str, float]:
    """Per-epoch scores of a split's predictions in sample-index order: {val_loss, val_ic, val_rank_ic,
    val_icir}."""
    panel, split = batcher.panel, batcher.split
    start, stop = panel.splits[split]
    idx = batcher.index.to(pred.device)
    matrix = torch.full((stop - start, panel.y.shape[1]), math.nan, device=pred.device)
    matrix[idx[:, 0] - start, idx[:, 1]] = pred
    report = M.ic_report_torch(matrix, panel.y_raw[start:stop].to(pred.device))
    y = panel.y.to(pred.device)[idx[:, 0], idx[:, 1]]
    loss = float(criterion(pred, y, idx[:, 0])) if len(pred) else math.nan
    p = SPLIT_PREFIX[split]
    return {f"{p}_loss": loss, **{f"{p}_{k}": report[k] for k in ("ic", "rank_ic", "icir")}}


def stacked_predict_rows(stack: nn.Module, batchers: list[Batcher], batch_size: int,
                         tick: Tick = lambda: None, limit: int | None = None) -> list[torch.Tensor]:
    """:func:`predict_rows` of every member of a stack at once (member k on ``batchers[k]``; ``limit``:
    its first rows only): one stacked forward per batch of ``batch_size`` rows per member, a shorter
    member padded with its own rows. Out of memory halves the batch and starts over."""
    while True:
        try:
            return _stacked_forward_all(stack, batchers, batch_size, tick, limit)
        except Exception as exc:
            if not is_oom(exc) or batch_size == 1:
                raise
        release_memory()  # outside the except: the traceback no longer pins what it held
        batch_size //= 2


@torch.no_grad()
def _stacked_forward_all(stack: nn.Module, batchers: list[Batcher], batch_size: int,
                         tick: Tick, limit: int | None) -> list[torch.Tensor]:
    was_training = stack.training
    stack.eval()
    out: list[list[torch.Tensor]] = [[] for _ in batchers]
    longest = max(batchers, key=lambda b: b.n_samples)  # it has rows in every batch
    # seeds of one fold: one gather for all
    same = all(b.same_split(longest) for b in batchers if b.n_samples)
    try:
        for start in range(0, min(longest.n_samples, limit or longest.n_samples), batch_size):
            width = min(batch_size, longest.n_samples - start)
            rows = [b.index[start:start + batch_size] for b in batchers]
            sizes = [len(r) for r in rows]
            # a member done already (a shorter split, or a run not scored on test) reads the longest
            # member's rows, and its output is dropped
            feed = [b if size else longest for b, size in zip(batchers, sizes)]
            rows = [r if size else longest.index[start:start + batch_size] for r, size in zip(rows, sizes)]
            pred = stack(gather_stack(feed, rows, width, same_rows=same).x).float()
            for k, size in enumerate(sizes):
                if size:
                    out[k].append(pred[k, :size])
            tick()
    finally:
        stack.train(was_training)
    return [torch.cat(parts) if parts else torch.zeros(0, device=b.device) for parts, b in zip(out, batchers)]


def _scoring(panel: Panel, made: dict[int, Panel]) -> Panel:
    """``panel`` with every present row of test scoreable, made once per panel; a run with no test dates
    (every run but the trial's model) keeps its own: no copy of its labels on the device for nothing."""
    start, stop = panel.splits["test"]
    if stop > start and id(panel) not in made:
        made[id(panel)] = own_scoring_panel(panel)
    return made.get(id(panel), panel)


Frames = dict[str, pd.DataFrame]  # split -> a frame of it
Scores = tuple[dict[str, float], Frames, Frames]  # IC metrics, daily ICs and predictions by split


def final_scores(stack: nn.Module, panels: list[Panel], device: torch.device, batch_size: int,
                 tick: Tick = lambda: None, valid: list[torch.Tensor] | None = None,
                 which: list[int] | None = None) -> list[Scores]:
    """Each member's IC metrics, daily ICs and predictions of valid (its labelled rows) and test (every
    present row, an unknown label NaN) (member k on ``panels[k]``; one stacked forward per batch): for a
    stack of one, with ``batch_size`` rows, exactly ``predict``'s. ``valid``: every member's valid
    predictions, known already (valid is then not predicted). ``which``: only these members'."""
    which = list(range(len(panels))) if which is None else which
    out: list[Scores] = [({}, {}, {}) for _ in which]
    # test is predicted on every present row, as ``sweeper predict`` does and as the trial's files keep
    # it: the labelled rows' scores are the same (the IC skips an unknown label), and the files need
    # no second pass over test (valid's rows are its labelled ones, as a rule)
    scoring: dict[int, Panel] = {}  # one per panel, so that seeds of one fold still share a gather
    for split, p in SPLIT_PREFIX.items():
        on = panels if split == "valid" else [_scoring(q, scoring) for q in panels]
        batchers = [Batcher(panel, split, device) for panel in on]
        known = valid if split == "valid" else None
        every = known or stacked_predict_rows(stack, batchers, batch_size, tick)
        for (scores, daily, predictions), batcher, rows in zip(
                out, [batchers[k] for k in which], [every[k] for k in which]):
            frame = _frame(batcher, rows)
            flagged = M.daily_ic(frame, flag_constant=True)
            report = M.report_of(flagged)
            scores.update({f"{p}_{k}": report[k] for k in ("ic", "rank_ic", "icir")})
            daily[split], predictions[split] = flagged.drop(columns="constant_pred"), frame
        tick()
    return out
