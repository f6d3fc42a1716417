"""``model.name`` -> a stack of K members with one-member weights: the built-ins natively, a
user's ``module:Class`` through ``torch.func`` (:mod:`sweeper.models.stacked.func`). A stack is
built from K one-member models, each built after seeding with its member's seed, so every member
starts exactly where its separate run would have started."""

from collections.abc import Sequence

from torch import nn

from sweeper.config import ModelConfig
from sweeper.models.build import native
from sweeper.models.stacked.base import OneMember, SoloStack, StackedModule

# config fields that must agree across a stack's members: they set its shapes and layers
SHAPE_FIELDS = ("name", "hidden_size", "num_layers", "d_model", "nhead", "dim_feedforward", "positional",
                "pooling", "gradient_checkpointing")


def stack_plan(model_cfg: ModelConfig, members: Sequence[nn.Module], n_features: int,
               lookback: int) -> tuple[str, str]:
    """(mode, a line for the log and ``sweeper validate``): ``native`` (a built-in), or a user model's
    ``vmap`` (``vmap_even_rows`` where its rows see each other) or, where vmap cannot run it, ``loop``
    (the line says what vmap refused)."""
    if not model_cfg.is_custom:
        return "native", f"model {model_cfg.name}: stacked natively"
    from sweeper.models.stacked.func import LOOP, ROWS, stack_mode

    mode, why = stack_mode(members, lookback, n_features)
    how = (f"one member's forward after another: {why}" if mode == LOOP
           else "batched by torch.func.vmap" + (f", but {why}" if mode == ROWS else ""))
    return mode, f"model.name {model_cfg.name!r}: stacked, {how}"


def build_stack(model_cfgs: Sequence[ModelConfig], n_features: int, lookback: int,
                members: Sequence[nn.Module]) -> StackedModule:
    """The stack of ``members`` (one-member models of ``model_cfgs``, same shapes) holding their
    weights; its ``plan`` says how it stacks."""
    first = model_cfgs[0]
    if len(members) == 1:  # a run of one member: the member's own stack (a user model's own module)
        return one.stack if isinstance(one := members[0], OneMember) else SoloStack(one)
    mode, line = stack_plan(first, members, n_features, lookback)
    if first.is_custom:
        from sweeper.models.stacked.func import FuncStack

        custom = FuncStack(members, mode)
        custom.plan = line
        return custom
    for other in model_cfgs[1:]:
        if differs := [f for f in SHAPE_FIELDS if getattr(other, f, None) != getattr(first, f, None)]:
            raise ValueError(f"members of one stack differ in {', '.join(differs)}")
    k, rates = len(model_cfgs), [m.dropout for m in model_cfgs]
    stack = native(first, k, n_features, lookback, rates)
    stack.plan = line
    for index, member in enumerate(members):
        stack.load_member(index, member.state_dict())
    return stack
