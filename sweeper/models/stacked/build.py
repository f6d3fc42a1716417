"""``model.name`` -> a stack of K members with one-member weights: the built-ins natively, a
user's ``module:Class`` through ``torch.func`` (:mod:`sweeper.models.stacked.func`).

A stack is built from K one-member models built as a lone run builds them (each after
``seed_everything`` with its member's seed), so every member starts exactly where its separate
run would have started. :func:`stack_plan` says how a model config stacks, for the log and for
``sweeper validate``.
"""
from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from sweeper.config import ModelConfig
from sweeper.models.stacked.base import StackedModule

# config fields that must agree across a stack's members: they set its shapes and layers
SHAPE_FIELDS = ("name", "hidden_size", "num_layers", "d_model", "nhead", "dim_feedforward", "positional",
                "pooling", "gradient_checkpointing")


def stack_plan(model_cfg: ModelConfig, members: Sequence[nn.Module], n_features: int,
               lookback: int) -> tuple[str, str]:
    """(mode, one line): how a stack of ``model_cfg`` trains: ``native`` (a built-in), or a user
    model through torch.func, ``vmap`` or, where vmap cannot run it, ``loop`` (each member's
    forward in turn; the line says what vmap refused)."""
    if not model_cfg.is_custom:
        return "native", f"model {model_cfg.name}: stacked natively"
    from sweeper.models.stacked.func import VMAP, stack_mode

    mode, why = stack_mode(members, lookback, n_features)
    how = "batched by torch.func.vmap" if mode == VMAP else f"one member's forward after another: {why}"
    return mode, f"model.name {model_cfg.name!r}: stacked, {how}"


def build_stack(model_cfgs: Sequence[ModelConfig], n_features: int, lookback: int,
                members: Sequence[nn.Module]) -> StackedModule:
    """The stack of ``members`` (one-member models of ``model_cfgs``, same shapes), holding their
    weights. Its ``plan`` says how it stacks (:func:`stack_plan`)."""
    first = model_cfgs[0]
    if len(members) == 1:  # a lone run's own model: its own kernels, bit for bit
        from sweeper.models.stacked.base import SoloStack

        solo = SoloStack(members[0])
        solo.plan = f"model {first.name}: one run"
        return solo
    mode, line = stack_plan(first, members, n_features, lookback)
    if first.is_custom:
        from sweeper.models.stacked.func import FuncStack

        custom = FuncStack(members, mode)
        custom.plan = line
        return custom
    for other in model_cfgs[1:]:
        differs = [f for f in SHAPE_FIELDS if getattr(other, f, None) != getattr(first, f, None)]
        if differs:
            raise ValueError(f"members of one stack differ in {', '.join(differs)}")
    k, rates = len(model_cfgs), [m.dropout for m in model_cfgs]
    stack = _native(first, k, n_features, lookback, rates)
    stack.plan = line
    for index, member in enumerate(members):
        stack.load_member(index, member.state_dict())
    return stack


def _native(m: ModelConfig, k: int, n_features: int, lookback: int, rates: list[float]) -> StackedModule:
    if m.name == "mlp":
        from sweeper.models.stacked.mlp import StackedMLP

        return StackedMLP(k, n_features, lookback, hidden_size=m.hidden_size, num_layers=m.num_layers,
                          dropout=rates)
    if m.name in ("lstm", "gru"):
        from sweeper.models.stacked.recurrent import StackedRecurrent

        return StackedRecurrent(k, n_features, lookback, cell=m.name, hidden_size=m.hidden_size,
                                num_layers=m.num_layers, dropout=rates)
    from sweeper.models.stacked.transformer import StackedTransformer

    return StackedTransformer(k, n_features, lookback, d_model=m.d_model, nhead=m.nhead,
                              num_layers=m.num_layers, dim_feedforward=m.dim_feedforward, dropout=rates,
                              positional=m.positional, pooling=m.pooling,
                              gradient_checkpointing=m.gradient_checkpointing)
