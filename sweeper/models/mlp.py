"""MLP on the flattened lookback window."""
from __future__ import annotations

import torch
from torch import nn


class MLPModel(nn.Module):
    """x[B, L, F] -> flatten -> num_layers x (Linear, GELU, Dropout) -> Linear -> [B]."""

    def __init__(self, n_features: int, lookback: int, *, hidden_size: int = 64, num_layers: int = 2,
                 dropout: float = 0.1) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = n_features * lookback
        for _ in range(num_layers):
            layers += [nn.Linear(width, hidden_size), nn.GELU(), nn.Dropout(dropout)]
            width = hidden_size
        layers.append(nn.Linear(width, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)
