"""The built-in MLP, written once with the member count K as a dimension: K >= 1 independent MLPs
(``nn.Sequential`` names: ``net.1.weight`` ... K in front)."""

from collections.abc import Sequence

import torch
from torch import nn

from sweeper.models.stacked.base import MemberDropout, StackedLinear, StackedModule


class StackedMLP(StackedModule):
    """x[K, B, L, F] -> flatten -> num_layers x (Linear, GELU, Dropout) -> Linear -> [K, B]."""

    def __init__(self, members: int, n_features: int, lookback: int, *, hidden_size: int = 64,
                 num_layers: int = 2, dropout: Sequence[float] = (0.1,)) -> None:
        super().__init__()
        self.members = members
        rates = list(dropout) * members if len(dropout) == 1 else list(dropout)
        # each member's [B, L, F] flattened: index for index as the one-member nn.Sequential
        layers: list[nn.Module] = [nn.Flatten(2)]
        width = n_features * lookback
        for _ in range(num_layers):
            layers += [StackedLinear(members, width, hidden_size), nn.GELU(), MemberDropout(rates)]
            width = hidden_size
        layers.append(StackedLinear(members, width, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)
