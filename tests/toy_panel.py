"""A tiny Panel with a strong, learnable signal, built directly (no file, no normalisation)."""
from __future__ import annotations

import numpy as np
import torch

from sweeper.config import validate_config
from sweeper.data import Panel


def toy_panel(T: int = 60, N: int = 32, F: int = 3, lookback: int = 4, seed: int = 0,
              oracle: bool = True) -> Panel:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(T, N, F, generator=g)
    y = torch.full((T, N), float("nan"))
    # needs the window: today's f0 and yesterday's f1
    y[1:] = X[1:, :, 0] + 0.5 * X[:-1, :, 1] + 0.3 * torch.randn(T - 1, N, generator=g)
    y[-1] = float("nan")  # the latest label is not known yet
    mask = torch.ones(T, N, dtype=torch.bool)
    mask[T // 2:, 0] = False  # one asset delists halfway
    y[~mask] = float("nan")
    stops = (int(T * 0.65), int(T * 0.82), T)
    return Panel(
        X=X, y=y, y_raw=0.02 * y, mask=mask,
        dates=np.datetime64("2020-01-01", "ns") + np.arange(T) * np.timedelta64(1, "D"),
        assets=np.array([f"A{i:03d}" for i in range(N)], dtype=object), features=[f"f{k}" for k in range(F)],
        splits={"train": (lookback - 1, stops[0]), "valid": (stops[0], stops[1]), "test": (stops[1], stops[2])},
        lookback=lookback, oracle_ic={"train": 0.9, "valid": 0.91, "test": 0.92} if oracle else None,
        source="toy", fingerprint="toy",
    )


def toy_config(model: dict | None = None, **train):
    base = {"epochs": 3, "batch_size": 64, "lr": 3e-3, "schedule": "constant", "warmup_frac": 0.0,
            "eval_batch_size": 256, "patience": 10}
    return validate_config({"data": {"synthetic": {"assets": 2, "dates": 10}, "lookback": 4},
                            "model": model or {"name": "mlp", "hidden_size": 16, "dropout": 0.0},
                            "train": base | train}, "toy")
