"""Parent: which worker gets the next trial. Two strategies behind one small interface:

- :class:`SlotDispatch`: one trial per free worker slot (``devices.trials_per_gpu: N``, CPU slots);
- :class:`PackedDispatch`: trials packed on GPUs by their measured memory
  (``devices.trials_per_gpu: auto``), through a :class:`~sweeper.dispatch.packer.Packer`.

The driver's loop calls the same methods on either (:func:`dispatch_for` picks one, once), so it
has no packing branches. A strategy claims and starts trials through the driver's
:class:`Launcher` and hears what the driver hears: trials read by a claim, memory measured, trials
ended. Both take only :attr:`~sweeper.dispatch.handle.WorkerHandle.idle` workers; each says
whether the study's baseline job takes a worker's turn (:func:`honours_turn`)."""

from collections.abc import Sequence
from typing import Any, Protocol

import optuna
from optuna.trial import FrozenTrial

from sweeper.config import SweeperConfig
from sweeper.devices import Slot
from sweeper.dispatch.claim import ClaimSchedule
from sweeper.dispatch.handle import WorkerHandle
from sweeper.dispatch.packer import Held, Packer, first_per_gpu, workers_by_gpu
from sweeper.dispatch.stopping import TrialEnd
from sweeper.store import optuna_private as private


class Launcher(Protocol):
    """What a strategy may ask of the driver."""

    workers: list[WorkerHandle]
    schedule: ClaimSchedule  # when a claim is due

    def claim(self, population: bool = False) -> list[optuna.Trial]: ...
    def start(self, w: WorkerHandle, trials: list[tuple[int, int, dict[str, Any]]], **run: Any) -> None: ...
    def spawn(self, w: WorkerHandle) -> None: ...
    def fail_unstarted(self, trial_id: int, why: str) -> None: ...


class Dispatch(Protocol):
    honours_turn: bool  # whether the baseline job takes a worker's turn (sweeper.dispatch.baseline_job)

    def first_workers(self, workers: list[WorkerHandle]) -> list[WorkerHandle]: ...
    def start_trials(self, d: Launcher) -> None: ...
    # null behaviour (SlotDispatch's): nothing held, nothing measured
    def release_held(self, d: Launcher, why: str) -> None: return
    def seen(self, trials: list[FrozenTrial]) -> None: return
    def measured(self, number: int, peak_mb: object) -> None: return
    def ended(self, end: TrialEnd) -> None: return


class SlotDispatch(Dispatch):
    """Every worker starts at once; each free one takes the next claimed trial."""

    # A slot's CPU threads are its trial's: the baseline job runs with them in the slot's turn, so
    # that slot's worker takes no trial meanwhile (and the baseline never delays a first trial).
    honours_turn = True

    def first_workers(self, workers: list[WorkerHandle]) -> list[WorkerHandle]:
        return workers

    def start_trials(self, d: Launcher) -> None:
        if not d.schedule.due():
            return
        for w in (w for w in d.workers if w.idle):
            if not (trials := d.claim(population=True)):
                return
            d.start(w, [(private.trial_id(t), t.number, t.params) for t in trials])


class PackedDispatch:
    """A trial is claimed only while some GPU has room for one; it starts where it fits, with
    its allotment. A claimed trial that fits nowhere yet is held (its heartbeat kept) until
    room frees up; a GPU's next worker is started only when room waits for one."""

    # Packing takes no turns: trials are placed by GPU memory, and the baseline job runs on the
    # CPU (CUDA_VISIBLE_DEVICES="") beside the GPU's trials, freeing no room that a held trial
    # waits for. Taking a GPU worker's turn would only start another worker on that GPU.
    honours_turn = False

    def __init__(self, packer: Packer, heartbeat_interval: float) -> None:
        self.packer, self.heartbeat_interval = packer, heartbeat_interval
        self.held: Held | None = None

    def first_workers(self, workers: list[WorkerHandle]) -> list[WorkerHandle]:
        return first_per_gpu(workers)

    def start_trials(self, d: Launcher) -> None:
        """Start one trial after another where it fits, until nothing more can start now."""
        while self.held is not None or d.schedule.due():
            idle, spare = workers_by_gpu(d.workers)
            if self.held is None:
                if self.packer.gate(idle) is None:
                    # no room where a worker is free: start a worker where there is room
                    if (gpu := self.packer.gate(spare)) is not None:
                        d.spawn(spare[gpu])
                    return
                if not (trials := d.claim()):  # one at a time: each is placed by its own measured memory
                    return
                self.held = self.packer.hold(trials[0])
            if (placement := self.packer.place(self.held, idle)) is None:
                self.packer.beat(self.held, self.heartbeat_interval)
                if (spot := self.packer.place(self.held, spare)) is not None:
                    d.spawn(spare[spot.gpu])
                return
            held, self.held = self.held, None
            self.packer.start(held, placement)
            d.start(idle[placement.gpu], [(held.trial_id, held.number, held.params)],
                    memory_limit_mb=placement.allotted_mb)

    def release_held(self, d: Launcher, why: str) -> None:
        """The loop is leaving: a held trial is failed as interrupted (a retry runs it)."""
        held, self.held = self.held, None
        if held is not None:
            d.fail_unstarted(held.trial_id, why)

    def seen(self, trials: list[FrozenTrial]) -> None:
        self.packer.learn(trials)

    def measured(self, number: int, peak_mb: object) -> None:
        self.packer.measured(number, peak_mb)

    def ended(self, end: TrialEnd) -> None:
        self.packer.ended(end.number, end.state, end.metrics)


def packs(cfg: SweeperConfig, slots: Sequence[Slot]) -> bool:
    """Whether a sweep on ``slots`` packs trials by measured memory: ``trials_per_gpu: auto`` on
    GPU slots (the one test of which strategy a sweep runs)."""
    return cfg.devices.trials_per_gpu == "auto" and any(s.gpu is not None for s in slots)


def honours_turn(cfg: SweeperConfig, slot: Slot) -> bool:
    """Whether the baseline job takes ``slot``'s turn: as the strategy the sweep runs says (a
    sweep's slots are all GPU slots or all CPU slots, so one slot tells)."""
    return (PackedDispatch if packs(cfg, [slot]) else SlotDispatch).honours_turn


def dispatch_for(cfg: SweeperConfig, slots: Sequence[Slot], study: optuna.Study) -> Dispatch:
    """Packing for ``trials_per_gpu: auto`` on GPU slots; a trial per slot otherwise."""
    if packs(cfg, slots):
        gpus = {s.gpu.uuid: s.gpu for s in slots if s.gpu is not None}
        return PackedDispatch(Packer(cfg.devices, gpus.values(), study), cfg.study.heartbeat_interval)
    return SlotDispatch()
