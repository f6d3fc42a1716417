"""The data layer: Parquet (or synthetic) panel -> resident tensors -> batches.

See docs/data.md for the Parquet contract, normalisation, split and purge
rules, windows, device placement and the synthetic generator.

- :mod:`~sweeper.data.load`: ``load_panel``: a DataConfig -> a validated, normalised, split Panel;
- :mod:`~sweeper.data.parquet`: the Parquet contract: schema checks, then only the needed columns;
- :mod:`~sweeper.data.columns`: a panel's long columns and each row's place in the dense layout;
- :mod:`~sweeper.data.features`: which columns are features (names, globs, exclusions);
- :mod:`~sweeper.data.build`: a panel's arrays built with bounded memory;
- :mod:`~sweeper.data.normalize`: feature and label normalisation;
- :mod:`~sweeper.data.split`: the time split of target dates, with its purge gaps;
- :mod:`~sweeper.data.folds`: walk-forward folds: the fold layout and each fold's panel;
- :mod:`~sweeper.data.leak`: the leak guard (a feature that is a same-date future return);
- :mod:`~sweeper.data.panel`: the resident panel: dense tensors, mask, splits, sample index;
- :mod:`~sweeper.data.batches`: batches of windows gathered from the panel (a stack's too);
- :mod:`~sweeper.data.placement`: where the panel lives while a trial trains;
- :mod:`~sweeper.data.cache`: the panel cache, built once per host and mapped by every process;
- :mod:`~sweeper.data.scoring`: a panel of new data to score (``sweeper predict --data``);
- :mod:`~sweeper.data.synth`: the synthetic panel with a planted signal and a known oracle IC.

The names below load on first use: the driver of ``sweeper run`` reads the panel cache's
folder (:mod:`sweeper.data.cache`) and never imports torch."""

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
