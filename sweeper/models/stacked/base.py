"""What every stacked model is made of: a stack of K members is one module whose parameters
carry a leading K dimension (HFTA's fused models), and members never mix.

A stacked model mirrors its one-member model's parameter names and shapes exactly, with K
in front: ``member_state(k)`` is a state dict the one-member model loads as it is, and
``load_member(k, state)`` takes one. That is how a stack starts from K one-member models
built with the members' seeds (the same initialisation as K separate runs, draw for draw),
and how each member's best weights leave the stack as an ordinary trial's ``model.pt``.

Inputs are ``x[K, B, L, F]`` (member k's batch in row k) and outputs ``[K, B]``. Dropout
draws each member's mask from that member's own generator (:meth:`StackedModule.seed_members`),
so a member's masks do not depend on which other members share its stack.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn


class StackedLinear(nn.Module):
    """K independent ``nn.Linear(in, out)``: ``weight[K, out, in]``, ``bias[K, out]``, one
    batched matmul (``baddbmm``) for all members. Inputs ``[K, ..., in]`` -> ``[K, ..., out]``."""

    def __init__(self, members: int, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(members, out_features, in_features))
        self.bias = nn.Parameter(torch.empty(members, out_features)) if bias else None
        # nn.Linear's initialisation per member (a stack is usually loaded from one-member models,
        # but one built alone must start where K fresh nn.Linear would)
        bound = 1 / math.sqrt(in_features) if in_features else 0.0
        with torch.no_grad():
            for k in range(members):
                nn.init.kaiming_uniform_(self.weight[k], a=math.sqrt(5))
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, inner = x.shape[0], x.shape[1:-1]
        flat = x.reshape(k, -1, x.shape[-1])
        if self.bias is None:
            out = torch.bmm(flat, self.weight.transpose(1, 2))
        else:
            out = torch.baddbmm(self.bias.unsqueeze(1), flat, self.weight.transpose(1, 2))
        return out.reshape(k, *inner, self.weight.shape[1])


class MemberDropout(nn.Module):
    """Dropout with each member's own rate ``p[k]`` and, once seeded, its own generator.

    Unseeded (a stack built outside a trial) it draws from the global generator like
    ``nn.Dropout``. The rates are a buffer, not a parameter: a per-member hyperparameter,
    so that members of one shape but different dropout can share a stack."""

    generators: list[torch.Generator] | None
    p: torch.Tensor

    def __init__(self, p: Sequence[float]) -> None:
        super().__init__()
        self.register_buffer("p", torch.tensor([float(v) for v in p]), persistent=False)
        self.any = any(v > 0 for v in p)
        self.generators = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or not self.any:
            return x
        if self.generators is None:
            draw = torch.rand(x.shape, device=x.device, dtype=x.dtype)
        else:
            draw = torch.stack([torch.rand(x.shape[1:], generator=g, device=x.device, dtype=x.dtype)
                                for g in self.generators])
        keep = (1.0 - self.p).to(x.dtype).view(-1, *([1] * (x.dim() - 1)))
        mask = (draw < keep).to(x.dtype).div_(keep)  # one tensor of kept-and-rescaled, then one product
        return x * mask


class StackedFlatten(nn.Module):
    """``nn.Flatten`` of each member's batch: ``[K, B, L, F]`` -> ``[K, B, L*F]``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(2)


class StackedModule(nn.Module):
    """A stack of ``members`` models with one-member parameter names (see the module's doc)."""

    members: int
    plan: str = ""  # how it stacks, for the log (sweeper.models.stacked.build.stack_plan)
    member_dims: int = 1  # leading dimensions a parameter has for the members (K)

    def member_state(self, k: int) -> dict[str, torch.Tensor]:
        """Member ``k``'s weights as its one-member model's state dict (CPU copies)."""
        return {name: t[k].detach().to("cpu", copy=True) for name, t in self.state_dict().items()}

    def load_member(self, k: int, state: dict[str, torch.Tensor]) -> None:
        """Set member ``k``'s weights from a one-member model's state dict (same names)."""
        mine = self.state_dict()
        missing = sorted(set(mine) ^ set(state))
        if missing:
            raise KeyError(f"member state does not match the stack's parameters: {missing[:4]}")
        with torch.no_grad():
            for name, t in mine.items():
                t[k].copy_(state[name])

    def seed_members(self, seeds: Sequence[int], device: torch.device | str) -> list[torch.Generator]:
        """Give every member its own dropout generator, seeded with its run's seed."""
        if len(seeds) != self.members:
            raise ValueError(f"{len(seeds)} seeds for a stack of {self.members}")
        generators = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]
        for module in self.modules():
            if isinstance(module, MemberDropout):
                module.generators = generators
        return generators

    def no_weight_decay(self) -> set[str]:
        """The one-member model's exemptions (same names): none by default."""
        return set()


class SoloStack(StackedModule):
    """A stack of one: the one-member model itself, so that a run of one member calls exactly
    the kernels a lone run of that model calls (torch's fused LSTM, the transformer's eval fast
    path, ``F.linear``), bit for bit. Its parameters carry no K dimension (``member_dims`` 0).
    Dropout draws from the global generator, which the run seeds with the member's seed: a
    stack of one member owns it."""

    member_dims = 0

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.members = 1
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x[0]).unsqueeze(0)

    def member_state(self, k: int) -> dict[str, torch.Tensor]:
        return {name: t.detach().to("cpu", copy=True) for name, t in self.model.state_dict().items()}

    def load_member(self, k: int, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)

    def seed_members(self, seeds: Sequence[int], device: torch.device | str) -> list[torch.Generator]:
        return []

    def no_weight_decay(self) -> set[str]:
        named = getattr(self.model, "no_weight_decay", None)
        return {f"model.{name}" for name in named()} if named is not None else set()
