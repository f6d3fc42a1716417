"""A population: several trials of one shape trained as one stack (issue 40), each still its own trial.

The runner (:func:`sweeper.validation.runner.train_population`) lays the trials' runs side by side in one
stack, trial after trial, and hands the core these two objects in place of one trial's hook and checkpointer:

- :class:`PopulationHook` tells each trial's own hook about its own members only (its metrics, its
  intermediate value, its pruning decision), and stops a trial's members alone when its hook prunes
  it or one of them fails (the others train on);
- :class:`PopulationCheckpointer` saves each trial's members as that trial's own checkpoint, the
  state a stack of them alone saves, so that a retry continues it alone or beside other trials."""

from collections.abc import Callable, Collection, Sequence
from typing import Any

from sweeper.config import SweeperConfig
from sweeper.core.checkpoint import member_states
from sweeper.core.hooks import Checkpointer, EpochHook, NullHook


class PopulationHook(NullHook):
    """The core's hook for a stack of several trials' runs (``hooks[t]``: trial ``t``'s own, whose
    members are ``members[t]``, consecutive). Its ``begin`` is the null one: the runner begins each
    trial's hook with its own runs and offset."""

    def __init__(self, hooks: Sequence[EpochHook], members: Sequence[list[int]],
                 settle: Callable[[int, list[Any]], None] = lambda t, results: None,
                 fail: Callable[[int, str], None] = lambda t, why: None) -> None:
        self.hooks, self.members = list(hooks), [list(m) for m in members]
        self.settle, self.fail = settle, fail
        self.pruned: set[int] = set()  # trials whose hook pruned them
        self.failed: set[int] = set()  # trials one of whose members failed
        self.settled: set[int] = set()  # trials whose results came before the stack ended
        self._stop: list[int] = []

    @property
    def ended(self) -> set[int]:
        """Trials that train no more: pruned or failed (their members are masked)."""
        return self.pruned | self.failed

    def _live(self) -> list[int]:
        return [t for t in range(len(self.hooks)) if t not in self.ended]

    def on_epoch(self, epoch: int, rows: list[dict[str, Any] | None]) -> bool:
        for t in self._live():
            mine = [rows[k] for k in self.members[t]]
            if any(row is not None for row in mine) and self.hooks[t].on_epoch(epoch, mine):
                self.pruned.add(t)
                self._stop += self.members[t]
        return not self._live()

    def members_to_stop(self) -> Collection[int]:
        stop, self._stop = self._stop, []
        return stop

    def members_done(self, results: dict[int, Any]) -> None:
        """A pruned trial's members scored while the others train on: its results, to settle now."""
        for t, ks in enumerate(self.members):
            if t not in self.settled and all(k in results for k in ks):
                self.settled.add(t)
                self.settle(t, [results[k] for k in ks])

    def member_failed(self, k: int, why: str) -> Collection[int] | None:
        t = next(t for t, ks in enumerate(self.members) if k in ks)
        if t not in self.failed:  # told once (its other members' steps may fail in the same sync)
            self.failed.add(t)
            self.fail(t, why)  # now: whatever stops the stack later is not its outcome
        return self.members[t]

    def should_stop(self) -> bool:
        # every hook counts the step (its trial's progress events); the stop token is the worker's
        stops = [hook.should_stop() for hook in self.hooks]
        return any(stops)

    def tick(self) -> None:
        for hook in self.hooks:
            hook.tick()

    def on_probe(self, peak_mb: float) -> None:
        for hook in self.hooks:
            hook.on_probe(peak_mb)


class PopulationCheckpointer(Checkpointer):
    """Each trial's members saved through that trial's own checkpointer, as a stack of them alone
    (none of a trial that trains no more, ``ended()``: pruned, or failed, whose state a save would
    only overwrite with its masked or non-finite weights); a population starts fresh (its trials are
    new: a retry runs alone), so it loads nothing (the protocol's ``load``)."""

    def __init__(self, parts: Sequence[tuple[list[int], Checkpointer, SweeperConfig]],
                 ended: Callable[[], Collection[int]] = lambda: ()) -> None:
        self.parts, self.ended = list(parts), ended

    def save(self, state: dict) -> None:
        ended = self.ended()
        for t, (which, checkpointer, cfg) in enumerate(self.parts):
            if t not in ended:
                checkpointer.save(member_states(state, which, cfg))
