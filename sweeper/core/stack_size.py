"""How many runs share a stack: measured on the device, not set.

On a GPU a small model's step is launch-bound, so K members cost little more than one and stacking
pays as far as memory allows; on a CPU the work grows with K and the gain depends on the model (an
MLP gains, an LSTM loses to torch's fused kernel run member by member). So :func:`measure` times real
training steps (the trial's config and data, each member with its own seed) and evaluation forwards,
in the trial's proportion, at each candidate size, in interleaved rounds so that load from other
processes hits every size alike, and :func:`choose` takes the largest size that beats every smaller
one by :data:`MARGIN` in member-samples per second. A size whose batch probe finds no room is out.
On a CPU with native bf16, :func:`measure_precision` first times fp32 against bf16 alike."""

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sweeper.config import SweeperConfig, TrainConfig
from sweeper.core import host_cache
from sweeper.core.batch_search import is_oom
from sweeper.core.device import TrialMemory
from sweeper.core.evaluate import stacked_predict_rows
from sweeper.core.hooks import NullCheckpointer, NullHook
from sweeper.core.lanes import Member
from sweeper.core.loop import Run, prepare
from sweeper.core.schedule import Rows, epoch_rows
from sweeper.errors import OutOfMemory

# a larger stack must train this much faster per member-sample than the best smaller one: the rates of two
# runs of the same size differ by a few percent on a quiet box, and a wrong choice near the tie costs little
MARGIN = 0.10
WARMUP_STEPS, TIMED_STEPS, ROUNDS = 2, 5, 2
TIMED_S, EVAL_ROWS = 0.5, 4096  # each size's steps timed at least this long, its evaluation on these rows
# trials of one shape share a stack (a population) only on a clear gain over the trial's own stack: it pays
# what equal seeds do not show (a member stopped early computes until the stack ends, which waits for its
# slowest trial); populations chosen on +11-31 % ran 0.75-1.16x populations off (issue 40, three CPUs)
POPULATION_MARGIN = 0.35
# the host keeps each measurement (sweeper.core.host_cache) in the panel cache's root, .stack-sizes/
CACHE_DIR, CACHE_VERSION = ".stack-sizes", 5  # 2: precision; 3: eval timed; 4: last position; 5: capped


@dataclass(frozen=True)
class StackChoice:
    """The stack size chosen, and the member-samples per second by size it was chosen on (NaN: did
    not fit). ``source``: ``measured``, ``train.max_stack`` (a number) or ``study`` (stored)."""

    size: int
    rates: dict[int, float] = field(default_factory=dict)
    source: str = "measured"

    def attrs(self) -> dict[str, Any]:
        """The trial's ``stack_size``, ``stack_size_from`` and (measured) ``stack_rates`` by size."""
        return {"stack_size": self.size, "stack_size_from": self.source,
                **({"stack_rates": {str(k): round(v, 1) if math.isfinite(v) else None
                                    for k, v in self.rates.items()}} if self.rates else {})}


def candidate_sizes(runs: int) -> list[int]:
    """The sizes worth timing for a trial of ``runs`` runs: 1, the powers of two below, and ``runs``."""
    top = max(runs, 1)
    return sorted({*(2 ** i for i in range(top.bit_length())), top})


def choose(rates: dict[int, float], margin: float = MARGIN, base: int = 1) -> int:
    """The largest size whose rate beats the best smaller size's by ``margin`` (``base`` if none does)."""
    best = base
    for size in sorted(rates):
        if size > best and math.isfinite(rates[size]) and rates[size] >= rates.get(best, 0.0) * (1 + margin):
            best = size
    return best


def choices(rates: dict[int, float], runs: int = 0, trials: int = 0) -> tuple[int, int]:
    """The trial's own stack size (of sizes up to ``runs``; 0: any) and, with ``runs``, its population's: the
    largest past them, of ``trials`` own stacks at most (0: any), beating all smaller by POPULATION_MARGIN."""
    own = choose({k: r for k, r in rates.items() if k <= (runs or k)})
    pooled = {k: r for k, r in rates.items() if k == own or runs < k <= (own * trials or k)}
    return own, choose(pooled, POPULATION_MARGIN, own) if runs else own


