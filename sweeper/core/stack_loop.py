"""The stacked loop: K training runs of one model shape trained as one model (HFTA).

``train_stack`` is ``train`` for K members at once: every step runs one forward and one backward
of the stacked model (:mod:`sweeper.models.stacked`) over every member's own batch, then one
per-member AdamW step (:mod:`sweeper.core.stack_optim`). Each member keeps everything a lone
run has: its fold's panel and normalisation, its seed (initialisation, dropout, batch order),
its schedule, its own early stopping and best epoch, its valid scores; its result is the
:class:`~sweeper.core.loop.TrainResult` its lone run would return.

A member that stops early is masked, not dropped: it stays in the stack (its share of each
step's arithmetic is spent) and makes no update, so the stack's shapes, its flat buffers and
the probed micro-batch stay as they were. A member whose epoch has fewer batches than another's
(a shorter walk-forward fold) is masked for the remaining steps of that epoch the same way.
The stack ends when every member has stopped, when the hook prunes the trial (the mean of the
members' values at an epoch, one value per epoch), or when ``train.max_minutes`` runs out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch

from sweeper.config import SweeperConfig, to_dict
from sweeper.core.batch_plan import shrink_micro
from sweeper.core.checkpoint import (
    check_same_config,
    progress_state,
    restore_progress,
    rng_state,
    set_rng_state,
)
from sweeper.core.device import TrialMemory, resolve_device, seed_everything, trial_memory
from sweeper.core.evaluate import final_scores, split_scores, stacked_predict_rows
from sweeper.core.hooks import Checkpointer, EpochHook, NullCheckpointer, NullHook
from sweeper.core.loop import SYNC_EVERY, TrainResult
from sweeper.core.loss import Loss, resolve_loss
from sweeper.core.precision import Precision, resolve_precision
from sweeper.core.progress import EpochSteps, epoch_line, mean
from sweeper.core.schedule import DateRuns, count_steps, epoch_rows, lr_factor
from sweeper.core.stack_optim import FlatStack, MemberScaler, StackedAdamW
from sweeper.core.stack_step import Lane, StackStep, plan_stack
from sweeper.data import Batcher, Panel
from sweeper.errors import Interrupted, NonFiniteLoss, StopReason
from sweeper.models import build_model
from sweeper.models.stacked.base import StackedModule
from sweeper.models.stacked.build import build_stack


@dataclass
class Member:
    """One run of a stack: its config (its own ``train.seed``) and its fold's panel."""

    cfg: SweeperConfig
    panel: Panel


