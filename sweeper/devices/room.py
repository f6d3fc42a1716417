"""The room on a GPU for another trial, and the memory that trial is allotted, when trials are packed on
GPUs by their measured memory (``devices.trials_per_gpu: auto``): the arithmetic alone, no I/O. The driver's
:mod:`sweeper.dispatch.packer` feeds it NVML readings and its trials' peaks, and acts on its answers.

One GPU, as packing sees it (all in MB):

- ``budget = (1 - devices.memory_margin) x total``;
- each running trial of ours is *charged* its allotment until it has reported a measured
  peak (the batch probe's, then each epoch's running peak), and its measured peak after;
- ``others = max(0, NVML used - our charges)``: other processes, and whatever our own
  processes hold beyond their peaks (CUDA contexts, the allocator's cache);
- ``free = budget - others - our charges``.

Another trial starts on a GPU only while its expected peak fits in ``free``. The expected peak is the
largest measured peak of trials with the same ``model.*`` params; a trial of a shape never measured, or one
that must have the GPU to itself (``exclusive``: a retry after an OOM while sharing), starts only on a GPU
where none of ours runs. A GPU where none of ours runs takes one trial (given all that is free there) unless
another GPU suits it better (:func:`suits`), so a sweep never waits for memory that cannot free up."""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

# a trial of a measured shape may probe up to this multiple of its expected peak: the batch
# probe keeps train.memory_margin of what it is given free, so the micro-batch its shape was
# measured with still fits (1 / (1 - 0.1) = 1.11), with room for other params' differences
HEADROOM = 1.25
K = TypeVar("K")
ShapeKey = tuple[tuple[str, str], ...]  # (param, repr(value)) of every model.* param, sorted


@dataclass(frozen=True)
class Policy:
    margin: float = 0.1  # devices.memory_margin
    max_trials: int = 8  # devices.max_trials_per_gpu
    max_util: float | None = None  # devices.max_gpu_util (NVML %)


@dataclass(frozen=True)
class Room:
    """One GPU at one moment: NVML's reading and our trials' charges on it."""

    total_mb: float
    used_mb: float  # NVML: every process, ours included
    util: float | None = None  # NVML %, None where it cannot say
    charges: tuple[float, ...] = ()  # our running trials, one charge each
    exclusive: bool = False  # one of them has the GPU to itself


def charge_mb(allotted_mb: float, measured_mb: float | None) -> float:
    """What a running trial counts for: its allotment until it has measured its peak, then the peak."""
    return allotted_mb if measured_mb is None else measured_mb


def others_mb(room: Room) -> float:
    return max(0.0, room.used_mb - sum(room.charges))


def free_mb(room: Room, margin: float) -> float:
    """Memory left for another trial: may be negative when others grew after we packed."""
    return (1.0 - margin) * room.total_mb - others_mb(room) - sum(room.charges)


def admits(room: Room, need_mb: float | None, policy: Policy, *, exclusive: bool = False) -> bool:
    """Whether a trial expected to peak at ``need_mb`` (None: never measured) may start here now."""
    if not room.charges:
        return True  # alone on the GPU: nothing of ours to protect
    if len(room.charges) >= policy.max_trials or room.exclusive or exclusive or need_mb is None:
        return False
    if policy.max_util is not None and room.util is not None and room.util >= policy.max_util:
        return False  # the GPU's cores are saturated: another trial would only slow the others
    return need_mb <= free_mb(room, policy.margin)


def allotment_mb(room: Room, need_mb: float | None, policy: Policy) -> float:
    """The memory a trial is given (its batch probe plans within it): everything free when it
    starts alone or its shape was never measured, else its expected peak with HEADROOM,
    within what is free. Alone, a peak measured elsewhere (another host, other params) that
    is too small must not make it fail for want of memory nobody else wants."""
    free = max(0.0, free_mb(room, policy.margin))
    return free if need_mb is None or not room.charges else min(free, HEADROOM * need_mb)


def choose(rooms: Mapping[K, Room], need_mb: float | None, policy: Policy, *, exclusive: bool = False,
           every: Mapping[K, Room] | None = None) -> K | None:
    """The GPU a trial goes to: of ``rooms`` that admit it (and suit it, where a GPU of ``every`` does:
    :func:`suits`), the one with the fewest of our trials (spread first), then the most free; None: none."""
    fit = [key for key, room in rooms.items() if admits(room, need_mb, policy, exclusive=exclusive)]
    if suited := [key for key, room in (every or rooms).items() if suits(room, need_mb, policy)]:
        fit = [key for key in fit if key in suited]
    return min(fit, key=lambda k: (len(rooms[k].charges), -free_mb(rooms[k], policy.margin)), default=None)


def suits(room: Room, need_mb: float | None, policy: Policy) -> bool:
    """Whether others leave a trial of a measured ``need_mb`` room here and, where none of ours runs, cores
    (``max_gpu_util``): alone on one that does not (a colleague's job holding 30 GB) it would OOM or crawl."""
    if need_mb is not None and need_mb > (1.0 - policy.margin) * room.total_mb - others_mb(room):
        return False
    return bool(room.charges) or policy.max_util is None or room.util is None or room.util < policy.max_util


def shape_key(params: Mapping[str, object]) -> ShapeKey:
    """The params that shape the model, and so its memory: every ``model.*`` param."""
    return tuple(sorted((k, repr(v)) for k, v in params.items() if k.startswith("model.")))
