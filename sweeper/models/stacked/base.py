"""What every stacked model is made of: a stack of K members is one module whose parameters carry
a leading K dimension (HFTA's fused models), and members never mix.

A stacked model mirrors its one-member model's parameter names and shapes, with K in front:
``member_state(k)`` is a one-member state dict and ``load_member(k, state)`` takes one. So a stack
starts from K one-member models built with the members' seeds (K separate runs' initialisation,
draw for draw), and each member's best weights leave it as an ordinary trial's ``weights.pt``.

Inputs are ``x[K, B, L, F]`` (member k's batch in row k), outputs ``[K, B]``. A stack of one calls
torch's own layers (``F.linear``, ``F.dropout`` from the generator its run seeded), so it computes
what the one-member model computes, bit for bit. In a stack of several each member draws its dropout
masks from its own generator, started on the CPU where its lone run's draws start
(:meth:`StackedModule.seed_members`), and draws them as its lone run's kernels do (the same noise, in
the same order, on tensors of the same shape and layout: :class:`MemberDropout`), so a member is its
lone run, dropout included, up to the float rounding of the batched kernels."""

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class StackedLinear(nn.Module):
    """K independent ``nn.Linear(in, out)``: ``weight[K, out, in]``, ``bias[K, out]``, one
    batched matmul (``baddbmm``) for all members. Inputs ``[K, ..., in]`` -> ``[K, ..., out]``."""

    def __init__(self, members: int, in_features: int, out_features: int, bias: bool = True,
                 init: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(members, out_features, in_features))
        self.bias = nn.Parameter(torch.empty(members, out_features)) if bias else None
        if not init:  # its model draws it in its own order (init_linear)
            return
        # nn.Linear's initialisation per member, and for a stack of one draw for draw nn.Linear's (a stack is
        # usually loaded from one-member models, but one built alone must start where K fresh nn.Linear would)
        bound = 1 / math.sqrt(in_features) if in_features else 0.0
        with torch.no_grad():
            for k in range(members):
                nn.init.kaiming_uniform_(self.weight[k], a=math.sqrt(5))
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)

    def init_member(self, k: int) -> None:
        """Member ``k``'s weights drawn as ``nn.Linear.reset_parameters`` draws them."""
        with torch.no_grad():
            nn.init.kaiming_uniform_(self.weight[k], a=math.sqrt(5))
            if self.bias is not None:
                bound = 1 / math.sqrt(self.weight.shape[-1]) if self.weight.shape[-1] else 0.0
                nn.init.uniform_(self.bias[k], -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:  # a stack of one: nn.Linear's own kernel on the member's weights
            return F.linear(x[0], self.weight[0], None if self.bias is None else self.bias[0]).unsqueeze(0)
        return stacked_affine(x, self.weight, self.bias)


def stacked_affine(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x[K, ..., in] @ weight[K, out, in]^T + bias[K, out]``: one batched matmul for all members."""
    k, inner = x.shape[0], x.shape[1:-1]
    flat = x.reshape(k, -1, x.shape[-1])
    out = (torch.bmm(flat, weight.transpose(1, 2)) if bias is None
           else torch.baddbmm(bias.unsqueeze(1), flat, weight.transpose(1, 2)))
    return out.reshape(k, *inner, weight.shape[1])


class MemberDropout(nn.Module):
    """Dropout with each member's own rate (members of one shape but different dropout share a
    stack) and, once seeded, its own generator. Unseeded (a stack built outside a trial), and in a
    stack of one, it draws from the global generator like ``nn.Dropout``.

    Member k's mask is drawn as ``F.dropout`` draws its lone run's on the CPU: ``noise =
    empty_like(x).bernoulli_(1 - p).div_(1 - p)``, then ``x * noise``, and nothing drawn where
    ``p == 0``. ``bernoulli_`` fills a tensor in its memory order, so ``x[k]`` must be laid out as
    its lone run's dropout input is (the models see to it where torch's layers lay it out
    otherwise: an LSTM's sequences, the attention's output). A member whose batch is shorter than the
    stack's (``rows``, set by the step: an IC loss's whole dates, a shorter fold) draws for its own
    rows only (dimension ``batch_dim`` of ``x[k]``), as its lone run does; its padding keeps its value."""

    generators: list[torch.Generator] | None
    rows: list[int] | None = None  # each member's own rows in this step (None: every member's are all)

    def __init__(self, p: Sequence[float], batch_dim: int = 0) -> None:
        super().__init__()
        self.rates = [float(v) for v in p]
        self.any = any(v > 0 for v in p)
        self.generators, self.batch_dim = None, batch_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or not self.any:
            return x
        if len(self.rates) == 1:  # a stack of one: nn.Dropout's draw, from the generator its run seeded
            return F.dropout(x, self.rates[0], True)
        # empty_like keeps x's strides: member k's slice is laid out as its lone run's noise
        noise = torch.empty_like(x)
        for k, p in enumerate(self.rates):
            rows = x.shape[1 + self.batch_dim] if self.rows is None else self.rows[k]
            if p == 0 or rows == 0:
                noise[k].fill_(1.0)  # F.dropout draws nothing at p = 0 (nor a run with no rows here)
                continue
            # the same double 1 - p as F.dropout's, so the same draw and the same scale
            generator = None if self.generators is None else self.generators[k]
            if rows == x.shape[1 + self.batch_dim]:
                noise[k].bernoulli_(1 - p, generator=generator).div_(1 - p)
            else:
                noise[k].fill_(1.0)
                mask = _rows_like(x[k], self.batch_dim, rows).bernoulli_(1 - p, generator=generator)
                noise[k].narrow(self.batch_dim, 0, rows).copy_(mask.div_(1 - p))
        return x * noise


def _rows_like(x: torch.Tensor, dim: int, rows: int) -> torch.Tensor:
    """An empty tensor of ``x``'s shape but ``rows`` along ``dim``, its dimensions in ``x``'s memory order:
    a lone run's tensor of that many rows, which ``bernoulli_`` fills in the same order."""
    order = sorted(range(x.dim()), key=x.stride, reverse=True)
    laid = torch.empty([rows if d == dim else x.shape[d] for d in order], dtype=x.dtype, device=x.device)
    return laid.permute([order.index(d) for d in range(x.dim())])