def train_stack(
    members: Sequence[Member],
    *,
    device: torch.device | str | None = None,
    hook: EpochHook = NullHook(),
    checkpoint: Checkpointer = NullCheckpointer(),
    log: Callable[[str], None] | None = None,
    started: float | None = None,
    memory: TrialMemory | None = None,
) -> list[TrainResult]:
    """Train ``members`` (one model shape; ``train`` settings alike but the seed) as one stack;
    each member's result as its lone run's. ``checkpoint`` keeps the whole stack after every
    epoch and a retry continues it there. Raises NonFiniteLoss, OutOfMemory, Interrupted."""
    began = time.perf_counter()
    tc = members[0].cfg.train
    say = log or (lambda message: None)
    device = resolve_device(device)
    started = time.monotonic() if started is None else started
    deadline = started + tc.max_minutes * 60 if tc.max_minutes else math.inf

    # ---- setup: each member's data and one-member model, then the stack of their weights
    criterion, precision = resolve_loss(tc.loss), resolve_precision(tc.precision, device)
    lanes = [_lane(m, device) for m in members]
    stack = build_stack(
        [m.cfg.model for m in members],
        len(members[0].panel.features),
        members[0].panel.lookback,
        [lane.solo for lane in lanes],
    ).to(device)
    say(stack.plan)
    dropout = stack.seed_members([m.cfg.train.seed for m in members], device)
    flat = FlatStack(stack)
    optimizer = StackedAdamW(
        flat, [m.cfg.train.lr for m in members], [m.cfg.train.weight_decay for m in members], tc.grad_clip
    )
    scaler = MemberScaler(len(members), device, precision.name == "fp16")
    memory = trial_memory(device) if memory is None else memory
    date_rows = max(
        lane.runs.largest if lane.runs is not None and criterion.whole_dates else 1 for lane in lanes
    )
    step = StackStep(stack, flat, optimizer, scaler, precision, criterion, lanes)
    state = checkpoint.load()
    first, peak = 1, math.nan
    if state is not None:
        check_same_config(state, members[0].cfg)
        first = _restore(state, lanes, flat, optimizer, scaler, dropout) + 1
        batch_size, micro = int(state["batch_size"]), int(state["micro_batch_size"])
        say(f"resumed the stack after epoch {first - 1}")
    else:
        batch_size, micro, peak = plan_stack(
            step, tc, _batch_size(tc.batch_size, tc.max_batch_size, lanes), memory.reader(), date_rows, say
        )
    say(
        f"training a stack of {len(members)} {members[0].cfg.model.name} on {device}: batch {batch_size} "
        f"(micro {micro}), {precision.name}, {max(lane.steps_per_epoch for lane in lanes)} steps/epoch"
    )
    start_peak = memory.start_peak_mb(peak)  # NaN: not known before an epoch measures it
    if not math.isnan(start_peak):
        hook.on_probe(start_peak)
    shrink = partial(shrink_micro, minimum=tc.min_micro_batch, batch_size=batch_size, date_rows=date_rows)

    # ---- the epochs
    stop_reason = StopReason.EARLY_STOP if all(lane.stopped for lane in lanes) else StopReason.EPOCHS
    for epoch in range(first, tc.epochs + 1):
        if stop_reason != StopReason.EPOCHS:
            break
        stack.train()
        memory.reset_peak()
        epoch_start = time.perf_counter()
        for lane in lanes:
            lane.rows = (
                None
                if lane.stopped
                else epoch_rows(
                    lane.batcher,
                    tc.resolved_batch_order,
                    batch_size,
                    lane.generator,
                    tc.samples_per_epoch,
                    lane.runs,
                )
            )
            lane.steps, lane.seen = EpochSteps(), 0
        while True:
            batch = [next(lane.rows, None) if lane.rows is not None else None for lane in lanes]
            if all(rows is None for rows in batch):
                break
            if hook.should_stop():
                raise Interrupted(
                    f"stop requested during epoch {epoch}; the last checkpoint holds epoch {epoch - 1}"
                )
            micro = step.until_it_fits(batch, micro, shrink, say)
            if max(lane.steps.unread for lane in lanes) >= SYNC_EVERY:
                _sync(lanes, tc.nonfinite_patience, epoch)
            if time.monotonic() > deadline:
                stop_reason = StopReason.TIME
                break
        _sync(lanes, tc.nonfinite_patience, epoch)
        seconds = time.perf_counter() - epoch_start
        flat.zero_grad()

        # ---- end of epoch: each member validates and keeps its best weights; the hook hears the stack
        rows = _validate(
            lanes, stack, epoch, seconds, memory.peak_mb(), micro, batch_size, criterion, hook.tick
        )
        for row in rows:
            if row is not None:
                say(epoch_line(row, tc.epochs))
        if hook.on_stack_epoch(epoch, rows):
            stop_reason = StopReason.PRUNED
        elif all(lane.stopped for lane in lanes):
            stop_reason = StopReason.EARLY_STOP
        elif stop_reason == StopReason.EPOCHS and epoch < tc.epochs and time.monotonic() > deadline:
            stop_reason = StopReason.TIME
        if not isinstance(checkpoint, NullCheckpointer):  # spare the CPU copies when nobody keeps them
            checkpoint.save(
                _state(members[0].cfg, epoch, lanes, flat, optimizer, scaler, dropout, batch_size, micro)
            )

    # ---- score valid and test with each member's best weights, as a lone run does
    return [
        _finish(lane, device, stop_reason, batch_size, micro, precision, began, hook.tick, say)
        for lane in lanes
    ]


