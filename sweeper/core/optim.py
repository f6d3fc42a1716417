"""The one optimizer of every run: AdamW over a stack of K members, gradient clipping and fp16
loss scaling, each per member, in a handful of kernels whatever the number of parameters.

The stack's parameters are views into one flat ``[K, N]`` buffer and their gradients views into
another (:class:`FlatStack`): a member's gradient norm is one row norm, and clipping, the moments
and the update are a few ops on ``[K, N]`` (a per-parameter loop would launch hundreds of small
kernels per step and lose what stacking gains).

Members never mix (HFTA): each has its own gradient norm and clipping, learning rate, weight
decay, schedule position, step count (Adam's bias correction) and loss scale, and a mask: a
member that has stopped, finished its epoch or produced a non-finite gradient makes no update
(moments, step count and weights stay as they were).

A stack of one runs torch's own AdamW (its fused kernel where it runs) and ``clip_grad_norm_`` on
the member's tensors, whose state lives in the same flat buffers: to the bit the run torch's
optimizer would make (a row norm and the flat update round differently in the last bits)."""

import itertools
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from sweeper.core.schedule import adamw
from sweeper.models.stacked.base import StackedModule

# the flat parameter views are strided across members by design: torch warns once that such a
# gradient layout "may impair performance"; the layout is the point (one [K, N] update)
warnings.filterwarnings("ignore", message="grad and param do not obey the gradient layout contract")

# torch.amp.GradScaler's defaults, per member
INIT_SCALE, GROWTH, BACKOFF, GROWTH_INTERVAL = 2.0 ** 16, 2.0, 0.5, 2000


