"""Small models loaded through ``model.name: custom_model:<Class>`` in the training tests."""
from __future__ import annotations

import torch
from torch import nn


class Tiny(nn.Module):
    """A linear model on the last step; ``scale`` shows that extra model keys reach the constructor."""

    def __init__(self, n_features: int, lookback: int, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale
        self.lookback = lookback
        self.linear = nn.Linear(n_features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * self.linear(x[:, -1]).squeeze(-1)


class NoWeights(nn.Module):
    """Returns a feature as it is: nothing to train (every trial failed in the optimizer's set-up)."""

    def __init__(self, n_features: int, lookback: int) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, -1, 0]


class Detached(nn.Module):
    """Returns its output detached from the graph (or, with ``cast``, as integers): no step trains it."""

    def __init__(self, n_features: int, lookback: int, cast: bool = False) -> None:
        super().__init__()
        self.linear, self.cast = nn.Linear(n_features, 1), cast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x[:, -1]).squeeze(-1)
        return out.long() if self.cast else out.detach()


class EvalNoGrad(nn.Module):
    """Evaluates under its own no_grad (as a model with an EMA copy may): it trains like any other."""

    def __init__(self, n_features: int, lookback: int) -> None:
        super().__init__()
        self.linear = nn.Linear(n_features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            return self.linear(x[:, -1]).squeeze(-1)
        with torch.no_grad():
            return self.linear(x[:, -1]).squeeze(-1)


class TrainNoReturn(Tiny):
    """Overrides train() without returning self (as a BatchNorm freeze may): the loop never uses the value."""

    def train(self, mode: bool = True) -> None:  # type: ignore[override]
        super().train(mode)


class WrongShape(nn.Module):
    """Returns [B, 1] instead of [B]: build_model must refuse it."""

    def __init__(self, n_features: int, lookback: int) -> None:
        super().__init__()
        self.linear = nn.Linear(n_features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x[:, -1])


class OomAbove(nn.Module):
    """Tiny that raises CUDA's out-of-memory error on training batches larger than ``limit`` rows:
    the seam for testing OOM recovery on a CPU. ``OomAbove.log`` lists every training batch size."""

    log: list[int] = []

    def __init__(self, n_features: int, lookback: int, limit: int = 16) -> None:
        super().__init__()
        self.limit = limit
        self.linear = nn.Linear(n_features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and torch.is_grad_enabled():
            OomAbove.log.append(x.shape[0])
            if x.shape[0] > self.limit:
                raise torch.OutOfMemoryError(f"CUDA out of memory (fake: {x.shape[0]} rows > {self.limit})")
        return self.linear(x[:, -1]).squeeze(-1)


class ExplodeAfter(nn.Module):
    """Tiny whose output turns NaN on the training calls listed in ``nan_calls`` (0-based)."""

    def __init__(self, n_features: int, lookback: int, nan_calls: list[int] | None = None) -> None:
        super().__init__()
        self.nan_calls = set(nan_calls or [])
        self.calls = 0
        self.linear = nn.Linear(n_features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x[:, -1]).squeeze(-1)
        if self.training and torch.is_grad_enabled():
            if self.calls in self.nan_calls:
                out = out * float("nan")
            self.calls += 1
        return out


class Frozen(nn.Module):
    """Fixed random weights: training cannot change its predictions (the one trainable
    parameter gets zero gradients), so validation scores never improve after epoch 1."""

    def __init__(self, n_features: int, lookback: int) -> None:
        super().__init__()
        self.linear = nn.Linear(n_features, 1).requires_grad_(False)
        self.unused = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x[:, -1]).squeeze(-1) + 0.0 * self.unused


class Double(nn.Module):
    """float64 weights: the flat AdamW keeps float32 state, so every step of every trial failed."""

    def __init__(self, n_features: int, lookback: int) -> None:
        super().__init__()
        self.linear = nn.Linear(n_features, 1).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x[:, -1].double()).squeeze(-1).float()


class Typo(Tiny):
    """Exempts from weight decay a parameter it does not have (``linear.weigth``): it was decayed silently."""

    def no_weight_decay(self) -> set[str]:
        return {"linear.weigth"}


class TinyLSTM(nn.Module):
    """An nn.LSTM on the window: torch.func.vmap has no batching rule for it, so its stacks run
    each member's forward in turn."""

    def __init__(self, n_features: int, lookback: int, hidden: int = 4) -> None:
        super().__init__()
        self.rnn = nn.LSTM(n_features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1]).squeeze(-1)


class TinyDropout(nn.Module):
    """Tiny with dropout on its input: a forward that draws random numbers in training."""

    def __init__(self, n_features: int, lookback: int, p: float = 0.3) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p)
        self.linear = nn.Linear(n_features * lookback, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.dropout(x.flatten(1))).squeeze(-1)


class TinyBatchNorm(nn.Module):
    """Tiny with batch statistics: a row's output in training depends on the batch's other rows."""

    def __init__(self, n_features: int, lookback: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(n_features)
        self.linear = nn.Linear(n_features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm(x[:, -1])).squeeze(-1)


class EvenRows(Tiny):
    """Refuses an odd batch (as a model pairing its rows may): the stack's plan must not fail on it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] % 2:
            raise ValueError("an even batch is needed")
        return super().forward(x)