def _state(
    cfg: SweeperConfig,
    epoch: int,
    lanes: list[Lane],
    flat: FlatStack,
    optimizer: StackedAdamW,
    scaler: MemberScaler,
    dropout: list[torch.Generator],
    batch_size: int,
    micro: int,
) -> dict:
    """The whole stack after ``epoch``: weights, optimizer and scales, and each member's own
    generators, schedule position and progress (its best weights among them)."""
    return {
        "epoch": epoch,
        "kind": "stack",
        "values": flat.values.detach().to("cpu", copy=True),
        "optimizer": {k: v.to("cpu", copy=True) for k, v in optimizer.state_dict().items()},
        "scaler": {"scale": scaler.scale_.cpu(), "good": scaler.good.cpu()},
        "rng": rng_state(lanes[0].generator),
        "members": [
            {
                "batches": lane.generator.get_state(),
                "dropout": gen.get_state().cpu(),
                "position": lane.position,
                "stopped": lane.stopped,
                **progress_state(lane.progress),
            }
            for lane, gen in zip(lanes, dropout)
        ],
        "batch_size": batch_size,
        "micro_batch_size": micro,
        "config": to_dict(cfg),
    }


def _restore(
    state: dict,
    lanes: list[Lane],
    flat: FlatStack,
    optimizer: StackedAdamW,
    scaler: MemberScaler,
    dropout: list[torch.Generator],
) -> int:
    """Continue from :func:`_state`; returns the epoch it holds."""
    if state.get("kind") != "stack" or len(state["members"]) != len(lanes):
        raise ValueError("the checkpoint is not this stack's")
    with torch.no_grad():
        flat.values.copy_(state["values"])
    optimizer.load_state_dict(state["optimizer"])
    scaler.scale_.copy_(state["scaler"]["scale"])
    scaler.good.copy_(state["scaler"]["good"])
    set_rng_state(state["rng"], lanes[0].generator)
    for lane, gen, saved in zip(lanes, dropout, state["members"]):
        lane.generator.set_state(saved["batches"])
        gen.set_state(saved["dropout"].cpu())  # a generator's state is a CPU tensor, a CUDA one's too
        lane.position, lane.stopped = int(saved["position"]), bool(saved["stopped"])
        restore_progress(saved, lane.progress, int(state["epoch"]))
    return int(state["epoch"])


def _lane(member: Member, device: torch.device) -> Lane:
    cfg, tc = member.cfg, member.cfg.train
    seed_everything(tc.seed)  # the member's initial weights are its lone run's, draw for draw
    panel = member.panel.to(device, cfg.data.device_share)
    solo = build_model(cfg.model, len(panel.features), panel.lookback).to(device)
    batcher = Batcher(panel, "train", device)
    order = tc.resolved_batch_order
    size = _batch_size(tc.batch_size, tc.max_batch_size, [batcher])
    steps = count_steps(batcher, order, size, tc.samples_per_epoch)
    return Lane(
        cfg,
        panel,
        batcher,
        Batcher(panel, "valid", device),
        torch.Generator().manual_seed(tc.seed),
        DateRuns(batcher) if order == "cross_section" else None,
        steps,
        lr_factor(tc.schedule, tc.warmup_frac, steps * tc.epochs),
        solo,
    )


def _batch_size(batch_size: int | str, max_batch_size: int, lanes: Sequence[Lane] | Sequence[Batcher]) -> int:
    """``train.batch_size`` capped at the smallest member's train split (``auto``: its cap)."""
    samples = min((x.batcher if isinstance(x, Lane) else x).n_samples for x in lanes)
    return min(max_batch_size if batch_size == "auto" else int(batch_size), max(1, samples))


def _sync(lanes: list[Lane], patience: int, epoch: int) -> None:
    """Each member's pending steps read back (non-finite patience judged per member) and its
    schedule taken back by the steps that made no update, as the lone loop's ``_sync``."""
    for index, lane in enumerate(lanes):
        skipped, exhausted = lane.steps.sync(lane.progress, patience)
        if exhausted:
            raise NonFiniteLoss(
                f"loss or gradients non-finite for {lane.progress.nonfinite_steps} consecutive "
                f"steps (stack member {index + 1}, epoch {epoch}, train.lr={lane.cfg.train.lr:g})"
            )
        lane.position -= skipped


