"""The data layer: Parquet (or synthetic) panel -> resident tensors -> batches.

See docs/data.md for the Parquet contract, normalisation, split and purge
rules, windows, device placement and the synthetic generator.
"""
from __future__ import annotations

from sweeper.data.batches import Batch, Batcher
from sweeper.data.load import load_panel
from sweeper.data.panel import Panel
from sweeper.data.placement import placement
from sweeper.data.synth import synthetic_frame, write_synthetic

__all__ = ["Batch", "Batcher", "Panel", "load_panel", "placement", "synthetic_frame", "write_synthetic"]
