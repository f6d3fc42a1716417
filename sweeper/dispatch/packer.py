"""Parent: packing trials on GPUs by their measured memory (``devices.trials_per_gpu: auto``).

The driver asks :class:`Packer` whether some GPU has room before it claims a trial
(:meth:`Packer.gate`), and where the claimed trial goes, with how much memory (:meth:`Packer.place`);
it tells the packer what its trials report (the probe's peak, each epoch's peak) and when they end.
The arithmetic is :mod:`sweeper.devices.room`; this module holds the state: NVML's last reading,
our running trials' charges, and the peaks measured per model shape.

A claimed trial that fits no GPU yet (too big for the room left, or needing a GPU to itself) is
*held*: the driver claims nothing else, keeps its heartbeat, and starts it once room frees up."""

import contextlib
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeper.config import DevicesConfig
from sweeper.devices import GPU, probe
from sweeper.devices.room import Policy, Room, ShapeKey, allotment_mb, charge_mb, choose, shape_key
from sweeper.devices.slots import slots_per_gpu
from sweeper.dispatch.handle import WorkerHandle
from sweeper.store import optuna_private as private

READ_EVERY_S = 1.0  # NVML is read at most this often: packing decisions need no fresher reading
EXCLUSIVE_ATTR = "exclusive_gpu"  # set on a retry after an OOM while sharing: it runs alone


@dataclass
class Packed:
    """One of our trials on a GPU, as packing counts it."""

    number: int
    trial_id: int
    gpu: str  # UUID
    shape: ShapeKey
    allotted_mb: float
    exclusive: bool = False
    measured_mb: float | None = None  # the largest peak it has reported
    shared_with: int = 0  # the most other trials of ours on its GPU at once


@dataclass
class Held:
    """A claimed trial waiting for room on a GPU."""

    trial_id: int
    number: int
    params: dict[str, Any]
    exclusive: bool
    next_beat: float = 0.0


@dataclass
class Placement:
    gpu: str
    allotted_mb: float
    shared_with: int  # other trials of ours on the GPU when it starts


