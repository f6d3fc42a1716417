"""The training loop: K training runs of one model shape trained as one model (HFTA), K >= 1.

Every run trains here, a lone run as a stack of one. Each step runs one forward and one backward
of the stacked model (:mod:`sweeper.models.stacked`) over every member's own batch, then one
per-member AdamW step (:mod:`sweeper.core.optim`). Each member keeps everything a run has (its
fold's panel, its seed, schedule, early stopping, best epoch and scores) and gets its own
:class:`TrainResult`. A stack of one calls the kernels of its model and of torch's AdamW, so it
computes what a run of that model alone computes, bit for bit on the CPU.

A member that stops early, or whose epoch has fewer batches (a shorter walk-forward fold), is masked, not
dropped: it stays in the stack and makes no update, so the stack's shapes, its flat buffers and the probed
micro-batch stay as they were. The stack ends when every member has stopped, when the hook prunes the trial,
or when ``train.max_minutes`` runs out.

Read :func:`train_stack` top to bottom, as nanoGPT's train.py: set-up, the epochs, the scores."""

import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import pandas as pd
import torch

from sweeper.config import SweeperConfig
from sweeper.core.batch_plan import BatchPlan, shrink_micro
from sweeper.core.checkpoint import config_mismatch, restore_stack, stack_state
from sweeper.core.device import TrialMemory, resolve_device, trial_memory
from sweeper.core.evaluate import Scores, final_scores, split_scores, stacked_predict_rows
from sweeper.core.hooks import Checkpointer, EpochHook, NullCheckpointer, NullHook
from sweeper.core.lanes import Member, build_lane, lane_batch_size
from sweeper.core.loss import LOSSES
from sweeper.core.optim import FlatStack, MemberScaler, StackedAdamW
from sweeper.core.precision import Precision, resolve_precision
from sweeper.core.progress import epoch_line, mean
from sweeper.core.schedule import epoch_rows
from sweeper.core.step import Lane, StackStep, plan_stack
from sweeper.data import Panel
from sweeper.errors import ConfigError, Interrupted, NonFiniteLoss, StopReason
from sweeper.models.stacked.build import build_stack

# Steps between host syncs. A step leaves its loss and non-finite flag on the device; the
# loop reads them every SYNC_EVERY steps and at the end of the epoch, so a small model's
# launch queue never drains. Non-finite patience is judged then, up to SYNC_EVERY steps late.
SYNC_EVERY = 32
NO_SCORES = dict.fromkeys(("val_loss", "val_ic", "val_rank_ic", "val_icir"), math.nan)


@dataclass
class TrainResult:
    metrics: dict
    history: list[dict]
    best_state: dict
    daily: dict[str, pd.DataFrame]
    predictions: dict[str, pd.DataFrame]
    stopped_by_hook: bool = False
    stop_reason: StopReason = StopReason.EPOCHS   # EPOCHS | EARLY_STOP | PRUNED | TIME
    failure: str | None = None  # NonFiniteLoss's message: the member failed (a population's, see _sync)


def train(cfg: SweeperConfig, panel: Panel, **kwargs: Any) -> TrainResult:
    """One run of ``cfg`` on ``panel``: the stack of one member (``train_stack``'s keywords)."""
    return train_stack([Member(cfg, panel)], **kwargs)[0]


@dataclass
class Run:
    """What the loop sets up once and every epoch uses."""

    lanes: list[Lane]
    step: StackStep
    plan: BatchPlan
    precision: Precision
    memory: TrialMemory
    deadline: float
    first_epoch: int
    shrink: Callable[[int], int]
    micro: int = 0  # the micro-batch now: the plan's, halved by each OOM
    began: float = 0.0  # time.perf_counter() when train_stack began: each result's duration_s
    say: Callable[[str], None] = lambda line: None  # the log (train_stack sets both)


