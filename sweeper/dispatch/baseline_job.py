"""The study's LightGBM baseline as a job of the sweep (``report.baseline: lightgbm``, the
default; docs/baseline.md): once per study, after the first trial of this driver ended on some
slot, that slot takes no new trial while ``python -m sweeper.baseline.job`` runs with its
threads, so the baseline takes the slot's turn and never delays a first trial. (Packing,
``trials_per_gpu: auto``, places trials by GPU memory and ignores the turn: there the baseline runs
on the CPU beside the GPU's trials.)

Once per study: the driver claims ``baseline_state`` under the claim lock
(:func:`sweeper.baseline.job.claim`); a second host, or a resume, finds it and starts nothing. The
job records ``done`` or ``failed`` itself; a job that died without a word is recorded ``failed``
here, and one stopped by Ctrl-C ``interrupted`` (which the next sweep may claim again). Nothing
here raises into the loop: the sweep goes on whatever the baseline does.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import optuna

from sweeper import config as C
from sweeper.dispatch.handle import WorkerHandle
from sweeper.errors import one_line
from sweeper.store.identity import Identity
from sweeper.store.layout import baseline_log
from sweeper.store.locks import ClaimLock

CLAIMABLE = ("interrupted",)  # states a later sweep may claim again


class BaselineJob:
    """The baseline subprocess of one driver, and the worker whose turn it takes."""

    def __init__(self, cfg: C.SweeperConfig, study: optuna.Study, lock: ClaimLock, ident: Identity,
                 run_dir: Path) -> None:
        self.cfg, self.study, self.lock, self.ident, self.run_dir = cfg, study, lock, ident, run_dir
        self.tried = cfg.report.baseline is None  # one try per driver, none when it is off
        self.proc: subprocess.Popen[bytes] | None = None
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
            if self._claim():
                self._start(w)
        except Exception as exc:  # noqa: BLE001 - the baseline never ends the sweep
            self._record("failed", f"could not start: {one_line(exc)}")

    def _claim(self) -> bool:
        from sweeper.baseline.job import STATE, set_state

        with self.lock:
            state = self.study.user_attrs.get(STATE)
            if state is not None and state.get("state") not in CLAIMABLE:
                return False
            set_state(self.study, "running", self.ident.host, self.ident.driver_id)
            return True

    def _start(self, w: WorkerHandle) -> None:
        threads = max(1, int(w.slot.threads))
        env = {**os.environ, **w.slot.env, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": str(threads),
               "PYTHONUNBUFFERED": "1"}
        log = baseline_log(self.run_dir, self.ident.host)
        log.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "sweeper.baseline.job", "--config", "-", "--run-dir", str(self.run_dir),
               "--threads", str(threads), "--host", self.ident.host, "--driver", self.ident.driver_id]
        with log.open("ab") as out:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out, stderr=out, env=env,
                                         start_new_session=True)
        _send(self.proc.stdin, C.to_dict(self.cfg))
        self.worker, w.reserved = w, True

    def poll(self) -> None:
        """Once per loop turn: a finished job gives its slot back (and is recorded if it said nothing)."""
        if self.proc is None or self.proc.poll() is None:
            return
        from sweeper.baseline.job import STORE_AWAY

        code = self.proc.returncode
        self._release()
        log = baseline_log(self.run_dir, self.ident.host)
        if code == STORE_AWAY:  # no fault of the baseline's: the next sweep may claim it again
            self._record("interrupted", f"the study's storage was away; see {log}", only_if_running=True)
        elif code != 0:
            self._record("failed", f"the baseline job exited with code {code}; see {log}",
                         only_if_running=True)

    def stop(self) -> None:
        """Ctrl-C or shutdown: the job is killed and recorded ``interrupted`` (claimable again)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self._release()
        self._record("interrupted", "the sweep stopped before the baseline ended", only_if_running=True)

    def _release(self) -> None:
        if self.worker is not None:
            self.worker.reserved = False
        self.proc, self.worker = None, None

    def _record(self, state: str, error: str, only_if_running: bool = False) -> None:
        from sweeper.baseline.job import STATE, set_state

        try:
            now = self.study.user_attrs.get(STATE) or {}
            ours = now.get("state") == "running" and now.get("driver") == self.ident.driver_id
            if not only_if_running or ours:
                set_state(self.study, state, self.ident.host, self.ident.driver_id, error=error)
        except Exception as exc:  # noqa: BLE001 - a store that is away: the state stays as it was
            print(f"sweeper: could not record the baseline's state: {one_line(exc)}", file=sys.stderr,
                  flush=True)


def _send(pipe: IO[bytes] | None, config: dict[str, Any]) -> None:
    if pipe is not None:
        with pipe:
            pipe.write(json.dumps(config).encode())
