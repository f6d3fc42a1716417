"""Models for driver tests, named as ``fault_models:Probe`` (tests/ is on the workers' path).

``kind`` picks the behaviour: ``mlp`` learns, ``noise`` predicts nothing useful
(IC about 0, so a pruner should stop it), and ``raise``/``exit``/``hang``/``segv``
fail the way a buggy trial can.
"""
from __future__ import annotations

import ctypes
import os
import time

import torch
from torch import nn


class Probe(nn.Module):
    def __init__(self, n_features: int, lookback: int, kind: str = "mlp", hidden: int = 16,
                 hang_seconds: float = 600.0) -> None:
        super().__init__()
        self.kind = kind
        self.hang_seconds = hang_seconds
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
        if self.kind == "hang":
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