def train_stack(members: Sequence[Member], *, device: torch.device | str | None = None,
                hook: EpochHook = NullHook(), checkpoint: Checkpointer = NullCheckpointer(),
                log: Callable[[str], None] | None = None, started: float | None = None,
                memory: TrialMemory | None = None, fixed_epochs: bool = False) -> list[TrainResult]:
    """Train ``members`` (one model shape; ``train`` settings alike but the per-member ones) as one stack;
    early-stop each on its valid split; score valid and test with its best epoch's weights. Raises
    NonFiniteLoss, OutOfMemory, Interrupted. ``started`` (``time.monotonic()``, default now): a worker
    passes the trial's start, so that ``train.max_minutes`` also counts loading the data. ``memory``: what
    the probe and the peaks measure (default the device's own). ``checkpoint`` keeps the stack after every
    epoch; a retry continues it there. ``fixed_epochs`` (``sweeper refit``, empty valid and test splits):
    every epoch runs, nothing is scored, and each ``best_state`` holds the last epoch's weights."""
    began = time.perf_counter()
    say = log or (lambda message: None)
    where = resolve_device(device)
    run = prepare(members, where, checkpoint, memory or trial_memory(where), started, say, hook)
    run.began, run.say = began, say
    tc, lanes = members[0].cfg.train, run.lanes
    epochs = max(m.cfg.train.epochs for m in members)  # a member with fewer stops when they are done
    stop_reason = StopReason.EARLY_STOP if all(lane.stopped for lane in lanes) else StopReason.EPOCHS
    for epoch in range(run.first_epoch, epochs + 1):
        if stop_reason != StopReason.EPOCHS:
            break
        stop_reason, seconds = _train_epoch(run, epoch, hook, tc.resolved_batch_order)
        # ---- end of epoch: each member validates and keeps its best weights; the hook hears the stack
        rows = _validate(run, epoch, seconds, hook.tick, fixed_epochs, say)
        # report first, then save: a checkpoint never holds an epoch the hook has not seen
        # (a kill in between re-runs and re-reports that epoch rather than losing its report)
        stop_reason = _judge(run, epoch, epochs, hook.on_epoch(epoch, rows), hook, stop_reason)
        if not isinstance(checkpoint, NullCheckpointer):  # spare the CPU copies when nobody keeps them
            checkpoint.save(stack_state(members[0].cfg, epoch, run.lanes, run.step, run.plan))
    # ---- score valid and test with each member's best weights (one stacked forward per batch)
    if fixed_epochs:  # refit: the last epoch's weights, with no split to score them on
        return [_fixed(run, k, stop_reason, began) for k in range(len(run.lanes))]
    _finish(run, stop_reason, hook.tick, [k for k, lane in enumerate(lanes) if lane.result is None])
    return [lane.result for lane in lanes if lane.result is not None]


def _judge(run: Run, epoch: int, epochs: int, pruned: bool, hook: EpochHook,
           reason: StopReason) -> StopReason:
    """Whether the stack goes on after ``epoch``: pruned, every member stopped, or out of time; the members
    the hook stops alone (a population's pruned trial) and those whose own epochs are done are masked."""
    lanes = run.lanes
    if pruned:
        return StopReason.PRUNED
    # a pruned trial's members, with those its patience stopped this epoch (a later stack would train them)
    alone = list(hook.members_to_stop())
    _stop(lanes, alone, StopReason.PRUNED)
    done = [k for k, lane in enumerate(lanes) if lane.cfg.train.epochs == epoch < epochs]
    _stop(lanes, done, StopReason.EPOCHS)
    if all(lane.stopped for lane in lanes):
        return StopReason.EARLY_STOP
    if alone:  # pruned while the others train on: scored now, so that their trial ends now
        hook.members_done(dict(zip(alone, _finish(run, reason, hook.tick, alone))))
    if reason == StopReason.EPOCHS and epoch < epochs and time.monotonic() > run.deadline:
        return StopReason.TIME  # the time ran out while validating: no new epoch for one step
    return reason


