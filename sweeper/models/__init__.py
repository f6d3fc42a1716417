"""Models: ``build_model(model_cfg, n_features, lookback)`` -> module mapping x[B, L, F] to [B].

- :mod:`~sweeper.models.build`: ``model.name`` -> nn.Module, a built-in or ``module:Class``;
- :mod:`~sweeper.models.stacked`: every built-in model, written once with K members as a dimension;
- :mod:`~sweeper.models.paths`: where a ``module:Class`` is found (the study's folder first);
- :mod:`~sweeper.models.check`: the driver's build check, user models in a child process;
- :mod:`~sweeper.models.check_cache`: a clean user-model check kept by its files' content;
- :mod:`~sweeper.models.shapes`: the model shapes a search space can sample, each built once.

The names below load on first use: the CLI imports :mod:`~sweeper.models.paths` for every
command, and ``sweeper status`` should not wait for torch."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sweeper.models.build import BUILTIN_CLASSES, build_model, resolve_model_class

__all__ = ["BUILTIN_CLASSES", "build_model", "resolve_model_class"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from sweeper.models import build

        return getattr(build, name)
    raise AttributeError(f"module 'sweeper.models' has no attribute {name!r}")
