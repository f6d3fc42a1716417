"""The dispatch loop of the driver (parent process): hand claimed trials to worker slots, read their events,
enforce time limits and the stall watchdog, and survive anything a trial does.

As in Optuna's ``_optimize``: :func:`sweeper.dispatch.run.run` (set-up and cleanup in ``finally``) ->
:meth:`Driver.loop` (slots, events, signals) -> the dispatch strategy (:mod:`sweeper.dispatch.strategies`:
which worker takes the next trial). Each decision has one home: how a trial ends in the store,
:mod:`sweeper.study.ending`; what an ended trial changes here, :meth:`Driver._ended`; whether the sweep
stops, :mod:`sweeper.dispatch.stopping`. The view is fed by the events the loop handles; it never reads the
study itself."""

import contextlib
import selectors
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeper import config as C
from sweeper.devices import Slot, fake
from sweeper.dispatch.baseline_job import BaselineJob
from sweeper.dispatch.claim import ClaimSchedule, claim
from sweeper.dispatch.forkserver import ForkServer
from sweeper.dispatch.handle import Running, WorkerHandle
from sweeper.dispatch.stopping import StopRule, TrialEnd
from sweeper.dispatch.strategies import dispatch_for
from sweeper.dispatch.view import View, Warnings
from sweeper.errors import FailReason, StopRequested, StorageOutage, one_line, say
from sweeper.interrupt import StopToken
from sweeper.store.identity import Identity
from sweeper.store.locks import ClaimLock
from sweeper.store.studies import FINISHED, best_in
from sweeper.store.urls import is_sqlite
from sweeper.study import stacking
from sweeper.study.ending import fail_trial
from sweeper.worker import protocol

MAX_EARLY_EXITS = 3
CLOSE_WAIT_S = 10.0  # how long shutdown waits for workers to finish their step and exit
# train.max_minutes is the core's own deadline: it ends the epoch and scores the trial. The
# driver kills a trial only this long after it (a share of the limit, and at least a floor):
# the last step, validation, final scoring and writing results must fit in the grace.
TIMEOUT_GRACE_FRACTION = 0.2
TIMEOUT_GRACE_MIN_S = 120.0  # tests that drill the hard kill shorten it through sweeper.devices.fake


def timeout_grace_s(max_minutes: float) -> float:
    """Seconds past ``train.max_minutes`` before the driver kills a trial (fail_reason timeout)."""
    return max(TIMEOUT_GRACE_FRACTION * max_minutes * 60, fake.timeout_grace_floor_s(TIMEOUT_GRACE_MIN_S))


