"""The training core: one trial's model trained on one device and scored on valid and test.

``train`` is one top-to-bottom loop in the manner of nanoGPT's train.py; the
helpers below it only set things up, split a batch, evaluate and pack state.
Checkpoints hold tensors, numbers, strings, lists and dicts only, so they load
with ``torch.load(weights_only=True)``.
"""
from __future__ import annotations

import copy
import math
import os
import random
import resource
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from sweeper import metrics as M
from sweeper.batch_size import CudaMemory, find_micro_batch, is_oom, release_memory
from sweeper.config import SweeperConfig, flatten, to_dict
from sweeper.data import Batch, Batcher, Panel
from sweeper.errors import ConfigError, Interrupted, NonFiniteLoss, OutOfMemory
from sweeper.models import build_model
from sweeper.precision import Precision, resolve_precision

SPLIT_PREFIX = {"valid": "val", "test": "test"}
AUTO_PROBE_START = 512  # first size tried for batch_size: auto (then doubling)


# ------------------------------------------------------------------ hooks, checkpoints, result


class EpochHook(Protocol):
    def on_epoch(self, epoch: int, metrics: dict) -> bool: ...   # True: stop now (pruned)
    def should_stop(self) -> bool: ...                            # polled at every step boundary


class Checkpointer(Protocol):
    def load(self) -> dict | None: ...
    def save(self, state: dict) -> None: ...


class NullHook:
    def on_epoch(self, epoch: int, metrics: dict) -> bool:
        return False

    def should_stop(self) -> bool:
        return False


class NullCheckpointer:
    def load(self) -> dict | None:
        return None

    def save(self, state: dict) -> None:
        return None