def _validate(
    lanes: list[Lane],
    stack: StackedModule,
    epoch: int,
    seconds: float,
    peak_mb: float,
    micro: int,
    batch_size: int,
    criterion: Loss,
    tick: Callable[[], None],
) -> list[dict | None]:
    """Every member still training scored on its valid block (one stacked forward per batch);
    each keeps its best epoch's weights and stops when its patience runs out. None: stopped."""
    live = [k for k, lane in enumerate(lanes) if not lane.stopped]
    tc = lanes[0].cfg.train
    preds = stacked_predict_rows(
        stack, [lanes[k].valid for k in live], max(1, tc.eval_batch_size // len(lanes)), tick
    )
    rows: list[dict | None] = [None] * len(lanes)
    for k, pred in zip(live, preds):
        lane = lanes[k]
        metrics = {
            "epoch": epoch,
            "train_loss": lane.steps.mean_loss,
            **split_scores(pred, lane.valid, criterion),
            "samples_per_s": lane.seen / max(seconds, 1e-9),
            "peak_mem_mb": peak_mb,
            "lr": lane.cfg.train.lr * lane.factor(max(lane.position - 1, 0)),
            "micro_batch_size": micro,
            "accum_steps": math.ceil(batch_size / micro),
        }
        lane.solo.load_state_dict(stack.member_state(k))  # what the progress keeps, if this epoch is its best
        lane.progress.record(epoch, metrics, lane.cfg.train.early_stop_metric, lane.solo)
        if lane.progress.bad_epochs >= lane.cfg.train.patience:
            lane.stopped = True  # masked from now on: it keeps its best epoch and changes no more
        rows[k] = metrics
    return rows


def _finish(
    lane: Lane,
    device: torch.device,
    stop_reason: StopReason,
    batch_size: int,
    micro: int,
    precision: Precision,
    began: float,
    tick: Callable[[], None],
    say: Callable[[str], None],
) -> TrainResult:
    tc, progress = lane.cfg.train, lane.progress
    lane.solo.load_state_dict(progress.best_state)
    final, daily, predictions = final_scores(lane.solo, lane.panel, device, tc.eval_batch_size, tick)
    metrics: dict[str, float | str] = {**final}
    metrics.update(
        val_loss=progress.best_metrics.get("val_loss", math.nan),
        best_epoch=progress.best_epoch,
        epochs_run=progress.epoch,
        batch_size=batch_size,
        micro_batch_size=micro,
        accum_steps=math.ceil(batch_size / micro),
        eval_batch_size=tc.eval_batch_size,
        precision=precision.name,
        samples_per_s=mean([h["samples_per_s"] for h in progress.history]),
        peak_mem_mb=max([h["peak_mem_mb"] for h in progress.history], default=math.nan),
        probe_peak_mem_mb=math.nan,
        duration_s=time.perf_counter() - began,
    )
    if lane.panel.oracle_ic:
        metrics.update(
            oracle_val_ic=lane.panel.oracle_ic["valid"], oracle_test_ic=lane.panel.oracle_ic["test"]
        )
    reason = StopReason.EARLY_STOP if lane.stopped and stop_reason == StopReason.EARLY_STOP else stop_reason
    if lane.stopped and stop_reason == StopReason.EPOCHS:
        reason = StopReason.EARLY_STOP
    say(
        f"done ({reason}): train.seed {tc.seed}, best epoch {progress.best_epoch}, "
        f"val_ic {metrics['val_ic']:.4f}, test_ic {metrics['test_ic']:.4f}"
    )
    return TrainResult(
        metrics,
        progress.history,
        progress.best_state,
        daily,
        predictions,
        stopped_by_hook=reason == StopReason.PRUNED,
        stop_reason=reason,
    )
