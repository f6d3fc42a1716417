"""The dispatch loop of the driver (parent process): hand claimed trials to
worker slots, read their events, enforce time limits and the stall watchdog,
and survive anything a trial does.

As in Optuna's ``_optimize``: :func:`sweeper.sweep.run.run` (set-up and cleanup
in ``finally``) -> :meth:`Driver.loop` (slots, events, signals) ->
:meth:`Driver.dispatch` (one trial). The view is fed by the events the loop
handles; it never reads the study itself.

With ``devices.trials_per_gpu: auto`` a :class:`~sweeper.sweep.packer.Packer` decides
instead when a GPU takes another trial, and with how much memory
(:meth:`Driver._dispatch_packed`).
"""
from __future__ import annotations

import os
import selectors
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeper import config as C
from sweeper import interrupt
from sweeper.errors import StopRequested, StorageOutage
from sweeper.store import optuna_private as private
from sweeper.store.layout import logs_dir
from sweeper.store.studies import FINISHED, best_in
from sweeper.sweep import protocol
from sweeper.sweep.claim import claim
from sweeper.sweep.handle import Running, WorkerHandle
from sweeper.sweep.identity import Identity
from sweeper.sweep.notices import Warnings
from sweeper.sweep.packer import Held, Packer, first_per_gpu, workers_by_gpu

MAX_EARLY_EXITS = 3
CLOSE_WAIT_S = 10.0  # how long shutdown waits for workers to finish their step and exit
WAIT_POLL_S = 0.5
# train.max_minutes is the core's own deadline: it ends the epoch and scores the trial. The
# driver kills a trial only this long after it (a share of the limit, and at least a floor):
# the last step, validation, final scoring and writing results must fit in the grace.
TIMEOUT_GRACE_FRACTION = 0.2
TIMEOUT_GRACE_MIN_S = 120.0
GRACE_ENV = "SWEEPER_TIMEOUT_GRACE_S"  # overrides the floor (tests that drill the hard kill)


def timeout_grace_s(max_minutes: float) -> float:
    """Seconds past ``train.max_minutes`` before the driver kills a trial (fail_reason timeout)."""
    floor = float(os.environ.get(GRACE_ENV) or TIMEOUT_GRACE_MIN_S)
    return max(TIMEOUT_GRACE_FRACTION * max_minutes * 60, floor)


class Stop:
    """Signal state: the first SIGINT/SIGTERM drains, the second kills."""

    def __init__(self) -> None:
        self.count = 0
        self.signum: int | None = None

    def __call__(self, signum: int, _frame: Any) -> None:
        self.count += 1
        self.signum = self.signum or signum
        interrupt.request_stop()  # waits below the loop (lock, store retries) give up too

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or signal.SIGINT)


@dataclass
class Outcome:
    counts: dict[str, int]
    best: FrozenTrial | None
    interrupted: bool
    exit_code: int
    message: str = ""


