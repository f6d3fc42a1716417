"""Training one trial: the one loop over its run grid (docs/walk-forward.md).

A trial trains the runs of its :class:`~sweeper.validation.grid.RunGrid` in order (seed ``r`` with
``train.seed + r``), in stacks of the study's stack size (:func:`pin_stack_size`), each through
:func:`sweeper.core.train_stack`, every member on its fold's panel (built once per fold).

A finished run is recorded in ``runs/fold-<f>.seed-<r>/``, ``result.json`` last: a retry skips
the runs that have one and continues the run in progress from the trial's checkpoint, whose owner
stamp names its fold and repeat (:func:`~sweeper.validation.grid.named_run`).

The trial stops early, leaving the later runs unrun, when a stack is pruned (the hook reports the
mean over its members at the grid's global step, so the pruner compares trials at the same stack
and epoch) or when ``train.max_minutes``, counted from the trial's start, runs out."""

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from sweeper.config import SweeperConfig
from sweeper.core import Member, host_cache, resolve_device, train_stack
from sweeper.core import eval_batch as E
from sweeper.core import stack_size as S
from sweeper.core.device import TrialMemory, trial_memory
from sweeper.core.hooks import Checkpointer, EpochHook, NullCheckpointer
from sweeper.core.loop import TrainResult
from sweeper.core.precision import measured_on
from sweeper.data import Batcher
from sweeper.data.cache import cache_root
from sweeper.data.folds import Fold, fold_layout, fold_panel, fold_spans
from sweeper.data.load import PanelMemo
from sweeper.data.panel import Panel
from sweeper.data.scoring import own_scoring_panel
from sweeper.errors import StopReason
from sweeper.models import build_model
from sweeper.store.layout import SPLITS
from sweeper.validation.grid import RunGrid, seeded
from sweeper.validation.population import PopulationCheckpointer, PopulationHook
from sweeper.validation.run_files import RunStore
from sweeper.validation.scores import TrainingRun, ensemble_frame

CUT_SHORT = (StopReason.PRUNED, StopReason.TIME)  # a run that ended so ends the trial's runs


@dataclass
class TrialRuns:
    """The runs a trial made (or a retry found finished), in order, and why they stopped."""

    grid: RunGrid
    folds: list[Fold]
    spans: list[dict[str, list[str]]]  # each fold's train and valid dates (none for one fold)
    runs: list[TrainingRun] = field(default_factory=list)
    predictions: dict[tuple[int, int], pd.DataFrame] = field(default_factory=dict)
    daily: dict[tuple[int, int], pd.DataFrame] = field(default_factory=dict)
    model: TrainResult | None = None  # the model run's result, when it trained in this process
    cut_short: StopReason | None = None  # pruned | time: the later runs were not run
    failure: str | None = None  # a run's loss went non-finite in a population: the trial fails (alone)
    # with seed repeats: each model seed's frames {split: date, asset, pred, label}, and the seed
    # ensemble's (the mean of its seeds' predictions), which is the trial's model
    members: dict[int, dict[str, pd.DataFrame]] = field(default_factory=dict)
    ensemble: dict[str, pd.DataFrame] | None = None

    @property
    def folds_run(self) -> int:
        """Folds with a scored run (the last may be cut short): ``len(fold_val_ic)``."""
        return len({r.fold for r in self.runs})

    @property
    def stop_reason(self) -> str:
        return self.cut_short or (self.runs[-1].stop_reason if self.runs else StopReason.EPOCHS)

    def add(self, run: TrainingRun, predictions: pd.DataFrame, daily: pd.DataFrame) -> None:
        self.runs.append(run)
        self.predictions[(run.fold, run.repeat)], self.daily[(run.fold, run.repeat)] = predictions, daily


