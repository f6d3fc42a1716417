"""The one-member models as the lone training loop had them, before every model was written once with
K as a dimension (issue 39): the reference a stack of one is held to, bit for bit, in
tests/test_models_once.py. Copied from sweeper/models/{mlp,recurrent,transformer}.py at d1a4397."""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from sweeper.core.schedule import adamw


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

def sinusoidal_positions(length: int, d_model: int) -> torch.Tensor:
    """The fixed sine/cosine table of "Attention is all you need", [length, d_model]."""
    pos = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(length, d_model)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: d_model // 2])
    return table


class TransformerModel(nn.Module):
    """x[B, L, F] -> linear projection + positions -> pre-norm encoder -> pooled -> [B]."""

    def __init__(self, n_features: int, lookback: int, *, d_model: int = 64, nhead: int = 4,
                 num_layers: int = 2, dim_feedforward: int = 128, dropout: float = 0.1,
                 positional: str = "learned", pooling: str = "last",
                 gradient_checkpointing: bool = False) -> None:
        super().__init__()
        self.project = nn.Linear(n_features, d_model)
        if positional == "learned":
            self.positions = nn.Parameter(torch.randn(lookback, d_model) * 0.02)
        else:
            self.register_buffer("positions", sinusoidal_positions(lookback, d_model), persistent=False)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout,
                                           activation="gelu", batch_first=True, norm_first=True)
        # pre-norm layers need a final norm; nested tensors only help with padding masks (we have none)
        self.encoder = nn.TransformerEncoder(layer, num_layers, norm=nn.LayerNorm(d_model),
                                             enable_nested_tensor=False)
        self.pooling = pooling
        self.gradient_checkpointing = gradient_checkpointing
        self.head = nn.Linear(d_model, 1)

    def no_weight_decay(self) -> set[str]:
        """Parameters AdamW must not decay: the learned position table (a matrix, but
        shrinking it towards zero would only blur the positions)."""
        return {"positions"} if isinstance(self.positions, nn.Parameter) else set()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.project(x) + self.positions[-x.shape[1]:]
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            # trade one extra forward per layer for not storing its activations
            for layer in self.encoder.layers:
                h = checkpoint(layer, h, use_reentrant=False)
            norm = self.encoder.norm
            assert norm is not None  # always built in __init__; torch types it optional
            h = norm(h)
        else:
            h = self.encoder(h)
        pooled = h[:, -1] if self.pooling == "last" else h.mean(dim=1)
        return self.head(pooled).squeeze(-1)


def make_optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW with weight decay on weight matrices only: biases, norms and position tables are not
    shrunk towards zero (a position table is a matrix, so a model names it in ``no_weight_decay()``,
    timm's convention). The lone loop's optimizer at d1a4397:
    the reference of :class:`~sweeper.core.optim.FlatStack`'s split."""
    named = getattr(model, "no_weight_decay", None)
    exempt = set(named()) if named is not None else set()
    trained = [(p, p.dim() >= 2 and name not in exempt)
               for name, p in model.named_parameters() if p.requires_grad]
    return adamw([p for p, d in trained if d], [p for p, d in trained if not d], lr, weight_decay)
