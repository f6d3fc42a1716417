"""What ``train`` calls out to: the per-epoch hook and the checkpointer, as protocols,
plus the null objects that stand in when nobody listens or keeps state.

Every method of a protocol is called unconditionally (no ``getattr`` for optional ones): a
hook that needs only some of them subclasses :class:`NullHook` and keeps its no-ops.
"""
from __future__ import annotations

from typing import Protocol


class EpochHook(Protocol):
    # once before each training run of a trial (a walk-forward fold's, a seed repeat's): its
    # fold and repeat indices, and ``offset``, the epochs the trial's earlier runs reported, so
    # that a hook that reports steps keeps them increasing across runs
    def begin_run(self, fold: int, repeat: int, offset: int) -> None: ...
    def on_epoch(self, epoch: int, metrics: dict) -> bool: ...   # True: stop now (pruned)
    # a stack of runs trained as one (sweeper.core.stack_loop): once before its first epoch, each
    # member's (fold, repeat) and the stack's ``offset``; then once per epoch, each member's
    # metrics (None: that member has stopped). The hook reports one value per epoch for the stack
    def begin_stack(self, runs: list[tuple[int, int]], offset: int) -> None: ...
    def on_stack_epoch(self, epoch: int, metrics: list[dict | None]) -> bool: ...  # True: stop (pruned)
    def should_stop(self) -> bool: ...                            # polled at every step boundary
    # called per batch of validation and final scoring: the run is alive although it makes no
    # step (a sweep's stall watchdog counts it as progress)
    def tick(self) -> None: ...
    # once, before epoch 1, when the trial's device peak is known before it trains (a batch probe
    # ran on CUDA, or the trial's memory model knows it, as a fake GPU's does): in MB, a sweep
    # packs trials on a GPU by it
    def on_probe(self, peak_mb: float) -> None: ...


class Checkpointer(Protocol):
    def load(self) -> dict | None: ...
    def save(self, state: dict) -> None: ...


class NullHook:
    def begin_run(self, fold: int, repeat: int, offset: int) -> None:
        return None

    def begin_stack(self, runs: list[tuple[int, int]], offset: int) -> None:
        return None

    def on_stack_epoch(self, epoch: int, metrics: list[dict | None]) -> bool:
        return False

    def on_epoch(self, epoch: int, metrics: dict) -> bool:
        return False

    def should_stop(self) -> bool:
        return False

    def tick(self) -> None:
        return None

    def on_probe(self, peak_mb: float) -> None:
        return None


class NullCheckpointer:
    def load(self) -> dict | None:
        return None

    def save(self, state: dict) -> None:
        return None
