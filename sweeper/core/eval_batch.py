"""How many rows one evaluation forward takes on a CPU (``train.eval_batch_size: auto``): measured.

On a GPU the batch probe sizes evaluation to the free memory (:func:`sweeper.core.step.plan_stack`).
On a CPU memory is not what limits it but the caches are: a forward over 16,384 windows of the default
transformer spills its activations out of the caches and ran 2.2x slower per row than batches of 1,024
(2-core Intel Xeon, 2026-12-05), an LSTM's 1.5-2x, while an MLP was fastest at 4,096-16,384. Which size
wins depends on the model and the CPU, so :func:`measure` times the trial's model, forward only, at
each candidate size up to the longest split (a size past it is one forward, as the largest is), in
interleaved rounds (load from other processes hits every size alike; the best round of each kept),
and takes the fastest. The host keeps the choice per shape (:mod:`sweeper.core.host_cache`)."""

import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from sweeper.config import EVAL_BATCH_START, SweeperConfig
from sweeper.core import host_cache
from sweeper.data import Batcher

CANDIDATES = (256, 1024, 4096, EVAL_BATCH_START)
TIMED_ROWS, ROUNDS = 4096, 2  # rows timed per size and round (a larger size: one forward)
# a larger batch must be this much slower before a smaller one is taken: fewer forwards, fewer
# batch edges, and a near-tie is noise
MARGIN = 0.05
CACHE_DIR, CACHE_VERSION = ".eval-batches", 2  # 2: the transformer evaluates its last position alone


def sizes_for(rows: int) -> list[int]:
    """The sizes worth timing for a split of ``rows`` rows: those below it, then the largest (every
    size at or past ``rows`` is the one forward it makes)."""
    return [c for c in CANDIDATES[:-1] if c < rows] + [EVAL_BATCH_START]


@torch.no_grad()
def measure(model: nn.Module, batcher: Batcher, rows: int, say: Callable[[str], None] | None = None) -> int:
    """The fastest rows per evaluation forward of ``model`` for a split of ``rows`` rows, timed on this
    CPU on ``batcher``'s rows (any rows of the panel: a row costs what any other does)."""
    if len(sizes := sizes_for(min(rows, batcher.n_samples))) == 1:
        return sizes[0]
    was_training = model.training
    model.eval()
    rates: dict[int, float] = {}
    try:
        model(batcher.gather(batcher.index[:sizes[0]]).x)  # warm-up: first calls allocate
        for _ in range(ROUNDS):
            for size in sizes:
                rates[size] = max(rates.get(size, 0.0), _rate(model, batcher, size))
    finally:
        model.train(was_training)
    best = max(rates.values())
    chosen = max(size for size, rate in rates.items() if rate >= best * (1 - MARGIN))
    if say is not None:
        shown = ", ".join(f"{k}: {r:.0f}" for k, r in sorted(rates.items()))
        say(f"eval batch {chosen}: rows/s by eval batch {shown} (measured)")
    return chosen


def _rate(model: nn.Module, batcher: Batcher, size: int) -> float:
    """Rows per second of forwards of ``size`` rows (the gather included) over TIMED_ROWS rows or one
    forward."""
    rows = min(max(size, TIMED_ROWS), batcher.n_samples)
    began = time.perf_counter()
    for start in range(0, rows, size):
        model(batcher.gather(batcher.index[start:min(start + size, rows)]).x)
    return rows / max(time.perf_counter() - began, 1e-9)


def cache_key(cfg: SweeperConfig, n_features: int) -> str:
    """The key of a measurement on this host (:mod:`sweeper.core.host_cache`): what sets a forward's
    speed (the model's shape, the data's). Dropout is not in it: it does nothing in evaluation, and a
    searched rate would make every trial measure again."""
    model = {k: v for k, v in cfg.model.model_dump(mode="json").items() if k != "dropout"}
    what = {"version": CACHE_VERSION, "model": model, "features": n_features, "lookback": cfg.data.lookback}
    return host_cache.key(what, torch.device("cpu"))


def read_kept(folder: Path, key: str) -> int | None:
    """The size this host measured before under ``key``, or None."""
    kept = host_cache.read(folder, key) or {}
    return kept["eval_batch_size"] if isinstance(kept.get("eval_batch_size"), int) else None
