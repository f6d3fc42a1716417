"""What ``train`` calls out to: the per-epoch hook and the checkpointer, as protocols,
plus the null objects that stand in when nobody listens or keeps state.

Every method of a protocol is called unconditionally (no ``getattr`` for optional ones): a
hook that needs only some of them subclasses :class:`NullHook` and keeps its no-ops."""

from collections.abc import Collection
from typing import Any, Protocol


class EpochHook(Protocol):
    # once before a stack's first epoch: for each member, the columns that name its run in a trial
    # of several ({"fold": 2, "repeat": 1}, 1-based; {} for a trial's only run), and ``offset``, the
    # steps the trial's earlier stacks reported (so that reported steps keep increasing)
    def begin(self, runs: list[dict[str, int]], offset: int) -> None: return
    # once per epoch: each member's metrics (None: that member has stopped). True: stop (pruned).
    # A hook that reports to a pruner reports one value per epoch for the stack
    def on_epoch(self, epoch: int, rows: list[dict | None]) -> bool: return False
    def should_stop(self) -> bool: return False  # polled at every step boundary
    # called per batch of validation and final scoring: the run is alive although it makes no
    # step (a sweep's stall watchdog counts it as progress)
    def tick(self) -> None: return
    # once, before epoch 1, when the stack's device peak (MB) is known before it trains (a probe ran
    # on CUDA, or a fake GPU's memory model knows it): a sweep packs trials on a GPU by it
    def on_probe(self, peak_mb: float) -> None: return
    # after each on_epoch that did not stop the stack: the members to stop now (pruned: a population
    # stack's members of one trial, sweeper.validation.population); the others train on
    def members_to_stop(self) -> Collection[int]: return ()
    # member ``k``'s loss or gradients stayed non-finite past train.nonfinite_patience (``why``): the
    # members that stop with it (its trial's), the others training on; None: the stack ends (NonFiniteLoss)
    def member_failed(self, k: int, why: str) -> Collection[int] | None: return None
    # the members of members_to_stop scored before the stack ends (their TrainResults), so that
    # their trial ends now
    def members_done(self, results: dict[int, Any]) -> None: return


class Checkpointer(Protocol):
    def load(self) -> dict | None: return None
    def save(self, state: dict) -> None: return


class NullHook(EpochHook):
    """Listens to nothing: every call is the protocol's empty body."""


class NullCheckpointer(Checkpointer):
    """Keeps nothing: every call is the protocol's empty body."""