class Packer:
    def __init__(self, devices: DevicesConfig, gpus: Iterable[GPU], study: optuna.Study) -> None:
        self.policy = Policy(margin=devices.memory_margin, max_trials=slots_per_gpu(devices),
                             max_util=devices.max_gpu_util)
        self.study = study
        self.gpus = {g.uuid: g for g in gpus}  # NVML's last reading of each GPU of ours
        self.read_at = -math.inf
        self.running: dict[int, Packed] = {}  # by trial number
        self.peaks: dict[ShapeKey, float] = {}  # model shape -> the largest peak measured (MB)

    # ---- what the driver tells it

    def learn(self, trials: list[FrozenTrial]) -> None:
        """Peaks of finished trials, from the study as a claim read it (other hosts' too)."""
        for t in trials:
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
                self._note(shape_key(t.params), _peak(t.user_attrs))

    def measured(self, number: int, peak_mb: Any) -> None:
        """A running trial's measured peak: the probe's, then each epoch's."""
        packed, peak = self.running.get(number), _number(peak_mb)
        if packed is not None and peak is not None:
            packed.measured_mb = max(peak, packed.measured_mb or 0.0)
            self._note(packed.shape, packed.measured_mb)

    def ended(self, number: int, state: TrialState | str, metrics: Mapping[str, Any]) -> None:
        """A trial of ours ended, however (its END, its worker's exit, a kill): forget its charge.
        ``state``: its TrialState, or its name (as the worker's end event spells it)."""
        packed = self.running.pop(number, None)
        name = state.name if isinstance(state, TrialState) else state
        if packed is not None and name in ("COMPLETE", "PRUNED"):
            self._note(packed.shape, _peak(metrics))

    # ---- what it answers

    def gate(self, gpus: Iterable[str]) -> str | None:
        """Of ``gpus`` (those with a worker free), one where some trial could start now: a claim is worth
        making. The smallest measured shape stands for the next trial, whose params are not sampled yet."""
        rooms, every = self._rooms(gpus)
        return choose(rooms, min(self.peaks.values(), default=None), self.policy, every=every)

    def hold(self, trial: optuna.Trial) -> Held:
        return Held(trial_id=private.trial_id(trial), number=trial.number, params=dict(trial.params),
                    exclusive=bool(trial.user_attrs.get(EXCLUSIVE_ATTR)))

    def place(self, held: Held, gpus: Iterable[str]) -> Placement | None:
        """Where ``held`` starts now, of ``gpus``, and the memory it is given; None: nowhere yet."""
        (rooms, every), need = self._rooms(gpus), self.peaks.get(shape_key(held.params))  # exclusive or not
        if (gpu := choose(rooms, need, self.policy, exclusive=held.exclusive, every=every)) is None:
            return None
        return Placement(gpu, round(allotment_mb(rooms[gpu], need, self.policy), 1), len(rooms[gpu].charges))

    def start(self, held: Held, placement: Placement) -> None:
        """``held`` started on its GPU: each of the ``shared_with`` trials there now shares it with as many.
        Only the driver writes ``gpu_shared_with`` (a worker's first write could land after a raise)."""
        for other in self.running.values():
            if other.gpu == placement.gpu and other.shared_with < placement.shared_with:
                other.shared_with = placement.shared_with
                self._write(other.trial_id, "gpu_shared_with", other.shared_with)
        self._write(held.trial_id, "gpu_shared_with", placement.shared_with)
        self.running[held.number] = Packed(held.number, held.trial_id, placement.gpu, shape_key(held.params),
                                           placement.allotted_mb, held.exclusive,
                                           shared_with=placement.shared_with)

    def beat(self, held: Held, interval: float) -> None:
        """Keep a held trial's heartbeat, as its worker will once it runs."""
        if (now := time.monotonic()) >= held.next_beat:
            held.next_beat = now + interval
            private.backend(self.study).record_heartbeat(held.trial_id)

    # ---- inside

    def _rooms(self, gpus: Iterable[str]) -> tuple[dict[str, Room], dict[str, Room]]:
        if not (gpus := list(gpus)):  # no worker free anywhere: nothing to decide, no NVML session to open
            return {}, {}
        self._read()
        every = {}
        for uuid, gpu in self.gpus.items():
            mine = [p for p in self.running.values() if p.gpu == uuid]
            every[uuid] = Room(total_mb=gpu.total_mb, used_mb=gpu.used_mb, util=gpu.util,
                               charges=tuple(charge_mb(p.allotted_mb, p.measured_mb) for p in mine),
                               exclusive=any(p.exclusive for p in mine))
        return {uuid: every[uuid] for uuid in gpus}, every  # of those with a worker free; of all (suits)

    def _read(self) -> None:
        """NVML's reading of our GPUs, at most every READ_EVERY_S; a GPU it fails to read keeps its last."""
        if time.monotonic() - self.read_at < READ_EVERY_S:
            return
        self.read_at = time.monotonic()
        self.gpus.update({gpu.uuid: gpu for gpu in probe().gpus if gpu.uuid in self.gpus})

    def _note(self, shape: ShapeKey, peak: float | None) -> None:
        if peak is not None and peak > self.peaks.get(shape, 0.0):
            self.peaks[shape] = peak

    def _write(self, trial_id: int, key: str, value: Any) -> None:
        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):  # finished: shared with fewer
            private.backend(self.study).set_trial_user_attr(trial_id, key, value)


def first_per_gpu(workers: list[WorkerHandle]) -> list[WorkerHandle]:
    """One worker per GPU: the ones a packing driver starts at once."""
    first: dict[str, WorkerHandle] = {}
    for w in workers:
        first.setdefault(_gpu_of(w), w)
    return list(first.values())


def workers_by_gpu(workers: list[WorkerHandle]) -> tuple[dict[str, WorkerHandle], dict[str, WorkerHandle]]:
    """By GPU (UUID): an idle worker, and a worker not started yet, on GPUs with none free and
    none starting, to start when room for a trial waits for a worker."""
    idle: dict[str, WorkerHandle] = {}
    spare: dict[str, WorkerHandle] = {}
    busy = set()
    for w in workers:
        uuid = _gpu_of(w)
        if not w.started:
            spare.setdefault(uuid, w)
        elif w.idle:
            idle.setdefault(uuid, w)
        elif not w.ready:
            busy.add(uuid)  # starting, or exiting to be replaced
    return idle, {u: w for u, w in spare.items() if u not in busy and u not in idle}


def _gpu_of(w: WorkerHandle) -> str:
    assert w.slot.gpu is not None, "packing plans GPU slots only"
    return w.slot.gpu.uuid


def _peak(values: Mapping[str, Any]) -> float | None:
    """A finished trial's peak: the larger of its epochs' peak and its probe's."""
    peaks = [p for p in (_number(values.get("peak_mem_mb")), _number(values.get("probe_peak_mem_mb"))) if p]
    return max(peaks, default=None)


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None
