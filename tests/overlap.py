"""The most trials that ran at once, from their start and complete times in the store.

For the packing tests and ``benchmarks/gpu_check.py`` (which puts tests/ on its path, as
``benchmarks/report.py`` does): they check that packing ran trials side by side, and no
more of them than it should. Nothing in sweeper itself needs the figure.
"""
from __future__ import annotations

from datetime import datetime

from optuna.trial import FrozenTrial


def most_at_once(trials: list[FrozenTrial]) -> int:
    """The most of ``trials`` that were running at the same instant."""
    edges: list[tuple[datetime, int]] = []
    for t in trials:
        if t.datetime_start and t.datetime_complete:
            edges += [(t.datetime_start, 1), (t.datetime_complete, -1)]
    running = most = 0
    for _, step in sorted(edges):  # an end sorts before a start at the same instant
        running += step
        most = max(most, running)
    return most