def prepare(members: Sequence[Member], device: torch.device, checkpoint: Checkpointer, memory: TrialMemory,
            started: float | None, say: Callable[[str], None], hook: EpochHook) -> Run:
    """The stack of ``members`` set up to train: its batch plan (probed, or the checkpoint's) and the
    checkpoint's state if there is one."""
    cfg, tc = members[0].cfg, members[0].cfg.train
    started = time.monotonic() if started is None else started
    step = stack_step(members, device)
    lanes, criterion, precision = step.lanes, step.criterion, step.precision
    if len(members) > 1:  # a lone run has nothing to say of stacking
        say(step.stack.plan)
    date_rows = max(lane.runs.largest if lane.runs is not None and criterion.whole_dates else 1
                    for lane in lanes)
    if (state := checkpoint.load()) is not None:
        if problem := config_mismatch(state.get("config", {}), cfg):  # it continues only its own run
            raise ConfigError(problem)
        first = restore_stack(state, step) + 1
        plan = BatchPlan(int(state["batch_size"]), int(state["micro_batch_size"]),
                         int(state.get("eval_batch_size", max(1, tc.resolved_eval_batch_size // len(lanes)))))
        say(f"resumed {'the stack ' if len(lanes) > 1 else ''}after epoch {first - 1}")
    else:
        first, plan = 1, plan_stack(step, tc, lane_batch_size(tc, lanes), memory.reader(), date_rows)
    name = lanes[0].cfg.model.name
    what = name if len(lanes) == 1 else f"a stack of {len(lanes)} {name}"
    say(f"training {what} on {device}: {sum(lane.batcher.n_samples for lane in lanes)} samples, "
        f"batch {plan.batch_size} (micro {plan.micro_batch}), {precision.name}, "
        f"{max(lane.steps_per_epoch for lane in lanes)} steps/epoch")
    if plan.note:
        say(plan.note)
    start_peak = memory.start_peak_mb(plan.peak_mem_mb)  # NaN: not known before an epoch measures it
    if not math.isnan(start_peak):
        hook.on_probe(start_peak)
    deadline = started + tc.max_minutes * 60 if tc.max_minutes else math.inf
    shrink = partial(shrink_micro, minimum=tc.min_micro_batch, batch_size=plan.batch_size,
                     date_rows=date_rows)
    return Run(lanes, step, plan, precision, memory, deadline, first, shrink, plan.micro_batch)


def stack_step(members: Sequence[Member], device: torch.device,
               models: Sequence[torch.nn.Module] | None = None) -> StackStep:
    """The stack of ``members`` ready to step: their lanes, the stack of their one-member models
    (``models``: others of their config to stack instead), its per-member AdamW, scales and loss."""
    tc = members[0].cfg.train
    criterion, precision = LOSSES[tc.loss], resolve_precision(tc.precision, device)
    built = [build_lane(m, device) for m in members]
    lanes = [lane for lane, _ in built]
    solos = list(models) if models is not None else [solo for _, solo in built]
    stack = build_stack([m.cfg.model for m in members], len(members[0].panel.features),
                        members[0].panel.lookback, solos).to(device)
    dropout = stack.seed_members([m.cfg.train.seed for m in members], device, [lane.rng for lane in lanes])
    flat = FlatStack(stack)
    optimizer = StackedAdamW(flat, [m.cfg.train.lr for m in members],
                             [m.cfg.train.weight_decay for m in members], tc.grad_clip)
    scaler = MemberScaler(len(members), device, precision.name == "fp16")
    # a compiled module is one (torch.compile returns the module's OptimizedModule)
    forward = cast(torch.nn.Module, torch.compile(stack)) if tc.compile else stack
    return StackStep(stack, forward, flat, optimizer, scaler, precision, criterion, lanes, dropout)


def _train_epoch(run: Run, epoch: int, hook: EpochHook, order: str) -> tuple[StopReason, float]:
    """One epoch's steps, each member on its own batches: (TIME if the deadline passed, seconds)."""
    tc, lanes = run.lanes[0].cfg.train, run.lanes
    run.step.forward.train()
    run.memory.reset_peak()
    began, reason = time.perf_counter(), StopReason.EPOCHS
    for lane in lanes:
        lane.rows = None if lane.stopped else epoch_rows(lane.batcher, order, run.plan.batch_size,
                                                         lane.generator, tc.samples_per_epoch, lane.runs)
        lane.new_epoch()
    micro = run.micro
    while True:
        batch = [next(lane.rows, None) if lane.rows is not None else None for lane in lanes]
        if all(rows is None for rows in batch):
            break
        if hook.should_stop():  # a flag read, not a device sync
            raise Interrupted(f"stop requested during epoch {epoch}; "
                              f"the last checkpoint holds epoch {epoch - 1}")
        micro = run.step.until_it_fits(batch, micro, run.shrink, run.say)
        if max(lane.steps.unread for lane in lanes) >= SYNC_EVERY:
            _sync(lanes, hook, epoch)
        if time.monotonic() > run.deadline:
            reason = StopReason.TIME
            break
    _sync(lanes, hook, epoch)  # waits for the epoch's last step
    run.micro = micro
    run.step.flat.zero_grad()  # validation needs no gradients: their memory is free for it
    return reason, time.perf_counter() - began


def _sync(lanes: list[Lane], hook: EpochHook, epoch: int) -> None:
    """Each member's pending steps read back (non-finite patience judged per member) and its
    schedule taken back by the steps that made no update (the schedule ran ahead by that many). A
    member past its patience ends the stack (NonFiniteLoss), or where the hook says (a population's
    member) stops with its trial's members, the others training on."""
    for index, lane in enumerate(lanes):
        skipped, exhausted = lane.steps.sync(lane.progress, lane.cfg.train.nonfinite_patience)
        lane.position -= skipped
        if not exhausted:
            continue
        member = f"stack member {index + 1}, " if len(lanes) > 1 else ""
        error = NonFiniteLoss(f"loss or gradients non-finite for {lane.progress.nonfinite_steps} "
                              f"consecutive steps ({member}epoch {epoch}, train.lr={lane.cfg.train.lr:g})")
        if (others := hook.member_failed(index, str(error))) is None:
            raise error
        lane.failure = str(error)
        _stop(lanes, [index, *others], StopReason.EARLY_STOP)


def _stop(lanes: list[Lane], which: Collection[int], reason: StopReason) -> None:
    """Members masked from now on, mid-epoch too (they make no more steps), and why."""
    for lane in (lanes[k] for k in which):
        lane.stopped, lane.rows, lane.reason = True, None, lane.reason or reason


def _validate(run: Run, epoch: int, seconds: float, tick: Callable[[], None], fixed_epochs: bool,
              say: Callable[[str], None]) -> list[dict | None]:
    """Each training member's valid scores (one stacked forward per batch), its line logged, its best
    weights kept, stopped when its patience runs out; None for a stopped one."""
    lanes, step, plan = run.lanes, run.step, run.plan
    live = [k for k, lane in enumerate(lanes) if not lane.stopped]
    # the stack's forward takes every member's rows (a stopped one's too, its predictions unused)
    every: list[torch.Tensor | None] = [None] * len(lanes) if fixed_epochs else list(
        stacked_predict_rows(step.forward, [lane.valid for lane in lanes], plan.eval_batch_size, tick))
    rows: list[dict | None] = [None] * len(lanes)
    for k in live:
        lane, pred = lanes[k], every[k]
        scores = NO_SCORES if pred is None else split_scores(pred, lane.valid, step.criterion)
        metrics = {"epoch": epoch, "train_loss": lane.steps.mean_loss, **scores,
                   "samples_per_s": lane.seen / max(seconds, 1e-9), "peak_mem_mb": run.memory.peak_mb(),
                   "lr": lane.cfg.train.lr * lane.factor(lane.position), "micro_batch_size": run.micro,
                   "accum_steps": math.ceil(plan.batch_size / run.micro)}
        weights = partial(step.stack.member_state, k)
        lane.progress.record(epoch, metrics, lane.cfg.train.early_stop_metric, weights)
        if lane.progress.best_epoch == epoch:  # what its final scoring would predict on valid (_finish)
            lane.best_valid = pred
        if not fixed_epochs and lane.progress.bad_epochs >= lane.cfg.train.patience:
            lane.stopped = True  # masked from now on: it keeps its best epoch and changes no more
        rows[k] = metrics
        (lane.log or say)(epoch_line(metrics, lane.cfg.train.epochs))
    return rows


def _finish(run: Run, stop_reason: StopReason, tick: Callable[[], None],
            which: list[int]) -> list[TrainResult]:
    """The valid and test scores of members ``which`` with their best weights, one stacked forward per
    batch (for a stack of one, exactly what ``predict`` computes); kept as their lanes' results."""
    stack, plan, lanes = run.step.stack, run.plan, run.lanes
    for k in which:
        if lanes[k].progress.best_state:  # (none: a member that failed before its first epoch ended)
            stack.load_member(k, lanes[k].progress.best_state)
    # each member validated its best epoch through the final scoring's own forward, rows and batch (its
    # slice of a stacked forward reads its own weights alone): those predictions are the final scoring's
    # on valid, to the bit, and valid is not run again
    known = [lane.best_valid for lane in lanes if lane.best_valid is not None]
    valid = known if len(lanes) == len(known) and run.step.forward is stack else None
    began = time.perf_counter()  # its own time is a trial's fixed cost (final_scoring_s, issue 41)
    scored = final_scores(stack, [lane.panel for lane in lanes], run.step.device, plan.eval_batch_size, tick,
                          valid, which)
    for k, scores in zip(which, scored):
        lanes[k].result = _result(run, lanes[k], scores, stop_reason, time.perf_counter() - began)
    return [lanes[k].result for k in which]


def _result(run: Run, lane: Lane, scores: Scores, stop_reason: StopReason, scoring_s: float) -> TrainResult:
    plan, progress = run.plan, lane.progress
    final, daily, predictions = scores
    metrics: dict[str, float | str] = {**final, "final_scoring_s": scoring_s}
    metrics.update(val_loss=progress.best_metrics.get("val_loss", math.nan), best_epoch=progress.best_epoch,
        epochs_run=progress.epoch, batch_size=plan.batch_size, micro_batch_size=run.micro,
        accum_steps=math.ceil(plan.batch_size / run.micro),
        eval_batch_size=plan.eval_batch_size * len(run.lanes),  # the rows of one stacked evaluation
        precision=run.precision.name, samples_per_s=mean([h["samples_per_s"] for h in progress.history]),
        peak_mem_mb=max([h["peak_mem_mb"] for h in progress.history], default=math.nan),
        probe_peak_mem_mb=plan.peak_mem_mb, duration_s=time.perf_counter() - run.began)
    if oracle := lane.panel.oracle_ic:
        metrics.update(oracle_val_ic=oracle["valid"], oracle_test_ic=oracle["test"])
    reason = lane.reason or (StopReason.EARLY_STOP if lane.stopped and stop_reason == StopReason.EPOCHS
                             else stop_reason)
    seed = f"train.seed {lane.cfg.train.seed}, " if len(run.lanes) > 1 else ""
    (lane.log or run.say)(f"done ({reason}): {seed}best epoch {progress.best_epoch}, "
                          f"val_ic {metrics['val_ic']:.4f}, test_ic {metrics['test_ic']:.4f}")
    return TrainResult(metrics, progress.history, progress.best_state, daily, predictions,
                       stopped_by_hook=reason == StopReason.PRUNED, stop_reason=reason, failure=lane.failure)


def _fixed(run: Run, k: int, stop_reason: StopReason, began: float) -> TrainResult:
    """Member ``k`` after ``fixed_epochs``: its last epoch's weights, with no split to score them on."""
    lane = run.lanes[k]
    metrics = {"epochs_run": lane.progress.epoch, "train_loss": lane.progress.history[-1]["train_loss"],
               "batch_size": run.plan.batch_size, "micro_batch_size": run.micro,
               "precision": run.precision.name, "duration_s": time.perf_counter() - began}
    return TrainResult(metrics, lane.progress.history, run.step.stack.member_state(k), {}, {},
                       stop_reason=stop_reason)