class Driver:
    def __init__(self, cfg: C.SweeperConfig, study: optuna.Study, slots: list[Any], *, storage_url: str,
                 run_dir: Path, artifacts: str, view: Any, ident: Identity, lock: Any) -> None:
        self.cfg, self.study, self.view, self.ident, self.lock = cfg, study, view, ident, lock
        self.run_dir = run_dir
        init = {"config": C.to_dict(cfg), "storage": storage_url, "study": cfg.study.name,
                "run_dir": str(run_dir), "artifacts": artifacts,
                "driver": {"host": ident.host, "pid": ident.pid, "driver_id": ident.driver_id}}
        self.workers = [WorkerHandle(s, init, run_dir) for s in slots]
        self.sel = selectors.DefaultSelector()
        self.stop = Stop()
        self.started = time.monotonic()
        self.failures_in_row = 0
        self.exhausted = False
        self.next_claim = 0.0
        self.waiting_on: set[int] = set()  # other drivers' running trials that hold the budget
        self.next_poll = 0.0
        self.message = ""
        self.broken = False
        self.warnings = Warnings(view)
        gpus = {s.gpu.uuid: s.gpu for s in slots if s.kind == "gpu"}
        self.packer = Packer(cfg.devices, gpus.values(), study) if cfg.devices.trials_per_gpu == "auto" and gpus \
            else None
        self.held: Held | None = None  # packing: a claimed trial waiting for room on a GPU

    # layer 2: the loop
    def loop(self) -> None:
        for w in self.workers if self.packer is None else first_per_gpu(self.workers):
            self._spawn(w)  # packing starts the others as room for more trials shows up
        while True:
            if self.stop.count >= 2:
                self._kill_all()
                return
            if self.stop.count == 1:
                self._drain()
            elif self._stopping():
                self._drop_held("the sweep stopped before it could start")
            else:
                self._start_trials()
            if all(w.running is None for w in self.workers) and (self.stop.count or self._stopping()):
                return
            self._pump(timeout=0.2)
            self._check_timeouts()
            self.view.tick()

    def _stopping(self) -> bool:
        if self.broken:
            return True
        timeout = self.cfg.study.timeout
        if timeout is not None and time.monotonic() - self.started > timeout:
            self.message = self.message or f"study.timeout ({timeout:g} s) reached"
            return True
        if self.failures_in_row >= self.cfg.study.max_consecutive_failures:
            self.message = (f"stopped: the last {self.failures_in_row} trials all failed "
                            f"(study.max_consecutive_failures); see {logs_dir(self.run_dir)}")
            return True
        return self.exhausted

    def _start_trials(self) -> None:
        """Claim and start what the free slots (or, packing, the GPUs' room) can take."""
        try:
            if self.packer is not None:
                self._dispatch_packed()
            elif self._claim_due():
                for w in self.workers:
                    if w.ready and w.running is None and not self.dispatch(w):
                        break
        except StopRequested:
            return  # Ctrl-C came while waiting for the lock or the store: the loop drains next

    # layer 3: one trial
    def dispatch(self, w: WorkerHandle) -> bool:
        """Claim a trial and hand it to ``w``; False when there is none to start now."""
        trial = self._claim()
        if trial is None:
            return False
        self._start(w, private.trial_id(trial), trial.number, trial.params)
        return True

    def _claim(self) -> optuna.Trial | None:
        trial = claim(self.study, self.cfg, self.lock, self.ident, self.run_dir, seen=self._seen)
        if trial is None:
            foreign = self._foreign_running()
            if foreign:
                # the budget is held by other drivers' trials: they may finish, or die and
                # need re-running, so look again instead of leaving
                self.waiting_on = foreign
                self.next_claim = time.monotonic() + self.cfg.study.heartbeat_interval
                return None
            self.waiting_on = set()
            self.exhausted = True
            if not any(x.running for x in self.workers):
                self.message = self.message or (
                    f"budget reached: study.n_trials={self.cfg.study.n_trials} trials are finished "
                    f"(counted across every host); nothing left for {self.ident.host} to run")
            return None
        self.waiting_on = set()
        return trial

    def _start(self, w: WorkerHandle, trial_id: int, number: int, params: dict[str, Any], **run: Any) -> None:
        w.running = Running(number=number, trial_id=trial_id, started=time.monotonic())
        w.send({"op": protocol.RUN, "trial_id": trial_id, "number": number, **run})
        self.view.trial_started(w.slot, number, params)

    def _dispatch_packed(self) -> None:
        """trials_per_gpu: auto. Claim a trial only while some GPU has room for one, start it
        where it fits with its allotment, and start another worker where room waits for one."""
        self.packer.keep({w.running.number for w in self.workers if w.running is not None})
        while self.held is not None or self._claim_due():
            idle, spare = workers_by_gpu(self.workers)
            if self.held is None and self.packer.gate(idle) is None:
                return self._spawn_on(spare, self.packer.gate(spare))
            if self.held is None:
                trial = self._claim()
                if trial is None:
                    return
                self.held = self.packer.hold(trial)
            placement = self.packer.place(self.held, idle)
            if placement is None:
                self.packer.beat(self.held, self.cfg.study.heartbeat_interval)
                spot = self.packer.place(self.held, spare)
                return self._spawn_on(spare, spot and spot.gpu)
            held, self.held = self.held, None
            self.packer.start(held, placement)
            self._start(idle[placement.gpu], held.trial_id, held.number, held.params,
                        memory_limit_mb=placement.allotted_mb)

    def _spawn_on(self, spare: dict[str, WorkerHandle], gpu: str | None) -> None:
        if gpu is not None:
            self._spawn(spare[gpu])

    def _drop_held(self, why: str) -> None:
        """FAIL a held trial as interrupted (a retry runs it); the loop is leaving."""
        held, self.held = self.held, None
        if held is not None:
            self._fail(Running(held.number, held.trial_id, time.monotonic()), "interrupted", why)

    def _seen(self, trials: list[FrozenTrial]) -> None:
        """The study as the last claim read it: the view's progress, with no query of its own."""
        maximize = self.study.direction == optuna.study.StudyDirection.MAXIMIZE
        self.view.progress(sum(t.state in FINISHED for t in trials), best_in(trials, maximize))
        if self.packer is not None:
            self.packer.learn(trials)

    def _claim_due(self) -> bool:
        """Claim on schedule, or at once when a trial this driver waits on has ended
        (a cheap poll of RUNNING trials, instead of a full claim every heartbeat)."""
        now = time.monotonic()
        if now >= self.next_claim:
            return True
        if self.waiting_on and now >= self.next_poll:
            self.next_poll = now + WAIT_POLL_S
            return not self.waiting_on <= self._foreign_running()
        return False

    def _foreign_running(self) -> set[int]:
        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        return {t.number for t in running if t.user_attrs.get("driver_id") != self.ident.driver_id}

    def _spawn(self, w: WorkerHandle) -> None:
        w.start()
        self.sel.register(w.proc.stdout, selectors.EVENT_READ, w)

    def _pump(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout=timeout):
            w: WorkerHandle = key.data
            events = w.read_events()
            if events is None:
                self._worker_exited(w)
                continue
            for ev in events:
                self._on_event(w, ev)

    def _on_event(self, w: WorkerHandle, ev: dict[str, Any]) -> None:
        kind, run = ev.get("ev"), w.running
        if run is not None:
            run.last_event = time.monotonic()  # any event: the worker is neither dead nor stuck
        if kind == protocol.READY:
            w.ready = w.was_ready = True
            w.early_exits = 0
        elif kind == protocol.PROGRESS and run and "steps" in ev:  # (no steps: waiting for the store)
            run.steps = int(ev.get("steps") or 0)
        elif kind == protocol.WARN:
            self.warnings(w.slot, str(ev.get("text", "")))
        elif kind == protocol.EPOCH and run:
            run.epoch, run.metrics = ev["epoch"], ev["metrics"]
            self.view.epoch(w.slot, ev["number"], ev["epoch"], ev["metrics"])
            self._measured(run.number, ev["metrics"].get("peak_mem_mb"))
        elif kind == protocol.MEMORY and run:
            self._measured(run.number, ev.get("peak_mb"))
        elif kind == protocol.END and run and ev.get("number") == run.number:
            if self.packer is not None:
                self.packer.ended(run.number, ev["state"], ev.get("metrics") or {})
            # (an END read after the driver killed the trial is stale: the trial is failed already)
            failed = ev["state"] == "FAIL" or ev.get("reason") == "config"  # config: PRUNED for TPE's sake
            self.failures_in_row = self.failures_in_row + 1 if failed else 0
            self.view.trial_ended(w.slot, ev["number"], ev["state"], ev.get("value"), ev.get("reason"))
            w.running = None
            w.ready = ev["state"] != "FAIL"  # after a failure the worker exits; its replacement comes on EOF
            self.exhausted = False  # a failure frees budget; the next claim re-counts

    def _measured(self, number: int, peak_mb: Any) -> None:
        if self.packer is not None:
            self.packer.measured(number, peak_mb)

    def _worker_exited(self, w: WorkerHandle) -> None:
        self.sel.unregister(w.proc.stdout)
        code = w.proc.wait()
        if w.running is not None:
            reason = "interrupted" if self.stop.count else "crash"
            self._fail(w.running, reason, f"worker exited with code {code}", code)
            self.failures_in_row += reason == "crash"
            self.view.trial_ended(w.slot, w.running.number, "FAIL", None, reason)
        w.close()
        w.running = None
        if not w.was_ready and not self.stop.count:
            self._early_exit(w, code)
        if not self.stop.count and not self._stopping():
            self._spawn(w)

    def _early_exit(self, w: WorkerHandle, code: int) -> None:
        """A worker that dies before it is ready (storage refused, too many
        connections, a broken install) would otherwise be respawned forever."""
        w.early_exits += 1
        if w.early_exits >= MAX_EARLY_EXITS and not self.broken:
            self.broken = True
            self.message = (f"stopped: the worker for {w.slot.label} exited {w.early_exits} times before it was "
                            f"ready (last exit code {code}); see {w.log_path}")

    def _fail(self, run: Running, reason: str, error: str, code: int | None = None) -> None:
        """FAIL a trial this driver ran, recording why; a no-op when it has finished
        meanwhile (another host judged it stale, or its worker told the store first)."""
        storage = private.backend(self.study)
        attrs = {"fail_reason": reason, "error": error, "exit_code": code}
        if reason == "interrupted":
            attrs["stop_reason"] = "interrupted"
        try:
            if storage.get_trial(run.trial_id).state.is_finished():
                return
            for key, value in attrs.items():
                storage.set_trial_user_attr(run.trial_id, key, value)
            self.study.tell(run.number, state=TrialState.FAIL, skip_if_finished=True)
        except optuna.exceptions.UpdateFinishedTrialError:
            return
        except StopRequested:
            return  # Ctrl-C during a store outage: the trial is failed as stale by the next run
        self.exhausted = False

    def _check_timeouts(self) -> None:
        """The hard time limit (train.max_minutes plus its grace) and the stall watchdog:
        a trial past either is killed with its worker's process group and failed."""
        limit, stall = self.cfg.train.max_minutes, self.cfg.study.stall_timeout
        for w in self.workers:
            run, now = w.running, time.monotonic()
            if run is None:
                continue
            if limit is not None and now - run.started > limit * 60 + timeout_grace_s(limit):
                self._kill_trial(w, "timeout", f"trial exceeded train.max_minutes={limit:g} by more than its "
                                 f"{timeout_grace_s(limit):g} s grace for scoring and writing results")
            elif stall is not None and now - run.last_event > stall:
                # the heartbeat thread beats through a hung step: only the events show progress
                self._kill_trial(w, "stall", f"no training step and no event from its worker for "
                                 f"{now - run.last_event:.0f} s (study.stall_timeout={stall:g})")

    def _kill_trial(self, w: WorkerHandle, reason: str, error: str) -> None:
        run = w.running
        w.kill()
        self._fail(run, reason, error, w.proc.returncode)
        self.failures_in_row += 1
        self.view.trial_ended(w.slot, run.number, "FAIL", None, reason)
        w.running, w.ready = None, False  # the EOF that follows respawns the slot

    def _drain(self) -> None:
        self._drop_held("stopped (Ctrl-C or SIGTERM) before it could start")
        for w in self.workers:
            if not w.stop_sent:
                w.send({"op": protocol.STOP})
                w.stop_sent = True

    def _kill_all(self) -> None:
        """The second Ctrl-C: every worker's process group killed at once, then their trials failed."""
        for w in self.workers:
            _guarded(w.kill, w)
        for w in self.workers:
            run, w.running = w.running, None
            if run is not None:
                self._fail(run, "interrupted", "killed by a second Ctrl-C", w.proc.returncode)
                self.view.trial_ended(w.slot, run.number, "FAIL", None, "interrupted")

    def shutdown(self) -> None:
        """Stop every worker at once, then wait for them together (not 10 s each in turn);
        a worker or a store call that fails here does not keep the others from stopping."""
        for w in self.workers:
            # idle (or still importing torch): holds no trial, no need to wait
            _guarded(w.kill if w.running is None else w.request_close, w)
        deadline = time.monotonic() + CLOSE_WAIT_S
        for w in self.workers:
            _guarded(lambda: w.close(deadline), w)
            if w.running is not None:
                _guarded(lambda: self._fail(w.running, "interrupted", "driver shut down"), w)
        self.sel.close()


def _guarded(action: Any, w: WorkerHandle) -> None:
    try:
        action()
    except (StorageOutage, StopRequested):
        pass  # reported once, at the CLI boundary
    except Exception as exc:  # noqa: BLE001 - shutdown goes on for the other workers
        print(f"sweeper: stopping the worker on {w.slot.label} failed: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