def member_rows(stack: "StackedModule", rows: list[int] | None) -> None:
    """Tell ``stack`` and its dropouts each member's own rows in the next step (None: all of them)."""
    stack.rows = rows
    for module in stack.modules():
        if isinstance(module, MemberDropout):
            module.rows = rows


class StackedModule(nn.Module):
    """A stack of ``members`` models with one-member parameter names (see the module's doc)."""

    members: int
    plan: str = ""  # how it stacks, for the log (sweeper.models.stacked.build.stack_plan)
    member_dims: int = 1  # leading dimensions a parameter has for the members (K)
    rows: list[int] | None = None  # each member's own rows in this training step (member_rows)

    def stacked_state(self) -> dict[str, torch.Tensor]:
        """Each one-member name's stacked tensor (K in front)."""
        return self.state_dict()

    def member_state(self, k: int) -> dict[str, torch.Tensor]:
        """Member ``k``'s weights as its one-member model's state dict (CPU copies)."""
        return {name: t[k].detach().to("cpu", copy=True) for name, t in self.stacked_state().items()}

    def load_member(self, k: int, state: dict[str, torch.Tensor]) -> None:
        """Set member ``k``'s weights from a one-member model's state dict (same names)."""
        mine = self.stacked_state()
        if missing := sorted(set(mine) ^ set(state)):
            raise KeyError(f"member state does not match the stack's parameters: {missing[:4]}")
        with torch.no_grad():
            for name, t in mine.items():
                t[k].copy_(state[name])

    def seed_members(self, seeds: Sequence[int], device: torch.device | str,
                     states: Sequence[torch.Tensor] | None = None) -> list[torch.Generator]:
        """Give every member its own dropout generator, seeded with its run's seed and, on the CPU,
        set to ``states`` (the global generator's state once the member's one-member model was
        built: where its lone run's dropout draws start). ``states`` are the CPU generator's: on a
        GPU each starts from its seed, as a lone run's CUDA generator does (whose fused dropout
        kernels draw otherwise: there a member's masks are not its lone run's)."""
        if len(seeds) != self.members:
            raise ValueError(f"{len(seeds)} seeds for a stack of {self.members}")
        if self.members == 1:  # the global generator, which the run seeds with its seed, is its own
            return []
        generators = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]
        if states is not None and torch.device(device).type == "cpu":
            for g, state in zip(generators, states):
                g.set_state(state)
        for module in self.modules():
            if isinstance(module, MemberDropout):
                module.generators = generators
        return generators

    def no_weight_decay(self) -> set[str]:
        """The one-member model's exemptions (same names): none by default."""
        return set()


class SoloStack(StackedModule):
    """A stack of one: the one-member model itself (a user's model, whose parameters carry no K
    dimension: ``member_dims`` 0), calling exactly its kernels, bit for bit. Dropout draws from the
    global generator, which the run seeds with the member's seed."""

    member_dims = 0

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.members, self.model = 1, model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x[0]).unsqueeze(0)

    def member_state(self, k: int) -> dict[str, torch.Tensor]:
        return {name: t.detach().to("cpu", copy=True) for name, t in self.model.state_dict().items()}

    def load_member(self, k: int, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)

    def no_weight_decay(self) -> set[str]:
        named = getattr(self.model, "no_weight_decay", None)
        return {f"model.{name}" for name in named()} if named is not None else set()


class OneMember(nn.Module):
    """A built-in model's stack of one used as one model: ``x[B, L, F]`` -> ``[B]``, with a state dict
    of the one-member names and shapes, so that every command loads weights saved by any sweeper."""

    def __init__(self, stack: StackedModule) -> None:
        super().__init__()
        self.stack = stack

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stack(x.unsqueeze(0))[0]

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        return {name: t[0] for name, t in self.stack.state_dict().items()}

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True,
                        assign: bool = False) -> Any:
        self.stack.load_member(0, dict(state_dict))  # strict: load_member refuses other names

    def no_weight_decay(self) -> set[str]:
        return self.stack.no_weight_decay()