class Driver:
    def __init__(self, cfg: C.SweeperConfig, study: optuna.Study, slots: list[Slot], *, storage_url: str,
                 run_dir: Path, artifacts: str, view: View, ident: Identity, lock: ClaimLock,
                 stop: StopToken | None = None, server: ForkServer | None = None) -> None:
        self.cfg, self.study, self.view, self.ident, self.lock = cfg, study, view, ident, lock
        self.run_dir, self.storage_url = run_dir, storage_url
        init = {"config": C.to_dict(cfg), "storage": storage_url, "study": cfg.study.name,
                "run_dir": str(run_dir), "artifacts": artifacts,
                "driver": {"host": ident.host, "pid": ident.pid, "driver_id": ident.driver_id}}
        self.workers = [WorkerHandle(s, init, run_dir, server) for s in slots]
        self.sel, self.stop = selectors.DefaultSelector(), stop or StopToken()
        self.rule = StopRule(cfg.study, self.stop, run_dir)
        self.dispatch = dispatch_for(cfg, slots, study)
        self.schedule = ClaimSchedule(cfg.study.heartbeat_interval, self._foreign_running)
        self.warnings = Warnings(view)
        # the baseline job reads its storage from its config: the one this sweep resolved
        located = cfg.model_copy(update={"study": cfg.study.model_copy(update={"storage": storage_url})})
        self.baseline = BaselineJob(located, study, lock, ident, run_dir, server)
        self.population = stacking.Population(cfg, study)  # trials asked at once

    # layer 2: the loop
    def loop(self) -> None:
        for w in self.dispatch.first_workers(self.workers):
            self.spawn(w)  # packing starts the others as room for more trials shows up
        while True:
            if self.rule.killing:
                self._kill_all()
                return
            self.rule.clock()  # study.timeout, judged once a turn
            if self.rule.draining:
                self.dispatch.release_held(self, "stopped (Ctrl-C or SIGTERM) before it could start")
                self.baseline.stop()
                for w in self.workers:
                    w.drain()
            elif self.rule.stopping():
                self.dispatch.release_held(self, "the sweep stopped before it could start")
            else:
                self._start_trials()
            if all(w.running is None for w in self.workers) and self.rule.stopping() \
                    and not self.baseline.running:  # a baseline under way is waited for
                return
            self._pump(timeout=0.2)
            self.baseline.poll()
            self._check_timeouts()
            self.view.tick()

    def _start_trials(self) -> None:
        # a Ctrl-C while waiting for the lock or the store ends the wait: the loop drains next
        with contextlib.suppress(StopRequested):
            self.dispatch.start_trials(self)

    # layer 3: what a dispatch strategy asks for (sweeper.dispatch.strategies.Launcher)
    def claim(self, population: bool = False) -> list[optuna.Trial]:
        """Claim a trial under the lock (``population``: as many of one shape as the study's population
        size, :class:`sweeper.study.stacking.Population`); empty when there is none to start now."""
        size = self.population() if population else 1
        trials = claim(self.study, self.cfg, self.lock, self.ident, self.run_dir, seen=self._seen, size=size)
        if trials:
            self.schedule.clear()
            return trials
        if self.rule.stopping():
            return []  # the trials it read say the study is done (the stop rule holds why)
        if foreign := self._foreign_running():
            self.schedule.wait_on(foreign)  # other drivers' trials hold the budget: look again, not leave
            return []
        self.schedule.clear()
        self.rule.budget_used(None if any(w.running for w in self.workers) else self._budget_line())
        return []

    def _budget_line(self) -> str:
        n = self.cfg.study.n_trials
        line = f"budget reached: study.n_trials={n} {'trial is' if n == 1 else 'trials are'} finished"
        if is_sqlite(self.storage_url):  # a file on this host: this driver's (and its neighbours') trials
            return line
        return f"{line} (counted across every host); nothing left for {self.ident.host} to run"

    def start(self, w: WorkerHandle, trials: list[tuple[int, int, dict[str, Any]]], **run: Any) -> None:
        """Hand ``w`` its trials ((trial_id, number, params): one, or a population trained as one stack)."""
        w.assign([(trial_id, number) for trial_id, number, _ in trials], **run)
        for _, number, params in trials:
            self.view.trial_started(w.slot, number, params)
        self.view.population(w.slot, [number for _, number, _ in trials])

    def spawn(self, w: WorkerHandle) -> None:
        w.start()
        self.sel.register(w.stdout, selectors.EVENT_READ, w)

    def fail_unstarted(self, trial_id: int, why: str) -> None:
        """FAIL a claimed trial that never reached a worker as interrupted (a retry runs it)."""
        self._fail(trial_id, FailReason.INTERRUPTED, why)

    def _seen(self, trials: list[FrozenTrial]) -> bool:
        """The study as the last claim read it: the view's progress and the stop rule's
        study-wide counts, with no query of their own. False (the claim then asks Optuna for
        nothing) once those counts say the study is done."""
        maximize = self.study.direction == optuna.study.StudyDirection.MAXIMIZE
        self.view.progress(sum(t.state in FINISHED for t in trials), best_in(trials, maximize))
        self.dispatch.seen(trials)
        self.rule.seen(trials)
        return not self.rule.stopping()

    def _foreign_running(self) -> set[int]:
        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        return {t.number for t in running if t.user_attrs.get("driver_id") != self.ident.driver_id}

    # events
    def _pump(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout=timeout):
            w: WorkerHandle = key.data
            if (events := w.read_events()) is None:
                self._worker_exited(w)
                continue
            for ev in events:
                self._on_event(w, ev)

    def _on_event(self, w: WorkerHandle, ev: dict[str, Any]) -> None:
        w.heard(ev)  # the handle keeps its trial's progress: the watchdog reads it
        kind, run = ev.get("ev"), w.running
        if kind == protocol.WARN:
            self.warnings(w.slot, str(ev.get("text", "")))
        elif run is None:
            return
        elif kind == protocol.EPOCH:
            self.view.epoch(w.slot, ev["number"], ev["epoch"], ev["metrics"])
            self.dispatch.measured(ev["number"], ev["metrics"].get("peak_mem_mb"))
        elif kind == protocol.MEMORY:
            self.dispatch.measured(ev["number"], ev.get("peak_mb"))
        elif kind == protocol.END and ev.get("number") in run.trials:
            # (an END read after the driver killed the trial is stale: the trial is failed already)
            self._ended(w, TrialEnd(ev["number"], TrialState[ev["state"]], ev.get("value"), ev.get("reason"),
                                    ev.get("metrics") or {}, reported=True))

    def _ended(self, w: WorkerHandle, end: TrialEnd) -> None:
        """The one account of a trial of ours that ended: dispatch, stop rule, view, worker."""
        self.dispatch.ended(end)
        self.rule.trial_ended(end)
        error = str(end.metrics.get("error") or "").strip() if end.reason != FailReason.INTERRUPTED else ""
        why = f"{end.reason}: {error.splitlines()[0]}" if error else end.reason  # a failure's cause, told
        self.view.trial_ended(w.slot, end.number, end.state, end.value, why)
        w.trial_ended(end.number, end.failed)
        self.baseline.trial_ended(w)

    def _worker_exited(self, w: WorkerHandle) -> None:
        self.sel.unregister(w.stdout)
        run, code = w.running, w.exited()
        if run is not None:
            reason = FailReason.INTERRUPTED if self.rule.interrupted else FailReason.CRASH
            self._failed(w, run, reason, f"worker exited with code {code}", code)
        if self.rule.interrupted:
            return
        if w.early_exits >= MAX_EARLY_EXITS:
            # a worker that dies before it is ready (the store away past study.storage_outage_s,
            # a broken install) would otherwise be respawned forever
            self.rule.worker_broken(
                f"stopped: the worker for {w.slot.label} exited {w.early_exits} times before it was ready "
                f"(last exit code {code}: {w.last_line()[:400] or 'its log is empty'}); see {w.log_path}")
        if not self.rule.stopping():
            self.spawn(w)

    def _failed(self, w: WorkerHandle, run: Running, reason: FailReason, error: str,
                code: int | None) -> None:
        """The trials of ours on ``w`` failed on the driver's side (its worker died, or was killed): every
        trial of a population (they trained as one process's stack)."""
        for number, trial_id in list(run.trials.items()):
            self._fail(trial_id, reason, error, code)
            self._ended(w, TrialEnd(number, TrialState.FAIL, reason=reason, metrics={"error": error}))

    def _fail(self, trial_id: int, reason: FailReason, error: str, code: int | None = None) -> None:
        """FAIL a trial this driver ran, recording why; a no-op when it has finished
        meanwhile (another host judged it stale, or its worker told the store first)."""
        # Ctrl-C during a store outage: the trial is failed as stale by the next run
        with contextlib.suppress(StopRequested):
            fail_trial(self.study, trial_id, reason, error, exit_code=code)

    # time limits and stopping
    def _check_timeouts(self) -> None:
        """The hard time limit (train.max_minutes plus its grace) and the stall watchdog:
        a trial past either is killed with its worker's process group and failed."""
        limit, stall = self.cfg.train.max_minutes, self.cfg.study.stall_timeout
        for w in self.workers:
            run, now = w.running, time.monotonic()
            if run is None:
                continue
            if limit is not None and now - run.started > limit * 60 + timeout_grace_s(limit):
                self._kill_trial(w, run, FailReason.TIMEOUT,
                                 f"trial exceeded train.max_minutes={limit:g} by more than its "
                                 f"{timeout_grace_s(limit):g} s grace for scoring and writing results")
            elif stall is not None and now - run.last_event > stall:
                # the heartbeat thread beats through a hung step: only the events show progress
                self._kill_trial(w, run, FailReason.STALL,
                                 f"no training step and no event from its worker for "
                                 f"{now - run.last_event:.0f} s (study.stall_timeout={stall:g})")

    def _kill_trial(self, w: WorkerHandle, run: Running, reason: FailReason, error: str) -> None:
        w.kill()  # the EOF that follows respawns the slot
        self._failed(w, run, reason, error, w.returncode)

    def _kill_all(self) -> None:
        """The second Ctrl-C: every worker's process group killed at once, then their trials failed."""
        for w in self.workers:
            _guarded(w.kill, w)
        for w in self.workers:
            if w.running is not None:
                self._failed(w, w.running, FailReason.INTERRUPTED, "killed by a second Ctrl-C", w.returncode)

    def shutdown(self) -> None:
        """Stop every worker at once, then wait for them together (not 10 s each in turn);
        a worker or a store call that fails here does not keep the others from stopping."""
        self.baseline.stop()
        for w in self.workers:
            # idle (or still importing torch): holds no trial, no need to wait
            _guarded(w.kill if w.running is None else w.request_close, w)
        deadline = time.monotonic() + CLOSE_WAIT_S
        for w in self.workers:
            _guarded(partial(w.close, deadline), w)
            for trial_id in (w.running.trials.values() if w.running is not None else ()):
                _guarded(partial(self._fail, trial_id, FailReason.INTERRUPTED, "driver shut down"), w)
        self.sel.close()


def _guarded(action: Callable[[], object], w: WorkerHandle) -> None:
    try:
        action()
    except StorageOutage:
        pass  # reported once, at the CLI boundary
    # (a StopRequested goes through: a store that is away makes _fail give up, a signal cuts it short)
    except Exception as exc:  # noqa: BLE001 - shutdown goes on for the other workers
        say(f"stopping the worker on {w.slot.label} failed: {one_line(exc)}")