class FileCheckpointer:
    """One checkpoint file, replaced atomically at every save."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def load(self) -> dict | None:
        if not self.path.exists():
            return None
        return torch.load(self.path, map_location="cpu", weights_only=True)

    def save(self, state: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=self.path.parent)
        os.close(fd)
        try:
            torch.save(state, tmp)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


@dataclass
class TrainResult:
    metrics: dict
    history: list[dict]
    best_state: dict
    daily: dict[str, pd.DataFrame]
    predictions: dict[str, pd.DataFrame]
    stopped_by_hook: bool = False
    stop_reason: str = "epochs"   # epochs | early_stop | hook | time


# ------------------------------------------------------------------ the loop


def train(cfg: SweeperConfig, panel: Panel, *, device: torch.device | str | None = None,
          hook: EpochHook = NullHook(), checkpoint: Checkpointer = NullCheckpointer(),
          log: Callable[[str], None] | None = None) -> TrainResult:
    """Train ``cfg.model`` on ``panel``'s train split; early-stop on valid; score valid and test
    with the best epoch's weights. Raises NonFiniteLoss, OutOfMemory, Interrupted."""
    started = time.perf_counter()
    tc = cfg.train
    say = log or (lambda message: None)
    device = resolve_device(device)
    deadline = started + tc.max_minutes * 60 if tc.max_minutes else math.inf
    seed_everything(tc.seed)

    # ---- setup: data, model, precision, optimizer, batch size, schedule
    panel = panel.to(device, cfg.data.device_share)
    model = build_model(cfg.model, len(panel.features), panel.lookback).to(device)
    precision = resolve_precision(tc.precision, device)
    optimizer = make_optimizer(model, tc.lr, tc.weight_decay)
    scaler = precision.scaler()
    batcher = Batcher(panel, "train", device)
    generator = torch.Generator().manual_seed(tc.seed)
    step_model = torch.compile(model) if tc.compile else model
    state = checkpoint.load()
    if state is not None:
        check_same_config(state, cfg)
        batch_size, micro = int(state["batch_size"]), int(state["micro_batch_size"])
    else:
        batch_size, micro = plan_batch(cfg, step_model, optimizer, precision, batcher, device)
    steps_per_epoch = count_steps(batcher, tc.resolved_batch_order, batch_size, tc.samples_per_epoch)
    scheduler = LambdaLR(optimizer, lr_factor(tc.schedule, tc.warmup_frac, steps_per_epoch * tc.epochs))
    progress = Progress()
    if state is not None:
        restore(state, model, optimizer, scheduler, scaler, generator, progress)
        say(f"resumed after epoch {progress.epoch} (best {tc.early_stop_metric} {progress.best})")
    say(f"training {cfg.model.name} on {device}: {batcher.n_samples} samples, batch {batch_size} "
        f"(micro {micro}), {precision.name}, {steps_per_epoch} steps/epoch")

    # ---- the epochs
    stop_reason = "early_stop" if progress.bad_epochs >= tc.patience else "epochs"
    for epoch in range(progress.epoch + 1, tc.epochs + 1):
        if stop_reason != "epochs":
            break
        model.train()
        reset_peak_memory(device)
        epoch_start, seen, loss_sum, loss_steps = time.perf_counter(), 0, 0.0, 0
        for batch in epoch_batches(batcher, tc.resolved_batch_order, batch_size, generator, tc.samples_per_epoch):
            if hook.should_stop():
                raise Interrupted(f"stop requested during epoch {epoch}; "
                                  f"the last checkpoint holds epoch {epoch - 1}")
            while True:  # one optimizer step; after an OOM, the same step again in smaller micro-batches
                optimizer.zero_grad(set_to_none=True)
                oom = False
                try:
                    loss = accumulate(step_model, batch, micro, tc.loss, precision, scaler)
                except Exception as exc:
                    if not is_oom(exc):
                        raise
                    oom = True
                if not oom:
                    break
                optimizer.zero_grad(set_to_none=True)
                release_memory()  # outside the except: the traceback no longer pins activations
                micro = shrink_micro(micro, tc.min_micro_batch, batch_size)
                say(f"out of memory: micro-batch now {micro}, accumulating {math.ceil(batch_size / micro)}")
            loss_value = float(loss)
            finite = math.isfinite(loss_value)
            if finite:
                scaler.unscale_(optimizer)
                norm = nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip) if tc.grad_clip else None
                # fp16: the scaler skips overflowing steps itself (and lowers its scale)
                finite = scaler.is_enabled() or norm is None or bool(torch.isfinite(norm))
                if finite:
                    scaler.step(optimizer)
                scaler.update()
            if finite:
                scheduler.step()  # the schedule counts updates, so a skipped step does not use one up
                progress.nonfinite_steps = 0
                loss_sum, loss_steps = loss_sum + loss_value, loss_steps + 1
            else:  # no update from this batch; give up only when it keeps happening
                progress.nonfinite_steps += 1
                if progress.nonfinite_steps >= tc.nonfinite_patience:
                    raise NonFiniteLoss(f"loss or gradients non-finite for {progress.nonfinite_steps} consecutive "
                                        f"steps (epoch {epoch}, train.lr={tc.lr:g})")
            seen += len(batch.y)
            if time.perf_counter() > deadline:
                stop_reason = "time"
                break
        train_seconds = time.perf_counter() - epoch_start

        # ---- end of epoch: validate, keep the best weights, checkpoint, report
        scores = evaluate(step_model, panel, "valid", device, tc.eval_batch_size, tc.loss)
        metrics = {"epoch": epoch, "train_loss": loss_sum / loss_steps if loss_steps else math.nan, **scores,
                   "samples_per_s": seen / max(train_seconds, 1e-9), "peak_mem_mb": peak_memory_mb(device),
                   "lr": scheduler.get_last_lr()[0], "micro_batch_size": micro,
                   "accum_steps": math.ceil(batch_size / micro)}
        progress.record(epoch, metrics, tc.early_stop_metric, model)
        say(epoch_line(metrics, tc.epochs))
        # report first, then save: a checkpoint never holds an epoch the hook has not seen
        # (a kill in between re-runs and re-reports that epoch rather than losing its report)
        if hook.on_epoch(epoch, metrics):
            stop_reason = "hook"
        elif progress.bad_epochs >= tc.patience and stop_reason == "epochs":
            stop_reason = "early_stop"
        if not isinstance(checkpoint, NullCheckpointer):  # spare the CPU copies when nobody keeps them
            checkpoint.save(training_state(cfg, model, optimizer, scheduler, scaler, generator, progress,
                                           batch_size, micro))

    # ---- score valid and test with the best weights, through the same path as `predict`
    model.load_state_dict(progress.best_state)
    result_metrics, daily, predictions = final_scores(model, panel, device, tc.eval_batch_size)
    result_metrics.update(
        val_loss=progress.best_metrics.get("val_loss", math.nan), best_epoch=progress.best_epoch,
        epochs_run=progress.epoch, batch_size=batch_size, micro_batch_size=micro,
        accum_steps=math.ceil(batch_size / micro), precision=precision.name,
        samples_per_s=mean([h["samples_per_s"] for h in progress.history]),
        peak_mem_mb=max([h["peak_mem_mb"] for h in progress.history], default=math.nan),
        duration_s=time.perf_counter() - started)
    if panel.oracle_ic:
        result_metrics.update(oracle_val_ic=panel.oracle_ic["valid"], oracle_test_ic=panel.oracle_ic["test"])
    say(f"done ({stop_reason}): best epoch {progress.best_epoch}, val_ic {result_metrics['val_ic']:.4f}, "
        f"test_ic {result_metrics['test_ic']:.4f}")
    return TrainResult(result_metrics, progress.history, progress.best_state, daily, predictions,
                       stopped_by_hook=stop_reason == "hook", stop_reason=stop_reason)


