"""One trial's life inside a worker: attach to the trial in the store, train it
with the shared core, write its artifacts, and finish it.

Everything the trial produces lives in its folder of the run layout (:mod:`sweeper.store.layout`) and is
also registered in Optuna's artifact store so optuna-dashboard lists it."""
from __future__ import annotations

import contextlib
import functools
import math
import os
import socket
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
import torch
import yaml
from optuna.trial import FrozenTrial, TrialState

from sweeper import config as C
from sweeper.atomic import as_disk_full, disk_full
from sweeper.data.load import PanelMemo
from sweeper.devices.fake import trial_device
from sweeper.errors import (
    ConfigError,
    FailReason,
    Interrupted,
    NonFiniteLoss,
    StopRequested,
    StorageOutage,
    SweeperError,
    TrialFailure,
    one_line,
)
from sweeper.interrupt import StopToken
from sweeper.models.check_cache import source_digest
from sweeper.plain import plain
from sweeper.store import artifact_store, open_storage
from sweeper.store.layout import ARTIFACTS, TrialFiles, trial_files
from sweeper.store.outage import watch
from sweeper.study import convergence, retention, stacking
from sweeper.study.ending import end_trial, fail_attrs
from sweeper.study.samplers import build_pruner
from sweeper.validation.grid import RunGrid
from sweeper.worker import adoption, constraints, protocol
from sweeper.worker.heartbeat import Heartbeat
from sweeper.worker.hook import OptunaHook

if TYPE_CHECKING:
    from sweeper.validation.runner import Trainer, TrialRuns


