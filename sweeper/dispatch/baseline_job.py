"""The study's LightGBM baseline as a job of the sweep (``report.baseline: lightgbm``, the default;
docs/baseline.md): after the first trial of this driver ended on some slot, ``python -m
sweeper.baseline.job`` runs there with the slot's threads, taking the slot's turn where the strategy says so
(:func:`sweeper.dispatch.strategies.honours_turn`), so it never delays a first trial.

Once per study: :mod:`sweeper.baseline.state` says who claims it and who records each of its ends (this driver
settles only its own run). Nothing here raises into the loop: the sweep goes on whatever the baseline does."""

import json
import os
from pathlib import Path

import optuna

from sweeper import config as C
from sweeper import launch
from sweeper.baseline import state
from sweeper.baseline.state import State
from sweeper.dispatch.handle import WorkerHandle
from sweeper.dispatch.strategies import honours_turn
from sweeper.errors import one_line, say
from sweeper.store.identity import Identity
from sweeper.store.layout import baseline_log
from sweeper.store.locks import ClaimLock


class BaselineJob:
    """The baseline subprocess of one driver, and the worker whose turn it takes."""

    def __init__(self, cfg: C.SweeperConfig, study: optuna.Study, lock: ClaimLock, ident: Identity,
                 run_dir: Path, server: launch.Launcher | None = None) -> None:
        self.cfg, self.study, self.lock, self.ident, self.run_dir = cfg, study, lock, ident, run_dir
        self.server = server  # forks the job with its imports done (about 2.4 s less of the slot's time)
        self.tried = cfg.report.baseline is None  # one try per driver, none when it is off
        self.proc: launch.Child | None = None
        self.worker: WorkerHandle | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None

    def trial_ended(self, w: WorkerHandle) -> None:
        """A trial of ours ended on ``w``: the first time, claim the baseline and start it there."""
        if self.tried:
            return
        self.tried = True
        try:
            if not state.claim(self.study, self.lock, self.ident):
                return
        except Exception as exc:  # noqa: BLE001 - the baseline never ends the sweep
            # nothing of ours is stored: the state stays as it was, and a later sweep may try
            say(f"could not claim the baseline: {one_line(exc)}")
            return
        try:
            self._start(w)
        except Exception as exc:  # noqa: BLE001 - the baseline never ends the sweep
            self._settle(State.FAILED, f"could not start: {one_line(exc)}")

    def _start(self, w: WorkerHandle) -> None:
        threads = max(1, int(w.slot.threads))
        env = {**os.environ, **w.slot.env, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": str(threads)}
        log = baseline_log(self.run_dir, self.ident.host)
        log.parent.mkdir(parents=True, exist_ok=True)
        argv = ["--config", "-", "--run-dir", str(self.run_dir), "--threads", str(threads),
                "--host", self.ident.host, "--driver", self.ident.driver_id]
        with log.open("ab") as out:  # the child keeps its own descriptor
            self.proc = launch.start("baseline", argv, env, out=out.fileno(), err=out.fileno(),
                                     server=self.server)
        launch.feed(self.proc.stdin, json.dumps(C.to_dict(self.cfg)).encode())
        if honours_turn(self.cfg, w.slot):
            w.reserve()
            self.worker = w

    def poll(self) -> None:
        """Once per loop turn: a finished job gives its slot back (and is recorded if it said nothing)."""
        if (code := self.proc.poll() if self.proc is not None else None) is None:
            return
        self._release()
        if (after := state.after_exit(code, log := baseline_log(self.run_dir, self.ident.host))) is not None:
            say(f"the baseline job exited with code {code}; the sweep goes on without it (see {log})")
            self._settle(*after)

    def stop(self) -> None:
        """Ctrl-C or shutdown: the job is killed and recorded ``interrupted`` (claimable again)."""
        if self.proc is None:
            return
        launch.kill(self.proc)
        self._release()
        self._settle(State.INTERRUPTED, state.STOPPED)

    def _release(self) -> None:
        if self.worker is not None:
            self.worker.release()
        self.proc, self.worker = None, None

    def _settle(self, to: State, error: str) -> None:
        """Our own run ends as ``to`` (:func:`sweeper.baseline.state.settle`)."""
        try:
            state.settle(self.study, to, self.ident.host, self.ident.driver_id, error)
        except Exception as exc:  # noqa: BLE001 - a store that is away: the state stays as it was
            say(f"could not record the baseline's state: {one_line(exc)}")
