"""Ctrl-C and SIGTERM while ``sweeper run`` waits for the study's lock, which another
process holds: before the driver starts (it waits while opening the study) and in
the middle of a sweep (it waits to claim the next trial). Exit 130 (143) within a
few seconds, with no traceback, no "Aborted!", and no new trial or worker. And a sweep whose
stdout loses its reader (`| head`), which runs on to its end."""
from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from sweeper.config import load_config
from sweeper.dispatch.run import init_db
from sweeper.store import open_storage

pytestmark = pytest.mark.slow  # every test here starts a real process

DB = Path("runs/tiny/study.db")
SLOW = {"model": {"name": "fault_models:Slow", "step_sleep": 0.05},
        "study": {"n_trials": 20},
        "train": {"epochs": 2, "batch_size": 128, "samples_per_epoch": 512, "patience": 10}}


class Driver:
    """``python -m sweeper.cli run STUDY`` with its stderr read line by line."""

    def __init__(self, path: Path) -> None:
        # a terminal's Ctrl-C reaches a process whose SIGINT is at its default, which
        # a background job of a non-interactive shell (some CI runners) would not be
        self.proc = subprocess.Popen([sys.executable, "-m", "sweeper.cli", "run", str(path)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)

    def wait_for(self, text: str, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None, "".join(self.lines)
            assert time.monotonic() < deadline, f"no {text!r} in:\n" + "".join(self.lines)
            time.sleep(0.05)

    def signal_and_wait(self, signum: int) -> float:
        """Seconds from the signal to the exit."""
        sent = time.monotonic()
        self.proc.send_signal(signum)
        try:
            self.proc.wait(timeout=30)
            took = time.monotonic() - sent  # the driver's exit, not the reader's catching up below
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        self._reader.join(timeout=5)
        return took

    @property
    def stderr(self) -> str:
        return "".join(self.lines)


class LockHolder:
    """Another process's claim on the study: an exclusive flock on ``<db>.lock``."""

    def __init__(self, db: Path) -> None:
        db.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(db.with_name(db.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def release(self) -> None:
        os.close(self.fd)


def _trials() -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name="tiny", storage=open_storage(f"sqlite:///{DB}", create=False)).get_trials()


def _complete() -> int:
    try:
        return sum(t.state == TrialState.COMPLETE for t in _trials())
    except Exception:  # noqa: BLE001 - the driver has not created the study yet
        return 0


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_waiting_for_the_lock_to_open_the_study(study_file, signum, code):
    path = study_file()
    init_db(load_config(path))
    holder = LockHolder(DB)
    try:
        driver = Driver(path)
        driver.wait_for("waiting for the lock file")
        took = driver.signal_and_wait(signum)
    finally:
        holder.release()
    print(f"\n{signal.Signals(signum).name} while waiting for the lock to open the study: exit after {took:.2f} s")
    assert driver.proc.returncode == code, driver.stderr
    assert took < 5, driver.stderr
    assert f"interrupted; run `sweeper run {path}` again to resume" in driver.stderr
    assert "Traceback" not in driver.stderr and "Aborted!" not in driver.stderr
    # only the config's set that init_db enqueued (study.start_from_config): nothing ran
    assert [(t.state, t.user_attrs) for t in _trials()] == [(TrialState.WAITING, {"warm_start_from": "config"})]
    assert not Path("runs/tiny/logs").exists()  # no worker was started


def test_ctrl_c_while_waiting_for_the_claim_lock_mid_sweep(study_file):
    path = study_file(SLOW, replace=("model",))
    driver = Driver(path)
    holder = None
    try:
        deadline = time.monotonic() + 120
        while _complete() < 2:
            assert driver.proc.poll() is None and time.monotonic() < deadline, driver.stderr
            time.sleep(0.2)
        holder = LockHolder(DB)
        before = len(_trials())  # under the lock: no claim can add one now
        driver.wait_for("waiting for the lock file")  # a trial ended and the driver wants the next
        took = driver.signal_and_wait(signal.SIGINT)
    finally:
        if holder is not None:
            holder.release()
        if driver.proc.poll() is None:
            driver.proc.kill()
    print(f"\nSIGINT while waiting for the claim lock mid-sweep: exit after {took:.2f} s")
    assert driver.proc.returncode == 130, driver.stderr
    assert took < 5, driver.stderr
    assert "Traceback" not in driver.stderr and "Aborted!" not in driver.stderr
    trials = _trials()
    assert len(trials) == before
    assert not [t for t in trials if t.state == TrialState.RUNNING]


def test_a_sweep_whose_stdout_reader_leaves_runs_to_its_end(study_file):
    """``sweeper run STUDY | head -1`` (or a ``| tee`` that Ctrl-C ended first): the lines have no
    reader, but the sweep goes on to its last trial and exits 0, where click exited 1 at the next line."""
    path = study_file({"study": {"n_trials": 3}})
    proc = subprocess.Popen([sys.executable, "-m", "sweeper.cli", "run", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip(), "no first line"
        proc.stdout.close()  # what head does after its line
        proc.wait(timeout=120)  # its stderr is a few lines: no pipe fills while it runs
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Broken pipe" not in err, err
    assert [t.state for t in _trials()] == [TrialState.COMPLETE] * 3


def test_a_sweep_whose_stderr_reader_leaves_runs_to_its_end(study_file):
    """``sweeper run STUDY 2>&1 | head -1`` whose first line is stderr's (a wait for the lock another
    sweeper holds): the stderr lines after it have no reader either, and the sweep goes on to its last
    trial and exits 0, where click exited 1 at the study's "created" line."""
    path = study_file({"study": {"n_trials": 2}})
    holder = LockHolder(DB)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "sweeper.cli", "run", str(path)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert "waiting for the lock file" in proc.stdout.readline()
        proc.stdout.close()  # what head does after its line
    finally:
        holder.release()
    try:
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert [t.state for t in _trials()] == [TrialState.COMPLETE] * 2


def test_ctrl_c_after_the_stderr_reader_left_exits_130(study_file):
    """``sweeper run STUDY 2>&1 | tee log`` and a Ctrl-C that ends tee too, during the lock wait: the
    interrupted line, written after the sweep let the real streams back, exited 1 (click's broken pipe)."""
    path = study_file()
    init_db(load_config(path))
    holder = LockHolder(DB)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "sweeper.cli", "run", str(path)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        assert "waiting for the lock file" in proc.stdout.readline()
        proc.stdout.close()  # tee, ended by the same Ctrl-C
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        holder.release()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130