class FlatStack:
    """The stack's trainable parameters re-homed as views of one ``[K, N]`` buffer, with
    ``.grad`` views of a second one that backward accumulates into in place."""

    def __init__(self, model: StackedModule) -> None:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        k = model.members
        first = named[0][1]
        sizes = [p.numel() // k for _, p in named]
        self.values = torch.zeros(k, sum(sizes), device=first.device, dtype=first.dtype)
        self.grads = torch.zeros_like(self.values)
        exempt = model.no_weight_decay()
        self.decay = torch.zeros(1, sum(sizes), device=first.device, dtype=first.dtype)
        self.spans = [slice(end - size, end) for size, end in zip(sizes, itertools.accumulate(sizes))]
        # a matrix per member: AdamW decays it
        self.decayed = [p.dim() - model.member_dims >= 2 and name not in exempt for name, p in named]
        for (name, p), size, span, decayed in zip(named, sizes, self.spans, self.decayed):
            self.values[:, span].copy_(p.detach().reshape(k, size))
            path, _, attr = name.rpartition(".")
            owner = model.get_submodule(path) if path else model
            fresh = nn.Parameter(self.values[:, span].view(p.shape))
            fresh.grad = self.grads[:, span].view(p.shape)
            owner._parameters[attr] = fresh  # the flat view replaces the module's own tensor
            if decayed:
                self.decay[:, span] = 1.0
        self.params = [p for _, p in model.named_parameters() if p.requires_grad]

    def zero_grad(self) -> None:
        self.grads.zero_()  # in place: the .grad views stay the parameters' gradients


def _col(v: torch.Tensor) -> torch.Tensor:
    return v.view(-1, 1)


class StackedAdamW:
    """AdamW (decoupled weight decay on matrices only) over a :class:`FlatStack`, with per-member
    ``lr``, ``weight_decay`` and clipping."""

    def __init__(self, flat: FlatStack, lr: Sequence[float], weight_decay: Sequence[float],
                 grad_clip: float | None, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        dev = flat.values.device
        self.flat, self.grad_clip, self.betas, self.eps = flat, grad_clip, betas, eps
        self.base_lr = [float(v) for v in lr]
        self.base_weight_decay = [float(v) for v in weight_decay]  # host floats, as torch's groups hold them
        self.lr = torch.tensor(self.base_lr, device=dev)
        self.weight_decay = torch.tensor(self.base_weight_decay, device=dev)
        self.factor = torch.ones_like(self.lr)  # the schedule's multiplier, set before each step
        self.steps = torch.zeros_like(self.lr)
        self.exp_avg, self.exp_avg_sq = torch.zeros_like(flat.values), torch.zeros_like(flat.values)
        self.torch_adamw = _torch_adamw(self) if len(self.base_lr) == 1 else None

    def set_factors(self, factors: Sequence[float]) -> None:
        """Each member's schedule multiplier for the next step (host floats, known without a sync)."""
        if self.torch_adamw is not None:  # LambdaLR's rule: base_lr * factor, a host float
            for group in self.torch_adamw.param_groups:
                group["lr"] = self.base_lr[0] * factors[0]
            return
        self.factor = on_device(list(factors), self.lr.device)

    def step(self, active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Clip and update the members with ``active`` (float [K], 1.0: may update) whose
        gradient norm is finite. Returns (the norms [K], each member's skip flag [K]: 1.0 where
        a non-finite gradient stopped its update). No host sync."""
        if self.torch_adamw is not None:
            return self._step_one()
        beta1, beta2 = self.betas
        norms = torch.linalg.vector_norm(self.flat.grads.float(), dim=1)  # clip_grad_norm_'s, per row
        finite = torch.isfinite(norms)
        # torch's clip_grad_norm_: max_norm / (norm + 1e-6), at most 1
        coef = (self.grad_clip / (norms + 1e-6)).clamp(max=1.0) if self.grad_clip else torch.ones_like(norms)
        go = active * finite
        # a skipped member's gradient may hold inf/NaN: zero it, so that 0 x NaN never reaches a weight
        grad = torch.where(_col(finite), self.flat.grads, 0.0) * _col(torch.where(finite, coef * go, 0.0))
        self.exp_avg.lerp_(grad, _col((1 - beta1) * go))
        self.exp_avg_sq.mul_(_col(1 - (1 - beta2) * go)).addcmul_(grad, grad, value=1 - beta2)
        self.steps += go
        # the scalars of each member's update in double, rounded once to the weights' dtype, as torch's
        # AdamW works them out on the host (in float32 they round the first steps ~6e-6 short)
        done = self.steps.clamp(min=1.0).double()  # a member yet to update divides by nothing below
        lr = self.lr.double() * self.factor.double() * go.double()
        dtype, values = self.flat.values.dtype, self.flat.values
        values.mul_(1 - _col((lr * self.weight_decay.double()).to(dtype)) * self.flat.decay)
        denom = (self.exp_avg_sq.sqrt() / _col((1 - beta2 ** done).sqrt().to(dtype))).add_(self.eps)
        values.sub_(self.exp_avg / denom * _col((lr / (1 - beta1 ** done)).to(dtype)))
        return norms, (1.0 - finite.float())

    def _step_one(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A stack of one: torch's clipping and AdamW on the member's own tensors (a lone member is
        always active: a stopped one ends the run)."""
        assert self.torch_adamw is not None
        params = self.flat.params
        norm = (nn.utils.clip_grad_norm_(params, self.grad_clip) if self.grad_clip
                else nn.utils.get_total_norm([p.grad for p in params if p.grad is not None]))
        # norm x 0 is 0 when finite and NaN otherwise: a few small kernels, no read
        skipped = norm.mul(0).nan_to_num_(nan=1.0, posinf=1.0, neginf=1.0).to(torch.float32)
        update_unless(self.torch_adamw, skipped)
        return norm.view(1), skipped.view(1)

    def state_dict(self) -> dict[str, torch.Tensor]:
        if self.torch_adamw is not None:  # torch's AdamW counts the steps of a stack of one
            self.steps = self.torch_adamw.state[self.flat.params[0]]["step"].view(1).to(self.steps, copy=True)
        return {"lr": self.lr, "weight_decay": self.weight_decay, "steps": self.steps,
                "exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq}

    def adopt_torch_state(self) -> dict[str, torch.Tensor]:
        """After torch's ``load_state_dict`` on the stack of one's AdamW (a lone run's checkpoint):
        its moments copied into the flat buffers and its state pointed at them again; the flat state."""
        assert self.torch_adamw is not None
        with torch.no_grad():
            for p, span in zip(self.flat.params, self.flat.spans):
                loaded = self.torch_adamw.state[p]
                for name, flat in (("exp_avg", self.exp_avg), ("exp_avg_sq", self.exp_avg_sq)):
                    loaded[name] = flat[:, span].view(p.shape).copy_(loaded[name])
        return {k: v.clone() for k, v in self.state_dict().items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for name in ("lr", "weight_decay", "steps", "exp_avg", "exp_avg_sq"):
            getattr(self, name).copy_(state[name])
        if self.torch_adamw is not None:
            for p in self.flat.params:
                self.torch_adamw.state[p]["step"].fill_(float(self.steps[0]))


def _torch_adamw(opt: StackedAdamW) -> torch.optim.Optimizer:
    """torch's AdamW over a stack of one, with its state in ``opt``'s flat buffers (views of them,
    so that the checkpoint and the flat path read the same numbers)."""
    flat = opt.flat
    decay = [p for p, d in zip(flat.params, flat.decayed) if d]
    other = [p for p, d in zip(flat.params, flat.decayed) if not d]
    single = adamw(decay, other, opt.base_lr[0], opt.base_weight_decay[0])
    fused = bool(single.param_groups[0].get("fused"))
    for p, span in zip(flat.params, flat.spans):
        # the step counter as torch's _init_group makes it: a device tensor for the fused kernel
        step = torch.zeros((), dtype=torch.float32, device=p.device if fused else "cpu")
        single.state[p] = {"step": step, "exp_avg": opt.exp_avg[:, span].view(p.shape),
                           "exp_avg_sq": opt.exp_avg_sq[:, span].view(p.shape)}
    return single


def update_unless(optimizer: torch.optim.Optimizer, skip: torch.Tensor) -> None:
    """``optimizer.step()`` unless the device flag ``skip`` (float32 1.0) is set, without reading it.

    torch's fused AdamW skips a step on the device when its ``found_inf`` is set (steps, moments and weights
    untouched): the GradScaler hands it the flag through the ``found_inf`` / ``grad_scale`` attributes, and
    so do we. Other optimizers read the flag on the host (a sync per step)."""
    if not all(group.get("fused") for group in optimizer.param_groups):
        if not bool(skip):
            optimizer.step()
        return
    fused: Any = optimizer  # the two attributes are the GradScaler's protocol, not declared on Optimizer
    fused.grad_scale = None  # gradients are already unscaled
    fused.found_inf = skip
    try:
        optimizer.step()
    finally:
        del fused.grad_scale, fused.found_inf


def on_device(values: list[float], device: torch.device) -> torch.Tensor:
    """A step's per-member host values [K] on the device without a host sync: a copy from pageable
    memory waits for the device's queue (every step would stall it), one from pinned memory does not."""
    host = torch.tensor(values, dtype=torch.float32)
    return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host.to(device)


class MemberScaler:
    """fp16 loss scaling per member (torch's GradScaler rule, one scale per row): a member
    whose gradient overflows halves its own scale and skips its own step. Disabled (bf16,
    fp32): the losses are summed as they are."""

    def __init__(self, members: int, device: torch.device | str, enabled: bool) -> None:
        self.enabled = enabled
        self.scale_ = torch.full((members,), INIT_SCALE if enabled else 1.0, device=device)
        self.good = torch.zeros(members, device=device)

    def scale(self, losses: torch.Tensor) -> torch.Tensor:
        """The one scalar to backward: the sum of each member's (scaled) loss."""
        return (losses * self.scale_).sum() if self.enabled else losses.sum()

    def unscale_(self, flat: FlatStack) -> None:
        if self.enabled:
            flat.grads.div_(_col(self.scale_))

    def update(self, skipped: torch.Tensor) -> None:
        if not self.enabled:
            return
        self.good = (self.good + 1) * (1 - skipped)
        grow = (self.good >= GROWTH_INTERVAL).float()
        self.scale_ = self.scale_ * torch.where(skipped > 0, BACKOFF, 1.0) * (1 + (GROWTH - 1) * grow)
        self.good = self.good * (1 - grow)