def model_frames(cfg: SweeperConfig, result: TrainResult, panel: Panel, device: torch.device | str | None,
                 alone: bool = False) -> dict[str, pd.DataFrame]:
    """The model's predictions on valid and test exactly as ``sweeper predict`` computes them from its
    weights (:class:`sweeper.inspect.trial_model.Predictor`): the best weights in a fresh model, every
    present row (an unknown label NaN, :func:`~sweeper.data.scoring.own_scoring_panel`), in batches of
    ``train.eval_batch_size``. The training's own frames (``result.predictions``) hold valid's labelled
    rows and test's present ones, in batches of the probed eval batch; where a run trained ``alone`` (a
    stack of one, whose final scoring calls a fresh model's kernels) scored the same rows in the same
    batches, its frame is those very bits, and the split is not scored again (as a rule neither is:
    valid's labels are known)."""
    from sweeper.core import predict  # read at the call: a test counts the calls

    where = resolve_device(device)
    scoring = own_scoring_panel(panel.to(where, cfg.data.device_share))
    same_batches = alone and result.metrics.get("eval_batch_size") == cfg.train.resolved_eval_batch_size
    frames, model = {}, None
    for split in SPLITS:
        # the frame's rows are in sample order and a subset of the present ones: as many means the same
        if same_batches and len(result.predictions[split]) == len(scoring.sample_index(split)):
            frames[split] = result.predictions[split]
            continue
        if model is None:
            model = build_model(cfg.model, len(panel.features), cfg.data.lookback)
            model.load_state_dict(result.best_state)
        frames[split] = predict(model.to(where), scoring, split, where, cfg.train.resolved_eval_batch_size)
    return frames


@dataclass
class Trainer:
    """What every run of the trial shares: how it trains and reports."""

    cfg: SweeperConfig
    hook: EpochHook
    started: float
    device: torch.device | str | None = None
    log: Callable[[str], None] | None = None
    memory: TrialMemory | None = None
    store: RunStore | None = None  # None: nothing kept on disk (``sweeper train``)
    # a worker's panels: robust_zscore's fold panels (built from the data) kept for its next
    # trial, which usually shares its data; None: built once per fold for this trial only
    panels: PanelMemo | None = None
    # told of the trial's runs when they end before its population's stack does (pruned): the worker
    # records the trial then (by default nothing: its runs are returned with the others')
    finished: Callable[[TrialRuns], None] = lambda out: None


Choice = dict[str, Any]  # the stack size chosen: StackChoice.attrs()


def pin_stack_size(panel: Panel, trainer: Trainer,
                   decide: Callable[[Callable[[], Choice]], Choice] = lambda measure: measure(),
                   trials: int = 1) -> tuple[Trainer, Choice]:
    """``trainer`` with ``train.max_stack`` pinned to the trial's stack size, and the choice: a number
    as it is; ``auto``: ``decide(measure)`` (a sweep's study keeps the first trial's measurement,
    :func:`sweeper.study.stacking.resolve`; by default the measurement itself). ``trials``: up to how
    many trials of this shape may share a stack (``study.population: auto``): the measurement then
    also says how many do (the choice's ``population_size``). The same measurement pins ``train.precision:
    auto`` where it is measured (a CPU with native bf16): the choice's ``precision``; without one, auto
    is what it was (fp32 on a CPU), as for a study whose trials trained before it was measured."""
    if (cfg := trainer.cfg).train.max_stack != "auto":
        return trainer, {"stack_size": cfg.train.max_stack, "stack_size_from": "train.max_stack"}
    choice = decide(lambda: _measure_stack(panel, trainer, trials))
    pinned = cfg.with_train(max_stack=int(choice["stack_size"]),
                            precision=choice.get("precision", cfg.train.precision))
    return dataclasses.replace(trainer, cfg=pinned), choice


def pin_eval_batch(panel: Panel, trainer: Trainer) -> Trainer:
    """``trainer`` with ``train.eval_batch_size: auto`` pinned, on a CPU, to the size measured there for
    the trial's model (:mod:`sweeper.core.eval_batch`; this host keeps it per shape), so that its files
    and ``sweeper predict`` evaluate as its training did; as it is on a GPU (the probe sizes it)."""
    cfg, device = trainer.cfg, resolve_device(trainer.device)
    if cfg.train.eval_batch_size != "auto" or (trainer.memory or trial_memory(device)).reader() is not None:
        return trainer
    folder, key = cache_root(cfg.data) / E.CACHE_DIR, E.cache_key(cfg, len(panel.features))
    if (size := E.read_kept(folder, key)) is None:
        evaluated = max(Batcher(panel, split, device).n_samples for split in ("valid", "test"))
        with torch.random.fork_rng(devices=[]):  # the measured model's init must not move the trial's RNG
            model = build_model(cfg.model, len(panel.features), cfg.data.lookback).to(device)
        size = E.measure(model, Batcher(panel, "train", device), evaluated, trainer.log)
        host_cache.keep(folder, key, {"eval_batch_size": size})
    return dataclasses.replace(trainer, cfg=cfg.with_train(eval_batch_size=size))