def measure(members: Sequence[Member], device: torch.device, memory: TrialMemory,
            sizes: Sequence[int], say: Callable[[str], None] | None = None, runs: int = 0) -> StackChoice:
    """Time stacks of the first ``k`` of ``members`` for each ``k`` in ``sizes`` (their real steps and
    evaluation: :func:`_rate`) and choose among those up to ``runs`` (if given); nothing is kept. Past
    ``runs`` (a population) they stand for ``len(members) // runs`` trials, and a stack of more of their own
    stacks is neither timed nor chosen (own stacks of one run: 8 trials are 8 members). Kept cheap, as it
    costs training time: sizes go up until one is clearly slower than the best so far (rates rise with the
    size until the device is busy), or, past ``runs``, until one gains less than MARGIN on every smaller
    size (a flat rate will not reach POPULATION_MARGIN one size later); a size well short of the rate it
    needs stops after TIMED_STEPS steps (its rate then its training's alone), and only a size whose noise
    could flip the choice is timed again (:func:`_near`; the best of its rounds kept: load only slows it)."""
    rates: dict[int, float] = {}
    cap = len(members) // max(runs, 1)  # the trials they stand for (runs 0: no population, no cap)
    for round_ in range(ROUNDS):
        for k in sizes:
            if (round_ and not _near(rates, k, runs, cap)) or runs < k > choices(rates, runs)[0] * cap:
                continue
            smaller = [r for size, r in rates.items() if size < k and not math.isnan(r)]
            needed = max(smaller, default=0.0) * (1 + MARGIN)  # to be chosen over every smaller size
            rate = _rate(members[:k], device, memory, needed)
            rates[k] = max((r for r in (rates.get(k, math.nan), rate) if not math.isnan(r)), default=math.nan)
            goes_on = rates[k] >= (needed if runs and k > runs else max(rates.values()) * (1 - MARGIN))
            if not round_ and not goes_on:
                break  # slower than a smaller stack, no room, or a population's size without a gain
    choice = StackChoice(choices(rates, runs, cap)[0], rates)
    if say is not None:
        shown = ", ".join(f"{k}: {r:.0f}" for k, r in sorted(rates.items()))
        say(f"stack size {choice.size}: member-samples/s by stack size {shown} (measured)")
    return choice