# ------------------------------------------------------------------ setup


def resolve_device(device: torch.device | str | None) -> torch.device:
    """None: the current CUDA device if there is one, else the CPU; "cuda" gets its index."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA device too


def make_optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    # the usual exemption: biases, norms and position tables are not shrunk towards zero
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    other = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr)


def lr_factor(schedule: str, warmup_frac: float, total_steps: int) -> Callable[[int], float]:
    """Multiplier of train.lr after ``step`` optimizer steps (LambdaLR's contract)."""
    total = max(1, total_steps)
    warmup = int(warmup_frac * total)
    if schedule == "onecycle":
        warmup = warmup or int(0.3 * total)  # torch's OneCycleLR pct_start when no warmup is set

    def factor(step: int) -> float:
        if step < warmup:
            if schedule == "onecycle":  # cosine ramp from lr/25, as OneCycleLR
                return 1 / 25 + (1 - 1 / 25) * 0.5 * (1 - math.cos(math.pi * step / warmup))
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        done = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1 + math.cos(math.pi * done))
    return factor


def count_steps(batcher: Batcher, order: str, batch_size: int, limit: int | None) -> int:
    """Optimizer steps per epoch (exact for random order, the expected count for cross sections)."""
    samples = batcher.n_samples if limit is None else min(limit, batcher.n_samples)
    if order == "random":
        return max(1, math.ceil(samples / batch_size))
    per_date = batcher.n_samples / max(1, batcher.n_dates)
    dates = max(1, min(batcher.n_dates, int(samples / per_date)))
    return max(1, math.ceil(dates / dates_per_batch(batcher, batch_size)))


def dates_per_batch(batcher: Batcher, batch_size: int) -> int:
    return max(1, round(batch_size * batcher.n_dates / max(1, batcher.n_samples)))


def epoch_batches(batcher: Batcher, order: str, batch_size: int, generator: torch.Generator,
                  limit: int | None) -> Iterator[Batch]:
    if order == "random":
        return batcher.random_batches(batch_size, generator, limit)
    return batcher.cross_section_batches(dates_per_batch(batcher, batch_size), generator, limit)


def plan_batch(cfg: SweeperConfig, model: nn.Module, optimizer: torch.optim.Optimizer, precision: Precision,
               batcher: Batcher, device: torch.device) -> tuple[int, int]:
    """(effective batch, micro-batch). On CUDA the micro-batch is probed against free memory."""
    tc = cfg.train
    auto = tc.batch_size == "auto"
    cap = min(tc.max_batch_size if auto else int(tc.batch_size), max(1, batcher.n_samples))
    if device.type != "cuda":
        return cap, cap
    step = probe_step(model, optimizer, precision, batcher, tc.loss, tc.seed)
    with preserved(model, optimizer):
        probe = find_micro_batch(step, CudaMemory(device), start=min(cap, AUTO_PROBE_START) if auto else cap,
                                 cap=cap, margin=tc.memory_margin, steps=tc.probe_steps,
                                 minimum=min(tc.min_micro_batch, cap))
    micro = probe.micro_batch
    return (micro if auto else cap), micro


def probe_step(model: nn.Module, optimizer: torch.optim.Optimizer, precision: Precision, batcher: Batcher,
               loss_name: str, seed: int) -> Callable[[int], None]:
    """A real training step (precision, backward, optimizer state) on a real batch of ``size`` rows."""
    generator = torch.Generator().manual_seed(seed + 1)
    scaler = precision.scaler()

    def step(size: int) -> None:
        batch = next(batcher.random_batches(size, generator))
        optimizer.zero_grad(set_to_none=True)
        accumulate(model, batch, size, loss_name, precision, scaler)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    return step