def _measure_stack(panel: Panel, trainer: Trainer, trials: int = 1) -> Choice:
    """The stack size measured with the trial's seeds on its first fold's panel
    (:func:`sweeper.core.stack_size.measure`; up to ``trials`` trials' runs, seeds standing for the
    other trials), or the one this host measured before for the same shape (kept in the panel
    cache's root). A size above the trial's runs is a population: that many trials' stacks in one."""
    cfg, runs, device = trainer.cfg, trainer.cfg.validation.runs, resolve_device(trainer.device)
    precision = measured_on(cfg.train.precision, device)
    if runs * trials == 1 and not precision:  # nothing to stack, nor to measure
        return S.StackChoice(1, source="one run per trial").attrs()
    folder = cache_root(cfg.data) / S.CACHE_DIR
    key = S.cache_key(cfg, device, len(panel.features), runs * trials)
    if (kept := S.read_kept(folder, key)) is not None:
        return kept
    first = _fold_panel(trainer, panel, fold_layout(panel, cfg)[0])
    memory = trainer.memory or trial_memory(device)
    chosen = S.measure_precision(Member(cfg, first), device, memory, trainer.log) if precision else {}
    if chosen:  # the stack sizes are timed in the precision chosen
        cfg = cfg.with_train(precision=chosen["precision"])
    members = [Member(seeded(cfg, seed), first) for seed in range(runs * trials)]
    measured = (S.measure(members, device, memory, S.candidate_sizes(runs * trials), trainer.log, runs)
                if runs * trials > 1 else S.StackChoice(1, source="one run per trial"))
    own, size = measured.size, S.choices(measured.rates, runs, trials)[1]  # others only on a clear gain
    choice = {**measured.attrs(), **chosen, **({"population_size": size // own} if size > runs else {})}
    host_cache.keep(folder, key, choice)
    return choice


def train_runs(panel: Panel, trainer: Trainer) -> TrialRuns:
    """Train (or, for a retry, find finished) every run of the trial's grid, fold by fold: in
    stacks of the trial's stack size (:meth:`RunGrid.stacks`; ``auto``: measured first)."""
    return train_population(panel, [trainer])[0]


def train_population(panel: Panel, trainers: Sequence[Trainer]) -> list[TrialRuns]:
    """Every run of several trials of one shape (a population, :mod:`sweeper.validation.population`;
    one trial: its own runs), each trial's ``i``-th stack beside the others' as one stack, so that
    every trial steps, reports and is pruned as it would alone. A trial cut short (pruned, out of
    time) or failed (``TrialRuns.failure``) leaves the population; the others go on."""
    trainers = [pin_stack_size(panel, pin_eval_batch(panel, t))[0] for t in trainers]
    outs = []
    for trainer in trainers:
        grid, folds = RunGrid.of(trainer.cfg), fold_layout(panel, trainer.cfg)
        outs.append(TrialRuns(grid, folds, fold_spans(panel, folds) if grid.folded else []))
    live = list(range(len(trainers)))
    panels: dict[int, Panel] = {}
    for index, _ in enumerate(outs[0].grid.stacks()):  # one shape: every trial's grid is the same
        parts = []
        for t in list(live):
            todo = _unfinished(trainers[t], outs[t], outs[t].grid.stacks()[index])
            minutes = trainers[t].cfg.train.max_minutes
            if todo and outs[t].runs and minutes and time.monotonic() > trainers[t].started + minutes * 60:
                # no run starts past the budget (its one step would score nothing); the first
                # always starts, so a trial is never without a score
                outs[t].cut_short = StopReason.TIME
                live.remove(t)
            elif todo:
                parts.append((t, todo))
        for fold in dict.fromkeys(f for _, todo in parts for f, _ in todo):
            if fold not in panels:
                panels[fold] = _fold_panel(trainers[0], panel, outs[0].folds[fold])
                trainers[0].hook.tick()  # building a fold's panel is progress, for the stall watchdog
        if parts:
            for t in _train_stack([(trainers[t], outs[t], todo) for t, todo in parts], panels):
                live.remove(parts[t][0])
    for t in live:
        _ensemble(trainers[t], outs[t])
    return outs


def _unfinished(trainer: Trainer, out: TrialRuns, cells: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The runs of ``cells`` still to train; a retry's finished ones are added to ``out`` as they are."""
    store, todo = trainer.store, []
    for fold, seed in cells:
        if store is None or (done := store.finished(fold, seed)) is None:
            todo.append((fold, seed))
            continue
        out.add(done, *store.frames(fold, seed))
        if out.grid.ensemble and out.grid.is_model(fold, seed):
            out.members[seed] = store.member_frames(fold, seed)
    return todo


def _ensemble(trainer: Trainer, out: TrialRuns) -> None:
    """With every seed of the model's fold run, the seed ensemble: the trial's model."""
    grid, store = out.grid, trainer.store
    if grid.ensemble and len(out.members) == grid.repeats:
        out.ensemble = {split: ensemble_frame([out.members[r][split] for r in range(grid.repeats)])
                        for split in SPLITS}
        if store is not None:  # what sweeper best reads: the trial's model is the ensemble
            store.save_predictions(out.ensemble)


def _fold_panel(trainer: Trainer, panel: Panel, fold: Fold) -> Panel:
    """The fold's panel, once per fold: every seed of the fold trains on the same one. A
    cross-sectional norm's is a cheap view of ``panel``; robust_zscore's is built from the data,
    so a worker keeps it for its next trial."""
    data = trainer.cfg.data
    if trainer.panels is None or data.feature_norm != "robust_zscore":
        return fold_panel(panel, fold, data)
    key = {"fold_of": data.model_dump(mode="json"), "train": fold.train, "valid": fold.valid}
    return trainer.panels.get(key, lambda: fold_panel(panel, fold, data))


Part = tuple[Trainer, TrialRuns, list[tuple[int, int]]]  # a trial's runs in one stack


def _train_stack(parts: list[Part], panels: dict[int, Panel]) -> list[int]:
    """The runs of ``parts`` (each trial's runs in the same stack of its grid) trained as one stack
    (:func:`sweeper.core.train_stack`; one run is a stack of one); each is then kept as its own run,
    a trial pruned while the others train on as soon as it is (:func:`_settle`). Returns the parts
    whose trial ends here: cut short (pruned, out of time) or failed."""
    members = []
    for trainer, out, cells in parts:
        for fold, seed in cells:
            cfg, dates = seeded(trainer.cfg, seed), out.spans[fold] if out.spans else {}
            spans = ", ".join(f"{name} {a}..{b}" for name, (a, b) in dates.items())  # train, valid
            if trainer.log is not None:
                trainer.log(f"{out.grid.label(fold)}, seed {seed + 1}/{cfg.validation.repeats} "
                            f"(train.seed {cfg.train.seed})" + (f": {spans}" if spans else ""))
            members.append(Member(cfg, _scored(out.grid, panels[fold], fold, seed), trainer.log))
        trainer.hook.begin([out.grid.columns(f, r) for f, r in cells], out.grid.step(*cells[0], 0))
    settled: dict[int, bool] = {}  # part -> whether its trial ends here

    def settle(t: int, results: list[TrainResult]) -> None:
        settled[t] = _settle(parts[t], panels, results, alone=len(members) == 1, early=True)

    def fail(t: int, why: str) -> None:  # a member non-finite: its trial ends now, as pruned ones do
        parts[t][1].failure, settled[t] = why, True
        parts[t][0].finished(parts[t][1])

    hook, checkpoint = _stack_hook(parts, settle, fail)
    lead = parts[0][0]
    results = iter(train_stack(members, device=lead.device, hook=hook, checkpoint=checkpoint, log=lead.log,
                               started=lead.started, memory=lead.memory))
    for t, (_, _, cells) in enumerate(parts):
        mine = [next(results) for _ in cells]
        if t not in settled:
            settled[t] = _settle(parts[t], panels, mine, alone=len(members) == 1)
    return [t for t, ends in sorted(settled.items()) if ends]


def _settle(part: Part, panels: dict[int, Panel], results: list[TrainResult], alone: bool,
            early: bool = False) -> bool:
    """A trial's runs of one stack kept (or its failure noted); whether the trial ends with them. One
    ``early`` (pruned while the others train on) is finished at once (``Trainer.finished``)."""
    trainer, out, cells = part
    if (failed := next((r.failure for r in results if r.failure), None)) is not None:
        out.failure = failed
        return True
    runs = [_keep(trainer, out, panels[fold], fold, seed, seeded(trainer.cfg, seed), result, alone)
            for (fold, seed), result in zip(cells, results)]
    cut = next((r.stop_reason for r in runs if r.stop_reason in CUT_SHORT), None)
    if cut is not None and cells[-1] != (out.grid.folds - 1, out.grid.repeats - 1):  # later runs are not run
        out.cut_short = StopReason(cut)
    if early:
        if out.cut_short is None:
            _ensemble(trainer, out)
        trainer.finished(out)
    return out.cut_short is not None or early


def _stack_hook(parts: list[Part], settle: Callable[[int, list[TrainResult]], None],
                fail: Callable[[int, str], None]) -> tuple[EpochHook, Checkpointer]:
    """One trial's own hook and checkpoint (stamped with its runs: a stack of one as the run it is);
    a population's, which speak to each trial's (:mod:`sweeper.validation.population`) and settle a
    pruned trial's runs as soon as they are scored."""
    checkpoints: list[Checkpointer] = []
    for trainer, out, cells in parts:
        fold, seed = cells[0]
        dates = out.spans[fold] if out.spans else {}
        checkpoints.append(trainer.store.checkpointer(fold, seed, dates, cells if len(cells) > 1 else None)
                           if trainer.store is not None else NullCheckpointer())
    if len(parts) == 1:
        return parts[0][0].hook, checkpoints[0]
    sizes = [len(cells) for _, _, cells in parts]  # each trial's members in the stack, trial after trial
    members = [list(range(sum(sizes[:t]), sum(sizes[:t + 1]))) for t in range(len(parts))]
    hook = PopulationHook([trainer.hook for trainer, _, _ in parts], members, settle, fail)
    return hook, PopulationCheckpointer([(ks, c, seeded(trainer.cfg, cells[0][1]))
                                         for ks, c, (trainer, _, cells) in zip(members, checkpoints, parts)],
                                        lambda: hook.ended)


def _scored(grid: RunGrid, panel: Panel, fold: int, seed: int) -> Panel:
    # only the trial's model is scored on test: every other run's panel has an empty test split,
    # so no other run reads a test date at all (its closing line says test_ic nan)
    if grid.is_model(fold, seed):
        return panel
    start = panel.splits["test"][0]
    return dataclasses.replace(panel, splits={**panel.splits, "test": (start, start)}, _cache={})


def _keep(trainer: Trainer, out: TrialRuns, panel: Panel, fold: int, seed: int, cfg: SweeperConfig,
          result: TrainResult, alone: bool) -> TrainingRun:
    """A finished run's record: its scores (test scores for the model run only) and its files."""
    grid, store = out.grid, trainer.store
    is_model = grid.is_model(fold, seed)
    metrics = {k: v for k, v in result.metrics.items() if is_model or not k.startswith("test_")}
    run = TrainingRun(fold, seed, cfg.train.seed, metrics, result.stop_reason)
    frames = None
    if is_model and grid.ensemble:  # a seed of the ensemble: its frames, for the mean of them
        out.members[seed] = frames = (model_frames(cfg, result, panel, trainer.device, alone)
                                      if store is not None else result.predictions)
    elif is_model and store is not None:  # what sweeper best reads; before result.json (finished)
        store.save_predictions(model_frames(cfg, result, panel, trainer.device, alone))
    if store is not None:
        store.save(run, result, panel, frames)
    # an ensemble seed's valid frame is the stored one a retry reads back: its value is the file's IC
    out.add(run, (frames or result.predictions)["valid"], result.daily["valid"])
    if is_model and seed == 0:
        out.model = result
    return run