def measure_precision(member: Member, device: torch.device, memory: TrialMemory,
                      say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """``train.precision: auto`` where it is measured (:func:`~sweeper.core.precision.measured_on`): the
    member's real steps and its (fp32) evaluation timed with fp32 and bf16 steps, interleaved; bf16 only
    when the whole is MARGIN faster (it moves the numbers a little): ``precision``, ``precision_rates``."""
    rates: dict[str, float] = {}
    for _ in range(ROUNDS):
        for name in ("fp32", "bf16"):
            needed = rates["fp32"] * (1 + MARGIN) if name == "bf16" else 0.0
            timed = Member(member.cfg.with_train(precision=name), member.panel)
            rates[name] = max(rates.get(name, 0.0), _rate([timed], device, memory, needed))
    rates = {k: round(v, 1) for k, v in rates.items()}  # as stored: the choice and the line say the same
    chosen = "bf16" if rates["bf16"] >= rates["fp32"] * (1 + MARGIN) else "fp32"
    if say is not None:
        say(f"precision {chosen}: samples/s fp32 {rates['fp32']:.0f}, bf16 {rates['bf16']:.0f} (measured)")
    return {"precision": chosen, "precision_rates": rates}


def _near(rates: dict[int, float], k: int, runs: int = 0, trials: int = 0) -> bool:
    """Whether a round's noise could flip what the rates decide (:func:`choices`): size ``k``'s rate
    MARGIN higher or lower decides otherwise (a timing of TIMED_S varies by a few percent)."""
    return not math.isnan(rate := rates.get(k, math.nan)) and len(
        {choices({**rates, k: rate * f}, runs, trials) for f in (1 + MARGIN, 1 / (1 + MARGIN))}) > 1


def _rate(members: Sequence[Member], device: torch.device, memory: TrialMemory, needed: float = 0.0) -> float:
    """Member-samples per second of a stack of ``members``, its evaluation included: its training steps
    (:func:`_train_seconds`) and the rows each member validates per sample it trains, at the stack's own
    evaluation speed (:func:`_eval_seconds`: on a CPU a stack's forward can lose where its step gains);
    NaN when its batch probe finds no room (or its evaluation batch none)."""
    try:
        run = prepare(members, device, NullCheckpointer(), memory, None, lambda line: None, NullHook())
        tc, lane = members[0].cfg.train, run.lanes[0]
        train_s, whole = _train_seconds(run, tc, needed)
        trained = min(tc.samples_per_epoch or lane.batcher.n_samples, lane.batcher.n_samples)  # an epoch's
        share = lane.valid.n_samples / max(trained, 1)
        return 1.0 / (train_s + (share * _eval_seconds(run) if whole and share else 0.0))
    except Exception as exc:
        if isinstance(exc, OutOfMemory) or is_oom(exc):
            return math.nan
        raise


def _train_seconds(run: Run, tc: TrainConfig, needed: float) -> tuple[float, bool]:
    """Seconds per member-sample of the stack's steps after a warm-up, over TIMED_STEPS steps and at
    least TIMED_S (a few fast steps are all noise), and whether it timed them all: after TIMED_STEPS it
    stops if the rate so far is well short of ``needed`` (it will not be chosen, nor its evaluation timed)."""
    batches = _epochs(run, tc)
    micro, seen, began, index = run.micro, 0, 0.0, 0
    while index < WARMUP_STEPS + TIMED_STEPS or time.perf_counter() - began < TIMED_S:
        if index == WARMUP_STEPS:
            _wait(run.step.flat.values)
            began, seen = time.perf_counter(), 0
        batch = [next(rows, None) for rows in batches]
        if any(rows is None for rows in batch):  # an epoch shorter than the timing: start it again
            batches = _epochs(run, tc)
            batch = [next(rows) for rows in batches]
        micro = run.step.until_it_fits(batch, micro, run.shrink, lambda line: None)
        seen += sum(len(rows.idx) for rows in batch if rows is not None)
        index += 1
        if needed and index >= WARMUP_STEPS + TIMED_STEPS:  # a read per step only where it may stop early
            _wait(run.step.flat.values)
            if seen / (time.perf_counter() - began) < needed * 0.7:
                return (time.perf_counter() - began) / seen, False
    _wait(run.step.flat.values)
    return max(time.perf_counter() - began, 1e-9) / seen, True


def _eval_seconds(run: Run) -> float:
    """Seconds per member-row of the stack's evaluation (the trial's own, :func:`stacked_predict_rows`)
    on the first rows of its members' valid splits (EVAL_ROWS or one batch), after one batch's warm-up."""
    valid, batch = [lane.valid for lane in run.lanes], run.plan.eval_batch_size
    if not (rows := min(max(EVAL_ROWS, batch), *(b.n_samples for b in valid))):
        return 0.0
    for limit in (min(batch, rows), rows):
        began = time.perf_counter()
        _wait(stacked_predict_rows(run.step.forward, valid, batch, limit=limit)[0])
    return (time.perf_counter() - began) / (rows * len(valid))


def _epochs(run: Run, tc: TrainConfig) -> list[Iterator[Rows]]:
    return [epoch_rows(lane.batcher, tc.resolved_batch_order, run.plan.batch_size, lane.generator, None,
                       lane.runs) for lane in run.lanes]


def cache_key(cfg: SweeperConfig, device: torch.device, n_features: int, runs: int) -> str:
    """The key of a measurement on this host (:mod:`sweeper.core.host_cache`): what sets a stack's
    speed (the model, the batch, the loss, the precision, the data, the runs, the evaluation's share)."""
    tc = cfg.train
    what = {"version": CACHE_VERSION, "model": cfg.model.model_dump(mode="json"), "runs": runs,
            "features": n_features, "order": tc.resolved_batch_order,
            # the data (its source, window, split) and validation set the rows validated per sample
            "validation": cfg.validation.model_dump(mode="json"),
            "data": cfg.data.model_dump(mode="json", exclude={"cache", "cache_dir", "cache_max_gb"}),
            **{k: getattr(tc, k) for k in ("batch_size", "max_batch_size", "min_micro_batch", "loss",
                                           "precision", "compile", "eval_batch_size", "memory_margin",
                                           "samples_per_epoch")}}
    return host_cache.key(what, device)


def read_kept(folder: Path, key: str) -> dict[str, Any] | None:
    """A measurement this host kept under ``key`` (its attributes, from ``cache``), or None."""
    try:
        if (kept := host_cache.read(folder, key)) is None:
            return None
        source = "cache" if kept.get("stack_size_from") == "measured" else kept.get("stack_size_from")
        return {**kept, "stack_size": int(kept["stack_size"]), "stack_size_from": source}
    except (KeyError, TypeError, ValueError):
        return None


def _wait(values: torch.Tensor) -> None:
    """Let the device finish what it was given (a read of one value)."""
    float(values.flatten()[0])
