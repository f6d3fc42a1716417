"""``model.name`` -> an nn.Module mapping x[B, L, F] to predictions [B]: a built-in as its stack of
one member (:class:`~sweeper.models.stacked.base.OneMember`), or a user's ``module:Class``."""

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from sweeper.config import ModelConfig
from sweeper.errors import ConfigError
from sweeper.models.paths import import_model_module, model_import_dirs, top_module
from sweeper.models.stacked.base import OneMember, StackedModule
from sweeper.models.stacked.mlp import StackedMLP
from sweeper.models.stacked.recurrent import StackedRecurrent
from sweeper.models.stacked.transformer import StackedTransformer


def native(m: ModelConfig, k: int, n_features: int, lookback: int, rates: Sequence[float]) -> StackedModule:
    """The built-in ``model.name`` as a stack of ``k`` members (dropout ``rates``, one per member
    or one for all): every built-in is written once, with K as a dimension."""
    if m.name == "mlp":
        return StackedMLP(k, n_features, lookback, hidden_size=m.hidden_size, num_layers=m.num_layers,
                          dropout=rates)
    if m.name in ("lstm", "gru"):
        return StackedRecurrent(k, n_features, lookback, cell=m.name, hidden_size=m.hidden_size,
                                num_layers=m.num_layers, dropout=rates)
    return StackedTransformer(k, n_features, lookback, d_model=m.d_model, nhead=m.nhead, dropout=rates,
                              num_layers=m.num_layers, dim_feedforward=m.dim_feedforward, pooling=m.pooling,
                              positional=m.positional, gradient_checkpointing=m.gradient_checkpointing)


BUILTIN_CLASSES: dict[str, type[nn.Module]] = {"transformer": StackedTransformer, "lstm": StackedRecurrent,
                                               "gru": StackedRecurrent, "mlp": StackedMLP}


def resolve_model_class(name: str) -> type:
    """The class behind ``model.name``: a built-in, or ``package.module:Class`` imported from the study file's
    folder, the current folder, or the Python path, in that order. Raises ConfigError naming ``model.name``
    and the import problem, so a study file can be checked without building anything."""
    if name in BUILTIN_CLASSES:
        return BUILTIN_CLASSES[name]
    module_name, sep, attr = name.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"model.name {name!r}: expected a built-in model "
                          f"({', '.join(BUILTIN_CLASSES)}) or a dotted path 'package.module:Class'")
    try:
        module = import_model_module(module_name)
    except Exception as exc:  # noqa: BLE001 - a broken user module can raise anything at import time
        where = (f"; looked in {', '.join(model_import_dirs())} and on the Python path"
                 if isinstance(exc, ModuleNotFoundError) and exc.name == top_module(module_name) else "")
        raise ConfigError(f"model.name {name!r}: cannot import module {module_name!r} "
                          f"({type(exc).__name__}: {exc}){where}") from None
    if (cls := getattr(module, attr, None)) is None:
        raise ConfigError(f"model.name {name!r}: module {module_name!r} has no attribute {attr!r}")
    if not callable(cls):
        raise ConfigError(f"model.name {name!r}: {attr!r} in {module_name!r} is not a class or callable")
    return cls


def check_trains(model: nn.Module, name: str, n_features: int, lookback: int) -> None:
    """The model check's: a forward's output must carry a gradient, or no step trains it (a .detach(), an int
    cast). In eval mode; in train mode (which may hang or exit) only where that has none (an eval no_grad)."""
    for mode in (False, True):  # (a user's train() may return None: its return value is not the model)
        model.train(mode)
        if (out := model(torch.zeros(2, lookback, n_features))).is_floating_point() and out.requires_grad:
            return
    raise ConfigError(f"model.name {name!r}: forward must return a float tensor that carries a gradient; "
                      f"got {out.dtype}, requires_grad={out.requires_grad}")


def build_model(model_cfg: ModelConfig, n_features: int, lookback: int) -> nn.Module:
    """A fresh model for inputs [B, lookback, n_features]; custom models are shape-checked here."""
    if not model_cfg.is_custom:  # a stack of one member, seen as one model
        return OneMember(native(model_cfg, 1, n_features, lookback, [model_cfg.dropout]))
    cls = resolve_model_class(model_cfg.name)
    kwargs: dict[str, Any] = model_cfg.custom_kwargs()
    try:
        model = cls(n_features=n_features, lookback=lookback, **kwargs)
    except Exception as exc:  # noqa: BLE001 - a user's constructor can raise anything
        raise ConfigError(f"model.name {model_cfg.name!r}: constructing it with n_features={n_features}, "
                          f"lookback={lookback} and {kwargs} failed ({type(exc).__name__}: {exc})") from None
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model.name {model_cfg.name!r}: expected a torch.nn.Module, "
                          f"got {type(model).__name__}")
    if not any(p.requires_grad for p in model.parameters()):  # nothing an optimizer could train
        raise ConfigError(f"model.name {model_cfg.name!r}: the model has no trainable parameters")
    exempt = set(getattr(model, "no_weight_decay", set)())  # any iterable of names; one that matches nothing
    if unknown := sorted(exempt - {name for name, _ in model.named_parameters()}):  # would be decayed
        raise ConfigError(f"model.name {model_cfg.name!r}: no_weight_decay() names no parameter {unknown}")
    if odd := sorted({str(p.dtype) for p in model.parameters()} - {str(torch.float32)}):  # as AdamW's state
        raise ConfigError(f"model.name {model_cfg.name!r}: its parameters must be float32 (train.precision "
                          f"sets the precision a step computes in), not {', '.join(odd)}")
    # a [B, 1] output would silently broadcast against [B] labels in the loss: catch it now
    name, was_training = model_cfg.name, model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(torch.zeros(2, lookback, n_features))
    except Exception as exc:  # noqa: BLE001 - a user's forward can raise anything
        raise ConfigError(f"model.name {name!r}: a test forward pass on x[2, {lookback}, {n_features}] "
                          f"failed ({type(exc).__name__}: {exc})") from None
    finally:
        model.train(was_training)
    if (shape := tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__) != (2,):
        raise ConfigError(f"model.name {name!r}: forward(x[B, {lookback}, {n_features}]) must return "
                          f"a tensor of shape [B]; got {shape} for B=2")
    return model