@contextmanager
def preserved(model: nn.Module, optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Restores weights, optimizer state and RNG after probing, so probing never changes training."""
    weights = cpu_copy(model.state_dict())
    opt_state = copy.deepcopy(optimizer.state_dict())
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        model.load_state_dict(weights)
        optimizer.load_state_dict(opt_state)
        optimizer.zero_grad(set_to_none=True)
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        release_memory()


def shrink_micro(micro: int, minimum: int, batch_size: int) -> int:
    smaller = micro // 2
    if smaller < min(minimum, batch_size):
        raise OutOfMemory(f"out of memory at micro-batch {micro}; halving it would go below "
                          f"train.min_micro_batch={minimum}")
    return smaller


# ------------------------------------------------------------------ one step


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


# ------------------------------------------------------------------ evaluation


def predict_rows(model: nn.Module, batcher: Batcher, batch_size: int) -> torch.Tensor:
    """Predictions [S] (fp32, eval mode) for the split's samples in sample-index order.
    Out of memory halves the evaluation batch and starts over."""
    while True:
        oom = False
        try:
            return _forward_all(model, batcher, batch_size)
        except Exception as exc:
            if not is_oom(exc) or batch_size == 1:
                raise
            oom = True
        if oom:
            release_memory()
            batch_size //= 2


@torch.no_grad()
def _forward_all(model: nn.Module, batcher: Batcher, batch_size: int) -> torch.Tensor:
    was_training = model.training
    model.eval()
    try:
        out = [model(b.x).float() for b in batcher.eval_batches(batch_size)]
    finally:
        model.train(was_training)
    return torch.cat(out) if out else torch.zeros(0, device=batcher.device)


def predict(model: nn.Module, panel: Panel, split: str, device: torch.device | str,
            batch_size: int) -> pd.DataFrame:
    """Long frame ``date, asset, pred, label`` (label = raw) of one split. With the trial's
    best weights and ``train.eval_batch_size`` its IC is exactly the stored val_ic / test_ic."""
    batcher = Batcher(panel, split, torch.device(device))
    pred = predict_rows(model, batcher, batch_size).cpu().numpy()
    idx = batcher.index.cpu().numpy()
    t, i = idx[:, 0], idx[:, 1]
    label = panel.y_raw.cpu().numpy()[t, i] if len(t) else np.zeros(0, np.float32)
    return pd.DataFrame({"date": panel.dates[t], "asset": panel.assets[i], "pred": pred, "label": label})


def evaluate(model: nn.Module, panel: Panel, split: str, device: torch.device, batch_size: int,
             loss_name: str) -> dict:
    """Per-epoch scores of a split: {val_loss, val_ic, val_rank_ic, val_icir} (vectorised torch)."""
    batcher = Batcher(panel, split, device)
    pred = predict_rows(model, batcher, batch_size)
    start, stop = panel.splits[split]
    idx = batcher.index.to(pred.device)
    matrix = torch.full((stop - start, panel.y.shape[1]), math.nan, device=pred.device)
    matrix[idx[:, 0] - start, idx[:, 1]] = pred
    report = M.ic_report_torch(matrix, panel.y_raw[start:stop].to(pred.device))
    y = panel.y.to(pred.device)[idx[:, 0], idx[:, 1]]
    if not len(pred):
        loss = math.nan
    elif loss_name == "mse":
        loss = float(nn.functional.mse_loss(pred, y))
    else:
        loss = float(M.ic_loss(pred, y, idx[:, 0]))
    p = SPLIT_PREFIX[split]
    return {f"{p}_loss": loss, f"{p}_ic": report["ic"], f"{p}_rank_ic": report["rank_ic"], f"{p}_icir": report["icir"]}


def final_scores(model: nn.Module, panel: Panel, device: torch.device,
                 batch_size: int) -> tuple[dict, dict[str, pd.DataFrame], dict[str, pd.DataFrame]]:
    """IC metrics, daily ICs and predictions of valid and test, from ``predict``'s frames."""
    scores: dict[str, Any] = {}
    daily, predictions = {}, {}
    for split, p in SPLIT_PREFIX.items():
        frame = predict(model, panel, split, device, batch_size)
        report = M.ic_report(frame)
        scores.update({f"{p}_ic": report["ic"], f"{p}_rank_ic": report["rank_ic"], f"{p}_icir": report["icir"]})
        daily[split], predictions[split] = M.daily_ic(frame), frame
    return scores, daily, predictions


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(device: torch.device) -> float:
    """CUDA: peak allocated since the epoch began. CPU: the process's peak resident size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def epoch_line(m: dict, epochs: int) -> str:
    return (f"epoch {m['epoch']}/{epochs} train_loss {m['train_loss']:.4f} val_loss {m['val_loss']:.4f} "
            f"val_ic {m['val_ic']:.4f} val_rank_ic {m['val_rank_ic']:.4f} {m['samples_per_s']:.0f} samples/s")


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


# ------------------------------------------------------------------ progress and checkpoint state


@dataclass
class Progress:
    """What the loop carries from epoch to epoch (and what a checkpoint restores)."""

    epoch: int = 0
    best: float | None = None
    best_epoch: int = 0
    best_state: dict = field(default_factory=dict)
    best_metrics: dict = field(default_factory=dict)
    bad_epochs: int = 0
    nonfinite_steps: int = 0
    history: list[dict] = field(default_factory=list)

    def record(self, epoch: int, metrics: dict, key: str, model: nn.Module) -> None:
        self.epoch = epoch
        self.history.append(metrics)
        value = metrics[key]
        lower = key == "val_loss"
        better = math.isfinite(value) and (self.best is None or not math.isfinite(self.best)
                                           or (value < self.best if lower else value > self.best))
        if better or not self.best_state:  # the first epoch is the best until beaten
            self.best, self.best_epoch, self.best_metrics = value, epoch, metrics
            self.best_state = cpu_copy(model.state_dict())
            self.bad_epochs = 0 if better else self.bad_epochs + 1
        else:
            self.bad_epochs += 1


def cpu_copy(state_dict: dict) -> dict:
    return {k: v.detach().to("cpu", copy=True) for k, v in state_dict.items()}


def rng_state(generator: torch.Generator) -> dict:
    np_state = np.random.get_state()
    version, py_state, gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": list(torch.cuda.get_rng_state_all()) if torch.cuda.is_initialized() else [],
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "python": {"version": version, "state": list(py_state), "gauss": gauss},
        "batches": generator.get_state(),
    }


def set_rng_state(state: dict, generator: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
    generator.set_state(state["batches"])


def training_state(cfg: SweeperConfig, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: LambdaLR,
                   scaler: torch.amp.GradScaler, generator: torch.Generator, progress: Progress,
                   batch_size: int, micro: int) -> dict:
    return {
        "epoch": progress.epoch, "model": cpu_copy(model.state_dict()), "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "rng": rng_state(generator),
        "best": progress.best, "best_epoch": progress.best_epoch, "best_state": progress.best_state,
        "best_metrics": progress.best_metrics, "bad_epochs": progress.bad_epochs,
        "nonfinite_steps": progress.nonfinite_steps, "history": progress.history,
        "batch_size": batch_size, "micro_batch_size": micro, "config": to_dict(cfg),
    }


def restore(state: dict, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: LambdaLR,
            scaler: torch.amp.GradScaler, generator: torch.Generator, progress: Progress) -> None:
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    scaler.load_state_dict(state["scaler"])
    set_rng_state(state["rng"], generator)
    progress.epoch, progress.best, progress.best_epoch = state["epoch"], state["best"], state["best_epoch"]
    progress.best_state, progress.best_metrics = state["best_state"], state["best_metrics"]
    progress.bad_epochs, progress.nonfinite_steps = state["bad_epochs"], state["nonfinite_steps"]
    progress.history = list(state["history"])


def check_same_config(state: dict, cfg: SweeperConfig) -> None:
    """A checkpoint continues only the run it came from: model, train and data must match."""
    old, new = flatten(state.get("config", {})), flatten(to_dict(cfg))
    sections = ("model.", "train.", "data.")
    for key in sorted(set(old) | set(new)):
        if key.startswith(sections) and old.get(key) != new.get(key):
            raise ConfigError(f"the checkpoint was written by a different run: {key} was "
                              f"{old.get(key)!r}, now {new.get(key)!r}")