class TrialRunner:
    """Holds what a worker reuses across trials: the study handle, panels, device."""

    def __init__(self, init: dict[str, Any], stop: StopToken) -> None:
        self.cfg = C.validate_config(init["config"], "study config")
        self.run_dir = Path(init["run_dir"])
        self.slot, self.stop = init["slot"], stop
        self.threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or torch.get_num_threads()
        torch.set_num_threads(self.threads)
        self.device_kind = trial_device()  # asked once: a GPU, the CPU, or a fake GPU's slot
        self.device = torch.device(self.device_kind.torch_device)
        watch(init["storage"], stop)  # a wait for the store ends when the driver says stop
        self.storage = open_storage(init["storage"], heartbeat_interval=self.cfg.study.heartbeat_interval,
                                    grace_period=self.cfg.study.grace_period,
                                    outage_s=self.cfg.study.storage_outage_s, checked=True)
        self.study = optuna.load_study(study_name=init["study"], storage=self.storage,
                                       pruner=build_pruner(self.cfg.study.pruner))
        self.artifacts = artifact_store(init["artifacts"])
        self.study_uuid = self.study.user_attrs.get("study_uuid")  # whose checkpoints this worker writes
        # the next trial usually shares this one's data (and over walk-forward folds its fold
        # panels: robust_zscore builds one per fold from the data)
        grid = RunGrid.of(self.cfg)
        self.panels = PanelMemo(keep=1 + (grid.folds if grid.folded else 0))
        self.memory_limit_mb: float | None = None  # the running trial's allotment of a shared GPU

    def run(self, trials: Sequence[tuple[int, int]], *, memory_limit_mb: float | None = None) -> bool:
        """Train ``trials`` ((trial_id, number) pairs: one trial, or a population of one shape trained
        as one stack) each to a finished state; False when the worker must be replaced.

        ``memory_limit_mb``: the trial's allotment of a GPU it shares (``trials_per_gpu: auto``),
        which its batch probe plans within."""
        started = time.monotonic()  # train.max_minutes counts from here, loading the data included
        self.memory_limit_mb = memory_limit_mb
        opened = [self._open(trial_id, number) for trial_id, number in trials]
        # host, driver_id and driver_pid were written by the driver's claim, under its lock
        attrs: dict[str, Any] = {"device": self.slot["label"], "slot": self.slot["id"],
                                 "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                                 "pid": os.getpid(), "hostname": socket.gethostname()}
        if memory_limit_mb is not None:  # packed on a GPU (the driver writes gpu_shared_with)
            attrs["gpu_mem_allotted_mb"] = memory_limit_mb
        if len(opened) > 1:  # the trials that trained as one stack with it, itself included
            attrs["population"] = [o.number for o in opened]
        with contextlib.ExitStack() as beats:
            for o in opened:
                beats.enter_context(Heartbeat(self.storage, o.trial_id, self.cfg.study.heartbeat_interval,
                                              warn=o.warn))
                for key, value in attrs.items():
                    o.trial.set_user_attr(key, value)
                protocol.emit(protocol.START, number=o.number, params=o.frozen.params)
            self._train(opened, started)
            # still beating: recording results must not look like a dead host to the others
            ok = [self._end(o) if o.ended is None else o.ended for o in opened]
        # the allocator's cached blocks go back: an idle worker must not hold memory that trials packed
        # on its GPU need
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        return all(ok)

    def _end(self, o: _Open) -> bool:
        """Record trial ``o``'s outcome (none: another driver took it); whether the worker may go on."""
        o.ended = self._taken(o) if o.outcome is None else self._finish(o)
        return o.ended

    def _open(self, trial_id: int, number: int) -> _Open:
        files = trial_files(self.run_dir, number)
        files.folder.mkdir(parents=True, exist_ok=True)
        return _Open(trial_id, number, optuna.Trial(self.study, trial_id), self.storage.get_trial(trial_id),
                     files, functools.partial(_log, files.log))

    def _train(self, opened: list[_Open], started: float) -> None:
        """Each trial's runs (its folds and seeds; one run without either), the trials of a population
        side by side in one stack; each trial's outcome set on it (none: another driver took it)."""
        from sweeper.validation.runner import train_population

        ready = [(o, trainer) for o in opened
                 if (trainer := self._attempt(o, functools.partial(self._prepare, o, started))) is not None]
        if not ready:
            return
        try:
            outs = train_population(self.panels.load(ready[0][1].cfg.data), [t for _, t in ready])
        except BaseException as exc:  # noqa: BLE001 - a trial may fail any way; the worker must report it
            for o, _ in ready:  # the stack's error (Ctrl-C, out of memory, a crash) is every trial's left
                if o.ended is None and (error := self._stack_error(o, exc)) is not None:
                    o.outcome = _failed(error, o.log)
            return
        for (o, trainer), out in zip(ready, outs):
            if o.ended is None:  # (a trial pruned while the others trained on has ended already)
                self._attempt(o, functools.partial(self._judge, o, trainer, out))

    def _stack_error(self, o: _Open, exc: BaseException) -> BaseException | None:
        """What trial ``o`` fails with when its stack stopped: the stack's error (a full disk said so);
        where another driver finished trials of it (it judged their heartbeat stale), None for those
        (taken: no outcome of ours) and an interruption for the others of the population, the stack
        having stopped under them (a retry continues each)."""
        if not isinstance(exc, optuna.exceptions.UpdateFinishedTrialError):
            return as_disk_full(exc, o.files.folder) or exc
        return None if self.storage.get_trial(o.trial_id).state.is_finished() else Interrupted(
            f"its population's stack stopped: another driver finished a trial of it ({exc})")

    def _ended_early(self, o: _Open, trainer: Trainer, out: TrialRuns) -> None:
        """A trial pruned while the rest of its population trains on: recorded now, so that the
        sampler and the driver know at once (its members are masked in the stack)."""
        self._attempt(o, functools.partial(self._judge, o, trainer, out))
        self._end(o)

    def _attempt(self, o: _Open, step: Callable[[], Any]) -> Any:
        """``step()`` of trial ``o``; where it raises, the trial's outcome says how (None returned)."""
        try:
            return step()
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another driver finished it first: no outcome of ours (see _taken)
        except BaseException as exc:  # noqa: BLE001 - a trial may fail any way; the worker must report it
            o.outcome = _failed(as_disk_full(exc, o.files.folder) or exc, o.log)
        return None

    def _prepare(self, o: _Open, started: float) -> Trainer:
        """The trial's config, hook, data, stack size and checkpoint: what its runs train with."""
        from sweeper.validation.run_files import RunStore
        from sweeper.validation.runner import Trainer, pin_eval_batch, pin_stack_size

        trial, frozen, files = o.trial, o.frozen, o.files
        # a sampled combination the model's config refuses raises ConfigError here or in train()
        cfg = C.with_overrides(self.cfg, frozen.params, f"trial {frozen.number} params")
        files.config.write_text(yaml.safe_dump(C.to_dict(cfg, kept=True), sort_keys=False))
        o.hook = OptunaHook(trial, self.cfg.study.metric, frozen.number, files.metrics, self.stop,
                            self.cfg.study.stall_timeout)
        panel = self.panels.load(cfg.data)
        o.hook.tick()  # the data is loaded: progress, for the stall watchdog
        trainer = Trainer(cfg, o.hook, started, self.device, o.log,
                          self.device_kind.memory(self.memory_limit_mb), None, self.panels)
        # before the config is written (predict evaluates alike) and the stack size (timed with it)
        trainer = pin_eval_batch(panel, trainer)
        # every trial of the study stacks alike: the study keeps the size its first trial measured
        trainer, choice = pin_stack_size(panel, trainer, functools.partial(stacking.resolve, self.study, cfg),
                                         stacking.POPULATION_CAP if cfg.study.population == "auto" else 1)
        cfg = trainer.cfg
        if fingerprint := source_digest(cfg):  # the user model's code this trial trains (refit, predict)
            choice = {**choice, "model_fingerprint": fingerprint}
        for key, value in choice.items():
            trial.set_user_attr(key, value)
        files.config.write_text(yaml.safe_dump(C.to_dict(cfg, kept=True), sort_keys=False))  # with stack size
        # the checkpoint says whose it is: only this trial's retries may continue it
        stamp = adoption.owner(self.study_uuid, frozen.number, panel.fingerprint)
        adoption.adopt(self.study, trial, frozen, cfg, files, stamp, o.log)
        trainer.store = RunStore(files, stamp, RunGrid.of(cfg))
        trainer.finished = functools.partial(self._ended_early, o, trainer)
        return trainer

    def _judge(self, o: _Open, trainer: Trainer, out: TrialRuns) -> None:
        """The trial's files, value and attributes, and how it ends (a population's failed member fails
        its own trial only)."""
        from sweeper.validation import record

        if out.failure is not None:
            raise NonFiniteLoss(out.failure)
        record.write_files(out, o.files)
        value, attrs = record.attrs_of(out, trainer.cfg)
        o.outcome = _judged(o.trial, trainer.cfg, out, value, attrs, pruned=bool(o.hook and o.hook.pruned))

    def _finish(self, o: _Open) -> bool:
        assert o.outcome is not None
        state, value, attrs = o.outcome
        stored = {key: plain(val) for key, val in attrs.items()}
        if not end_trial(self.study, o.trial, state, stored, value,
                         recorded=lambda: self._register_artifacts(o)):
            return self._taken(o)
        # study.keep, as each trial finishes: here in the worker, off the driver's dispatch path; before
        # END, since the driver may stop an idle worker the moment it hears it
        try:
            retention.collect(self.study, self.cfg, self.run_dir, warn=o.warn)
        except Exception as exc:  # noqa: BLE001 - the trial is recorded; a clean-up left over is gc's
            o.warn(f"study.keep clean-up skipped ({one_line(exc)}); `sweeper gc` applies it later")
        protocol.emit(protocol.END, number=o.number, state=state.name, value=value,
                      reason=attrs.get("fail_reason"), metrics=stored)
        return state != TrialState.FAIL

    def _taken(self, o: _Open) -> bool:
        """Another driver finished this trial first (it judged the heartbeat stale):
        the stored outcome stands, and this process is replaced to start clean."""
        stored = self.storage.get_trial(o.trial_id)
        reason = stored.user_attrs.get("fail_reason")
        print(f"trial {o.number} was already finished as {stored.state.name} ({reason}) by another driver; "
              "its result here is dropped", flush=True)
        protocol.emit(protocol.END, number=o.number, state=stored.state.name, value=None, reason=reason,
                      metrics={})
        return False

    def _register_artifacts(self, o: _Open) -> None:
        from optuna.artifacts import upload_artifact

        trial, files = o.trial, o.files
        failed, first = [], None  # one line however many files fail, with the first error
        for name in (*ARTIFACTS, *(p.name for p in files.other_members())):  # a seed ensemble's too
            if (path := files.folder / name).exists():
                try:
                    upload_artifact(artifact_store=self.artifacts, file_path=str(path), study_or_trial=trial)
                except Exception as exc:  # noqa: BLE001 - the files stay in the run folder either way
                    failed.append(name)
                    first = first or one_line(exc)
        if failed:
            o.warn(f"artifact upload failed for {', '.join(failed)} ({first}); "
                   f"the files stay in {files.folder}")


@dataclass
class _Open:
    """One trial of a worker's run, from its claim to its end."""

    trial_id: int
    number: int
    trial: optuna.Trial
    frozen: FrozenTrial
    files: TrialFiles
    log: Callable[[str], None]
    hook: OptunaHook | None = None
    outcome: tuple[TrialState, float | None, dict[str, Any]] | None = None  # None: another driver took it
    ended: bool | None = None  # recorded: whether the worker may go on (None: not yet)

    def warn(self, text: str) -> None:
        """One line about a problem that does not end the trial: in the trial's log and the
        slot log, and to the driver, which shows it."""
        self.log(f"warning: {text}")
        protocol.emit(protocol.WARN, number=self.number, text=f"trial {self.number}: {text}")


def _judged(trial: optuna.Trial, cfg: C.SweeperConfig, out: TrialRuns, value: float,
            attrs: dict[str, Any], *, pruned: bool) -> tuple[TrialState, float | None, dict[str, Any]]:
    """The end-of-trial rules, once for every grid: how a trial that trained ends."""
    from sweeper.validation import record

    if not (cut := pruned or out.cut_short is not None) and not math.isfinite(value):
        nan = fail_attrs(FailReason.NAN, f"{cfg.study.metric} is not finite")
        return TrialState.FAIL, None, {**attrs, **nan}
    # study.constraints: set on the RUNNING trial, before the tell, so samplers read them
    attrs.update(constraints.record_constraints(trial, cfg, record.model_predictions(out)))
    if cut:
        # the driver shows a pruned trial's value beside it when every run has a score (the last
        # one pruned, as a holdout trial's one run is); one cut short before its last runs has no
        # objective (a partial mean never wins). The store keeps Optuna's last intermediate value.
        return TrialState.PRUNED, value if out.cut_short is None else None, attrs
    convergence.report_scores(trial, record.terminator_scores(out, cfg))  # before the tell
    return TrialState.COMPLETE, value, attrs


def _failed(exc: BaseException, log: Callable[[str], None]) -> tuple[TrialState, None, dict[str, Any]]:
    """How a trial that raised ends: FAIL with its fail_reason, except a config the model
    cannot take, which is PRUNED (see below)."""
    if isinstance(exc, Interrupted):  # a stop that was asked for, not an error: no traceback
        log(f"interrupted: {exc}")
    else:
        log("".join(traceback.format_exception(exc)).rstrip())
    message = str(exc) if isinstance(exc, (TrialFailure, SweeperError)) else f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ConfigError):
        # A sampled combination the model refuses (nhead not dividing d_model, a constructor
        # that raises). Not retried, and recorded PRUNED, not FAIL: Optuna's TPE never reads
        # FAIL trials, so a FAIL would let it sample the region again; a PRUNED trial with no
        # intermediate values ranks below every other trial, so TPE moves away from it.
        return TrialState.PRUNED, None, fail_attrs(FailReason.CONFIG, message)
    # the store away past study.storage_outage_s, or a stop while it was: the trial's own fault it is not
    away = FailReason.INTERRUPTED if isinstance(exc, (StorageOutage, StopRequested)) else FailReason.CRASH
    return TrialState.FAIL, None, fail_attrs(exc.reason if isinstance(exc, TrialFailure) else away, message)


def _log(path: Path, line: str) -> None:
    """A trial's log (``functools.partial`` of its file): ``line`` in the file and the slot log."""
    try:
        with path.open("a") as fh:
            fh.write(line.rstrip() + "\n")
        print(line, flush=True)  # stdout is the slot log (stderr) in a worker
    except OSError as exc:
        if not disk_full(exc):  # a full disk must not turn the line that says so into a crash
            raise
