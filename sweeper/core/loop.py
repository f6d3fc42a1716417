"""The training loop: one trial's model trained on one device and scored on valid and test.

``train`` is one top-to-bottom loop in the manner of nanoGPT's train.py; the
other modules of :mod:`sweeper.core` only set things up, split a batch,
evaluate and pack state, so the loop is the one place to read to know what a
trial does, in order.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import cast

import pandas as pd
import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from sweeper.config import SweeperConfig
from sweeper.core.batch_plan import BatchPlan, plan_batch, shrink_micro
from sweeper.core.batch_search import attempt, release_memory
from sweeper.core.checkpoint import check_same_config, restore, training_state
from sweeper.core.device import TrialMemory, resolve_device, seed_everything, trial_memory
from sweeper.core.evaluate import evaluate, final_scores
from sweeper.core.hooks import Checkpointer, EpochHook, NullCheckpointer, NullHook
from sweeper.core.loss import resolve_loss
from sweeper.core.precision import resolve_precision
from sweeper.core.progress import EpochSteps, Progress, cpu_copy, epoch_line, mean
from sweeper.core.schedule import DateRuns, Rows, count_steps, epoch_rows, lr_factor, make_optimizer, rewind
from sweeper.core.step import train_step
from sweeper.data import Batcher, Panel
from sweeper.errors import Interrupted, NonFiniteLoss, StopReason
from sweeper.models import build_model

# Steps between host syncs. A step leaves its loss and non-finite flag on the device; the
# loop reads them every SYNC_EVERY steps and at the end of the epoch, so a small model's
# launch queue never drains. Non-finite patience is judged then, up to SYNC_EVERY steps late.
SYNC_EVERY = 32


@dataclass
class TrainResult:
    metrics: dict
    history: list[dict]
    best_state: dict
    daily: dict[str, pd.DataFrame]
    predictions: dict[str, pd.DataFrame]
    stopped_by_hook: bool = False
    stop_reason: StopReason = StopReason.EPOCHS   # EPOCHS | EARLY_STOP | PRUNED | TIME


def train(cfg: SweeperConfig, panel: Panel, *, device: torch.device | str | None = None,
          hook: EpochHook = NullHook(), checkpoint: Checkpointer = NullCheckpointer(),
          log: Callable[[str], None] | None = None, started: float | None = None,
          memory: TrialMemory | None = None, fixed_epochs: bool = False) -> TrainResult:
    """Train ``cfg.model`` on ``panel``'s train split; early-stop on valid; score valid and test
    with the best epoch's weights. Raises NonFiniteLoss, OutOfMemory, Interrupted.

    ``started`` (a ``time.monotonic()`` reading, default now) is when the run began: a sweep's
    worker passes the trial's start, so that ``train.max_minutes`` also counts loading the data.
    Past that deadline the epoch ends at the next step and the run is scored as usual.
    ``memory``: what the trial's memory is measured by (the batch probe, the peaks reported); by
    default the device's own (:func:`~sweeper.core.device.trial_memory`), where a CUDA probe plans
    within all the free memory. A trial given an allotment of a GPU it shares passes
    ``trial_memory(device, allotted_mb)``.
    ``fixed_epochs`` (``sweeper refit``, on a panel whose valid and test splits are empty): every
    one of ``train.epochs`` epochs runs, nothing is validated or scored, and ``best_state`` holds
    the last epoch's weights."""
    began = time.perf_counter()
    tc = cfg.train
    say = log or (lambda message: None)
    device = resolve_device(device)
    started = time.monotonic() if started is None else started
    deadline = started + tc.max_minutes * 60 if tc.max_minutes else math.inf
    tick = hook.tick
    seed_everything(tc.seed)

    # ---- setup: data, model, precision, optimizer, batch size, schedule
    panel = panel.to(device, cfg.data.device_share)
    model = build_model(cfg.model, len(panel.features), panel.lookback).to(device)
    precision = resolve_precision(tc.precision, device)
    criterion = resolve_loss(tc.loss)
    memory = trial_memory(device) if memory is None else memory
    optimizer = make_optimizer(model, tc.lr, tc.weight_decay)
    scaler = precision.scaler()
    batcher = Batcher(panel, "train", device)
    order = tc.resolved_batch_order
    runs = DateRuns(batcher) if order == "cross_section" else None
    date_rows = runs.largest if runs is not None and criterion.whole_dates else 1
    generator = torch.Generator().manual_seed(tc.seed)
    step_model = cast(nn.Module, torch.compile(model)) if tc.compile else model  # a compiled module is one
    state = checkpoint.load()
    if state is not None:
        check_same_config(state, cfg)
        plan = BatchPlan(int(state["batch_size"]), int(state["micro_batch_size"]), tc.eval_batch_size)
    else:
        plan = plan_batch(cfg, step_model, optimizer, precision, criterion, batcher, panel, memory.reader(),
                          date_rows)
    batch_size, micro, eval_batch = plan.batch_size, plan.micro_batch, plan.eval_batch_size
    steps_per_epoch = count_steps(batcher, order, batch_size, tc.samples_per_epoch)
    scheduler = LambdaLR(optimizer, lr_factor(tc.schedule, tc.warmup_frac, steps_per_epoch * tc.epochs))
    progress = Progress()
    if state is not None:
        restore(state, model, optimizer, scheduler, scaler, generator, progress)
        say(f"resumed after epoch {progress.epoch} (best {tc.early_stop_metric} {progress.best})")
    say(f"training {cfg.model.name} on {device}: {batcher.n_samples} samples, batch {batch_size} "
        f"(micro {micro}), {precision.name}, {steps_per_epoch} steps/epoch")
    if plan.note:
        say(plan.note)
    start_peak = memory.start_peak_mb(plan.peak_mem_mb)  # NaN: not known before an epoch measures it
    if not math.isnan(start_peak):
        hook.on_probe(start_peak)
    step = partial(train_step, step_model, list(model.parameters()), optimizer, scaler, precision,
                   batcher.gather, criterion=criterion, grad_clip=tc.grad_clip)
    shrink = partial(shrink_micro, minimum=tc.min_micro_batch, batch_size=batch_size, date_rows=date_rows)

    # ---- the epochs
    stop_reason = StopReason.EARLY_STOP if progress.bad_epochs >= tc.patience else StopReason.EPOCHS
    for epoch in range(progress.epoch + 1, tc.epochs + 1):
        if stop_reason != StopReason.EPOCHS:
            break
        model.train()
        memory.reset_peak()
        epoch_start, seen, steps = time.perf_counter(), 0, EpochSteps()
        for rows in epoch_rows(batcher, order, batch_size, generator, tc.samples_per_epoch, runs):
            if hook.should_stop():  # a flag read, not a device sync
                raise Interrupted(f"stop requested during epoch {epoch}; "
                                  f"the last checkpoint holds epoch {epoch - 1}")
            micro, loss, skipped = _step_until_it_fits(step, rows, micro, optimizer, shrink, say)
            steps.add(loss, skipped)
            scheduler.step()  # every step; the sync takes back the steps that turn out to have made no update
            seen += len(rows.idx)
            if steps.unread >= SYNC_EVERY:
                _sync(steps, progress, scheduler, tc.nonfinite_patience, epoch, tc.lr)
            if time.monotonic() > deadline:
                stop_reason = StopReason.TIME
                break
        # waits for the epoch's last step
        _sync(steps, progress, scheduler, tc.nonfinite_patience, epoch, tc.lr)
        train_seconds = time.perf_counter() - epoch_start
        optimizer.zero_grad(set_to_none=True)  # validation needs no gradients: their memory is free for it

        # ---- end of epoch: validate, keep the best weights, checkpoint, report
        scores = (dict.fromkeys(("val_loss", "val_ic", "val_rank_ic", "val_icir"), math.nan) if fixed_epochs
                  else evaluate(step_model, panel, "valid", device, eval_batch, criterion, tick))
        metrics = {"epoch": epoch, "train_loss": steps.mean_loss, **scores,
                   "samples_per_s": seen / max(train_seconds, 1e-9), "peak_mem_mb": memory.peak_mb(),
                   "lr": scheduler.get_last_lr()[0], "micro_batch_size": micro,
                   "accum_steps": math.ceil(batch_size / micro)}
        progress.record(epoch, metrics, tc.early_stop_metric, model)
        say(epoch_line(metrics, tc.epochs))
        # report first, then save: a checkpoint never holds an epoch the hook has not seen
        # (a kill in between re-runs and re-reports that epoch rather than losing its report)
        if hook.on_epoch(epoch, metrics):
            stop_reason = StopReason.PRUNED
        elif progress.bad_epochs >= tc.patience and stop_reason == StopReason.EPOCHS and not fixed_epochs:
            stop_reason = StopReason.EARLY_STOP
        elif stop_reason == StopReason.EPOCHS and epoch < tc.epochs and time.monotonic() > deadline:
            stop_reason = StopReason.TIME  # the time ran out while validating: no new epoch for one step
        if not isinstance(checkpoint, NullCheckpointer):  # spare the CPU copies when nobody keeps them
            checkpoint.save(training_state(cfg, model, optimizer, scheduler, scaler, generator, progress,
                                           batch_size, micro))

    if fixed_epochs:  # the last epoch's weights, with no valid or test split to score them on
        return TrainResult({"epochs_run": progress.epoch, "train_loss": progress.history[-1]["train_loss"],
                            "batch_size": batch_size, "micro_batch_size": micro, "precision": precision.name,
                            "duration_s": time.perf_counter() - began}, progress.history,
                           cpu_copy(model.state_dict()), {}, {}, stop_reason=stop_reason)

    # ---- score valid and test with the best weights, through the same path as `predict`
    model.load_state_dict(progress.best_state)
    final, daily, predictions = final_scores(model, panel, device, eval_batch, tick)
    result_metrics: dict[str, float | str] = {**final}  # with the run's figures, and its precision's name
    result_metrics.update(
        val_loss=progress.best_metrics.get("val_loss", math.nan), best_epoch=progress.best_epoch,
        epochs_run=progress.epoch, batch_size=batch_size, micro_batch_size=micro,
        accum_steps=math.ceil(batch_size / micro), eval_batch_size=eval_batch, precision=precision.name,
        samples_per_s=mean([h["samples_per_s"] for h in progress.history]),
        peak_mem_mb=max([h["peak_mem_mb"] for h in progress.history], default=math.nan),
        probe_peak_mem_mb=plan.peak_mem_mb, duration_s=time.perf_counter() - began)
    if panel.oracle_ic:
        result_metrics.update(oracle_val_ic=panel.oracle_ic["valid"], oracle_test_ic=panel.oracle_ic["test"])
    say(f"done ({stop_reason}): best epoch {progress.best_epoch}, val_ic {result_metrics['val_ic']:.4f}, "
        f"test_ic {result_metrics['test_ic']:.4f}")
    return TrainResult(result_metrics, progress.history, progress.best_state, daily, predictions,
                       stopped_by_hook=stop_reason == StopReason.PRUNED, stop_reason=stop_reason)


