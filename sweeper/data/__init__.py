"""The data layer: Parquet (or synthetic) panel -> resident tensors -> batches.

See docs/data.md for the Parquet contract, normalisation, split and purge
rules, windows, device placement and the synthetic generator.

The names below load on first use: the driver of ``sweeper run`` reads the panel cache's
folder (:mod:`sweeper.data.cache`) and never imports torch.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sweeper.data.batches import Batch, Batcher
    from sweeper.data.load import load_panel
    from sweeper.data.panel import Panel
    from sweeper.data.synth import synthetic_frame, write_synthetic

from sweeper.data.placement import placement  # here, not lazily: it shares its module's name

_HOMES = {"Batch": "batches", "Batcher": "batches", "load_panel": "load", "Panel": "panel",
          "synthetic_frame": "synth", "write_synthetic": "synth"}
__all__ = ["Batch", "Batcher", "Panel", "load_panel", "placement", "synthetic_frame", "write_synthetic"]


if not TYPE_CHECKING:  # mypy reads the imports above, and finds a misspelt name
    def __getattr__(name: str) -> Any:
        if name in _HOMES:
            return getattr(importlib.import_module(f"sweeper.data.{_HOMES[name]}"), name)
        raise AttributeError(f"module 'sweeper.data' has no attribute {name!r}")
