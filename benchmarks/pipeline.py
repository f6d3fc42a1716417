"""Samples/s of sweeper's batch pipeline vs the common per-sample Dataset recipe.

Same random panel for both: 500 assets x 1000 dates x 20 features, lookback
20, the first 100,000 samples (dates 19..218, all assets), random order,
batch 512. sweeper: the training order (``core.schedule.epoch_rows``) gathered
by ``Batcher.gather`` (one index_select per batch on the resident tensor). Recipe: a torch ``Dataset`` whose ``__getitem__`` slices
the [T, N, F] tensor, under a ``DataLoader`` with num_workers 0 and 2
(persistent workers, so worker start-up is not counted). Each figure is the
median of a few timed epochs after one warm-up epoch; the contenders' epochs
are interleaved so that other load on the machine hits them alike.

    python benchmarks/pipeline.py [--repeats 5]

The last line is JSON: {"sweeper_samples_per_s", "recipe_samples_per_s", "ratio"},
where the recipe figure is the better of num_workers 0 and 2.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from sweeper.core.schedule import epoch_rows
from sweeper.data import Batcher, Panel

ASSETS, DATES, FEATURES, LOOKBACK, SAMPLES, BATCH = 500, 1000, 20, 20, 100_000, 512


def random_panel(seed: int = 0) -> Panel:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(DATES, ASSETS, FEATURES, generator=g)
    y = torch.randn(DATES, ASSETS, generator=g)
    first = LOOKBACK - 1
    # the train split holds exactly the first SAMPLES samples: whole dates of all assets
    stop = first + SAMPLES // ASSETS
    return Panel(
        X=X, y=y, y_raw=y.clone(), mask=torch.ones(DATES, ASSETS, dtype=torch.bool),
        dates=np.arange(DATES).astype("datetime64[D]").astype("datetime64[ns]"),
        assets=np.array([f"A{k:04d}" for k in range(ASSETS)], dtype=object),
        features=[f"f{k}" for k in range(FEATURES)], splits={"train": (first, stop)},
        lookback=LOOKBACK, oracle_ic=None, source="benchmark", fingerprint="benchmark",
    )


class WindowDataset(Dataset):
    """The common recipe: one window per __getitem__."""

    def __init__(self, X: torch.Tensor, y: torch.Tensor, index: torch.Tensor, lookback: int) -> None:
        self.X, self.y, self.lookback = X, y, lookback
        self.pairs = [tuple(p) for p in index.tolist()]

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, k: int):
        t, i = self.pairs[k]
        return self.X[t - self.lookback + 1:t + 1, i], self.y[t, i]


def epoch_rate(run_epoch) -> float:
    start = time.perf_counter()
    n = run_epoch()
    return n / (time.perf_counter() - start)


def interleaved_medians(runs: dict[str, object], repeats: int) -> dict[str, float]:
    """One warm-up epoch each (allocator, worker start-up), then the timed epochs
    taken in turn, so a burst of load on a shared box hits every contender alike."""
    for run in runs.values():
        run()
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            rates[name].append(epoch_rate(run))
    return {name: statistics.median(values) for name, values in rates.items()}


def sweeper_epoch(batcher: Batcher, seed: list[int]):
    def run() -> int:
        seed[0] += 1
        n = 0
        for rows in epoch_rows(batcher, "random", BATCH, torch.Generator().manual_seed(seed[0]), None):
            n += batcher.gather(rows.idx).x.shape[0]
        return n
    return run


def recipe_epoch(loader: DataLoader):
    def run() -> int:
        n = 0
        for x, _y in loader:
            n += x.shape[0]
        return n
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    panel = random_panel()
    batcher = Batcher(panel, "train", "cpu")
    assert batcher.n_samples == SAMPLES
    data = WindowDataset(panel.X, panel.y, panel.sample_index("train"), LOOKBACK)
    loaders = {w: DataLoader(data, batch_size=BATCH, shuffle=True, num_workers=w, persistent_workers=w > 0)
               for w in (0, 2)}
    runs = {"sweeper": sweeper_epoch(batcher, [0]),
            **{f"recipe_w{w}": recipe_epoch(loader) for w, loader in loaders.items()}}
    rates = interleaved_medians(runs, args.repeats)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f}")
    print(f"sweeper epoch_rows + Batcher.gather: {rates['sweeper']:,.0f} samples/s")
    for w in loaders:
        print(f"recipe Dataset+DataLoader, num_workers={w}: {rates[f'recipe_w{w}']:,.0f} samples/s")
    best = max(rates["recipe_w0"], rates["recipe_w2"])
    ours = rates["sweeper"]
    print(f"ratio (sweeper / best recipe): {ours / best:.1f}x")
    print(json.dumps({"sweeper_samples_per_s": round(ours), "recipe_samples_per_s": round(best),
                      "ratio": round(ours / best, 2)}))


if __name__ == "__main__":
    main()