def _step_until_it_fits(step: Callable[..., tuple[torch.Tensor, torch.Tensor]], rows: Rows, micro: int,
                        optimizer: torch.optim.Optimizer, shrink: Callable[[int], int],
                        say: Callable[[str], None]) -> tuple[int, torch.Tensor, torch.Tensor]:
    """One optimizer step: (micro-batch, loss, skip flag). An OOM anywhere in it (gather, forward,
    backward, clipping, the update and AdamW's first allocation of its state) redoes the
    same step from scratch in micro-batches half the size."""
    while True:
        ok, out = attempt(step, rows, micro)
        if ok:
            return (micro, *out)
        optimizer.zero_grad(set_to_none=True)
        release_memory()  # outside the except: the traceback no longer pins activations
        micro = shrink(micro)
        say(f"out of memory: micro-batch now {micro}, accumulating {math.ceil(len(rows.idx) / micro)}")


def _sync(steps: EpochSteps, progress: Progress, scheduler: LambdaLR, patience: int, epoch: int,
          lr: float) -> None:
    """Read the pending steps: judge non-finite patience, and take back the schedule steps
    of the steps that made no update (the LR ran ahead by that many since the last sync)."""
    skipped, exhausted = steps.sync(progress, patience)
    if exhausted:
        raise NonFiniteLoss(f"loss or gradients non-finite for {progress.nonfinite_steps} consecutive "
                            f"steps (epoch {epoch}, train.lr={lr:g})")
    rewind(scheduler, skipped)
