"""Models for driver tests, named as ``fault_models:Probe`` (tests/ is on the workers' path).

``kind`` picks the behaviour: ``mlp`` learns, ``noise`` predicts nothing useful
(IC about 0, so a pruner should stop it), and ``raise``/``exit``/``hang``/``segv``
fail the way a buggy trial can; ``picky`` refuses an odd ``hidden``. ``hang_once`` hangs in the first process that
reaches a training step and learns in every later one: ``marker`` names a file
it creates as it starts to hang (``hang`` creates it too, so a test can wait
for the hang).
"""
from __future__ import annotations

import ctypes
import os
import time

import torch
from torch import nn


class Probe(nn.Module):
    def __init__(self, n_features: int, lookback: int, kind: str = "mlp", hidden: int = 16,
                 hang_seconds: float = 600.0, marker: str | None = None) -> None:
        super().__init__()
        if kind == "picky" and hidden % 2:  # a constructor that refuses some sampled shapes
            raise ValueError(f"hidden ({hidden}) must be even")
        self.kind = kind
        self.hang_seconds = hang_seconds
        self.marker = marker
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(n_features * lookback, hidden), nn.GELU(),
                                 nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and torch.is_grad_enabled():
            self._misbehave()
        if self.kind == "noise":
            return torch.randn(x.shape[0], device=x.device) + 0 * self.net(x).squeeze(-1)
        return self.net(x).squeeze(-1)

    def _misbehave(self) -> None:
        if self.kind == "raise":
            raise RuntimeError("boom: a bug in the user's model")
        if self.kind == "exit":
            os._exit(3)
        if self.kind == "hang" or (self.kind == "hang_once" and not os.path.exists(self.marker)):
            if self.marker:
                open(self.marker, "a").close()
            time.sleep(self.hang_seconds)
        if self.kind == "segv":
            ctypes.string_at(0)


class Slow(nn.Module):
    """Learns like an MLP but sleeps on every training step (to be interrupted mid-trial)."""

    def __init__(self, n_features: int, lookback: int, step_sleep: float = 0.05, hidden: int = 16) -> None:
        super().__init__()
        self.step_sleep = step_sleep
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(n_features * lookback, hidden), nn.GELU(),
                                 nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and torch.is_grad_enabled():
            time.sleep(self.step_sleep)
        return self.net(x).squeeze(-1)
