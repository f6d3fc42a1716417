"""Models: ``build_model(model_cfg, n_features, lookback)`` -> module mapping x[B, L, F] to [B]."""
from __future__ import annotations

from sweeper.models.build import BUILTIN_CLASSES, build_model, resolve_model_class

__all__ = ["BUILTIN_CLASSES", "build_model", "resolve_model_class"]
