"""LSTM and GRU over the lookback window, predicting from the last step."""
from __future__ import annotations

import torch
from torch import nn


class RecurrentModel(nn.Module):
    """x[B, L, F] -> stacked LSTM/GRU -> last hidden output -> [B]."""

    def __init__(self, n_features: int, lookback: int, *, cell: str = "lstm", hidden_size: int = 64,
                 num_layers: int = 2, dropout: float = 0.1) -> None:
        super().__init__()
        rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[cell]
        # torch warns (and does nothing) with inter-layer dropout on a single layer
        self.rnn = rnn(n_features, hidden_size, num_layers, batch_first=True,
                       dropout=dropout if num_layers > 1 else 0.0)
        self.head = nn.Linear(hidden_size, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1]).squeeze(-1)
