"""What the training core costs over a plain PyTorch loop: same model, same batches, same math.

Both contenders train the same model from the same initial weights on the same random panel,
one torch thread each, and see the same batches in the same order:

- **core**: ``sweeper.core.train`` (hook polls, the no-sync step, non-finite guard on the device,
  accumulation split, OOM guard, the sync every ``SYNC_EVERY`` steps, time checks), measured by
  its own per-epoch ``samples_per_s`` (training steps only, up to the epoch-end sync);
- **plain**: the loop anyone would write: the core's batch order (``epoch_rows``) and gather, forward,
  MSE, backward, ``clip_grad_norm_``, AdamW (fused, weight decay on matrices, as the core's),
  a LambdaLR step. No AMP (this is the CPU figure), no NaN check, no hook.

Epochs of the two alternate (a plain epoch runs from the core's epoch hook, untimed by the core)
so that other load on the machine hits both alike; the first epoch of each run is a warm-up and
is not counted. Each figure is the median of the counted epochs over all repeats;
``pair_ratio_median`` is the median of the ratios of neighbouring epochs.

    python benchmarks/core_overhead.py [--model mlp|lstm|transformer] [--repeats 5]

The last line is JSON: {"core_samples_per_s", "plain_samples_per_s", "ratio", ...}.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from typing import Iterator

import numpy as np
import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from sweeper.config import validate_config
from sweeper.core import NullHook, train
from sweeper.core.schedule import epoch_rows, lr_factor
from sweeper.data import Batcher, Panel
from sweeper.models import build_model

ASSETS, DATES, FEATURES, LOOKBACK = 300, 400, 16, 20
PRESETS = {  # the CPU study defaults of docs/performance.md, with epochs short enough to repeat
    "mlp": ({"name": "mlp", "hidden_size": 64, "num_layers": 2, "dropout": 0.1}, 512, 32768),
    "lstm": ({"name": "lstm", "hidden_size": 32, "num_layers": 1, "dropout": 0.0}, 512, 16384),
    "transformer": ({"name": "transformer", "d_model": 32, "nhead": 2, "num_layers": 2, "dim_feedforward": 64,
                     "dropout": 0.0}, 256, 4096),
}


def random_panel(seed: int = 0) -> Panel:
    """A dense panel whose valid and test splits are small, so validation costs little wall time."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(DATES, ASSETS, FEATURES, generator=g)
    y = X[:, :, 0] + torch.randn(DATES, ASSETS, generator=g)
    first = LOOKBACK - 1
    return Panel(
        X=X, y=y, y_raw=y.clone(), mask=torch.ones(DATES, ASSETS, dtype=torch.bool),
        dates=np.arange(DATES).astype("datetime64[D]").astype("datetime64[ns]"),
        assets=np.array([f"A{k:04d}" for k in range(ASSETS)], dtype=object),
        features=[f"f{k}" for k in range(FEATURES)],
        splits={"train": (first, DATES - 20), "valid": (DATES - 20, DATES - 10), "test": (DATES - 10, DATES)},
        lookback=LOOKBACK, oracle_ic=None, source="benchmark", fingerprint="benchmark",
    )


def config(model: dict, batch: int, samples: int, epochs: int):
    return validate_config({
        "data": {"synthetic": {"assets": 2, "dates": 10}, "lookback": LOOKBACK},
        "model": model,
        "train": {"epochs": epochs, "batch_size": batch, "samples_per_epoch": samples, "lr": 1e-3,
                  "schedule": "cosine", "warmup_frac": 0.05, "grad_clip": 1.0, "loss": "mse", "precision": "fp32",
                  "patience": 1000, "eval_batch_size": 16384, "seed": 0},
    }, "core_overhead")


class Interleave(NullHook):
    """Runs one epoch of the plain loop after each of the core's epochs, so that load from other
    processes, which comes and goes over seconds, hits both contenders alike."""

    def __init__(self, plain: Iterator[float]) -> None:
        self.plain, self.rates = plain, []

    def on_epoch(self, epoch: int, rows: list[dict | None]) -> bool:
        self.rates.append(next(self.plain))
        return False


def plain_epochs(cfg, panel: Panel) -> Iterator[float]:
    """The same training, hand-written: yields samples/s of each epoch's steps."""
    tc = cfg.train
    torch.manual_seed(tc.seed)  # the core seeds the same way before building the model
    model = build_model(cfg.model, len(panel.features), panel.lookback)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": tc.weight_decay},
                                   {"params": other, "weight_decay": 0.0}], lr=tc.lr, fused=True)
    batcher = Batcher(panel, "train", "cpu")
    steps = math.ceil(min(tc.samples_per_epoch, batcher.n_samples) / tc.batch_size)
    scheduler = LambdaLR(optimizer, lr_factor(tc.schedule, tc.warmup_frac, steps * tc.epochs))
    generator = torch.Generator().manual_seed(tc.seed)
    for _ in range(tc.epochs):
        model.train()
        start, seen = time.perf_counter(), 0
        for rows in epoch_rows(batcher, "random", tc.batch_size, generator, tc.samples_per_epoch):
            batch = batcher.gather(rows.idx)
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(batch.x).float(), batch.y)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            optimizer.step()
            scheduler.step()
            seen += len(batch.y)
        yield seen / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(PRESETS), default="mlp")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each contender, alternating")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per run; the first is a warm-up")
    parser.add_argument("--smoke", action="store_true", help="a tiny run, to test the script")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # a CPU slot's setting; see docs/performance.md on threads
    model, batch, samples = PRESETS[args.model]
    if args.smoke:
        args.repeats, args.epochs, samples = 1, 2, 2 * batch
    cfg = config(model, batch, samples, args.epochs)
    panel = random_panel()
    core, plain, pairs = [], [], []
    for repeat in range(args.repeats):
        hook = Interleave(plain_epochs(cfg, panel))
        core_rates = [h["samples_per_s"] for h in train(cfg, panel, device="cpu", hook=hook).history][1:]
        plain_rates = hook.rates[1:]  # the first epoch of each is a warm-up
        core += core_rates
        plain += plain_rates
        pairs += [c / p for c, p in zip(core_rates, plain_rates)]
        print(f"repeat {repeat}: core " + " ".join(f"{r:,.0f}" for r in core_rates) + " | plain "
              + " ".join(f"{r:,.0f}" for r in plain_rates) + " samples/s", flush=True)
    core_rate, plain_rate = statistics.median(core), statistics.median(plain)
    summary = {"model": args.model, "batch_size": batch, "samples_per_epoch": samples, "repeats": args.repeats,
               "epochs_counted": len(core), "load_avg": round(os.getloadavg()[0], 2),
               "pair_ratio_median": round(statistics.median(pairs), 3),
               "core_samples_per_s": round(core_rate), "plain_samples_per_s": round(plain_rate),
               "ratio": round(core_rate / plain_rate, 3)}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
