"""Resume and reliability with real processes and real signals."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from sweeper.config import load_config
from sweeper.core import checkpoint_epoch
from sweeper.dispatch.live import NullView
from sweeper.dispatch.run import run

pytestmark = pytest.mark.slow  # every test here starts a real process

SLOW = {
    "study": {"n_trials": 4, "retries": 1, "heartbeat_interval": 1, "grace_period": 3},
    "model": {"name": "fault_models:Slow", "step_sleep": 0.1},
    # a trial of 4 epochs of 0.8 s: a signal sent once a running trial has checkpointed its first
    # epoch lands with about 2.4 s of the trial to go
    "train": {"epochs": 4, "batch_size": 128, "samples_per_epoch": 1024, "patience": 10},
    "devices": {"cpu_workers": 2},
}


def _study(path):
    cfg = load_config(path)
    return optuna.load_study(study_name=cfg.study.name, storage=cfg.study.resolved_storage)


def _hang_up_as_a_terminal_does():
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # a suite run under nohup passes SIGHUP ignored on


def _start(path, *args):
    # SIGHUP as a terminal's session has it: a sweep keeps an ignored SIGHUP ignored (nohup)
    return subprocess.Popen([sys.executable, "-m", "sweeper.cli", "run", str(path), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=_hang_up_as_a_terminal_does)


def _wait_for_checkpointed_running(path, timeout=60.0):
    """Wait until a RUNNING trial has saved an epoch checkpoint; returns (study, trials running)."""
    deadline = time.monotonic() + timeout
    study = None
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if not Path("runs/tiny/logs").exists():  # the driver creates it once the study exists
            continue
        try:
            study = study or _study(path)
            running = study.get_trials(states=(TrialState.RUNNING,))
        except Exception:  # noqa: BLE001 - the driver may still be creating the study
            continue
        ready = [t for t in running if Path(f"runs/tiny/trials/{t.number}/checkpoint.pt").exists()]
        if ready and all("pid" in t.user_attrs for t in running):
            return study, running
    raise AssertionError("no running trial reached a checkpoint in time")


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return False


def _resume_in_process(path):
    outcome = run(load_config(path), view=NullView())
    return outcome, _study(path)


def _checkpointed(numbers):
    """{trial: the epoch its checkpoint holds} of those that saved one (read before the resume:
    study.keep's default removes an interrupted trial's checkpoint once its retry has ended)."""
    epochs = {n: checkpoint_epoch(f"runs/tiny/trials/{n}/checkpoint.pt") for n in numbers}
    return {n: e for n, e in epochs.items() if e is not None}


def _check_completed_with_retries(study, n_trials, checkpointed):
    trials = study.get_trials()
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(finished) == n_trials
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    by_number = {t.number: t for t in trials}
    for number, epoch in checkpointed.items():
        original = by_number[number]
        assert original.state == TrialState.FAIL
        assert original.user_attrs["fail_reason"] == "interrupted"
        retry = next(t for t in trials if t.user_attrs.get("retry_of") == number)
        assert retry.params == original.params
        assert retry.user_attrs.get("resumed_from_epoch") == epoch >= 1
        assert not Path(f"runs/tiny/trials/{number}/checkpoint.pt").exists()  # study.keep: its retry ended
        steps = sorted(retry.intermediate_values)
        assert steps == list(range(1, len(steps) + 1))  # replayed once, then continued
        for step in range(1, epoch + 1):
            assert retry.intermediate_values[step] == original.intermediate_values[step]


def test_kill_9_driver_then_run_again(study_file):
    path = study_file(SLOW, replace=("model",))
    proc = _start(path)
    try:
        _, running = _wait_for_checkpointed_running(path)
        worker_pids = [t.user_attrs["pid"] for t in running]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in worker_pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in worker_pids if _alive(p)], "a worker outlived the killed driver"
    stranded = [t.number for t in _study(path).get_trials(states=(TrialState.RUNNING,))]
    assert stranded
    resumed = _checkpointed(stranded)
    assert resumed
    outcome, study = _resume_in_process(path)
    assert outcome.exit_code == 0
    _check_completed_with_retries(study, 4, resumed)


def _signal_test(study_file, signum, code):
    path = study_file(SLOW, replace=("model",))
    proc = _start(path)
    try:
        _, running = _wait_for_checkpointed_running(path)
        os.kill(proc.pid, signum)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, out
    # after a hang-up nothing is printed (the terminal is gone); the slot logs keep the trials' lines
    assert (f"sweeper resume {path}" in out) is (signum != signal.SIGHUP), out
    study = _study(path)
    assert not study.get_trials(states=(TrialState.RUNNING,))
    interrupted = [t.number for t in study.get_trials(states=(TrialState.FAIL,))]
    assert interrupted and all(study.trials[n].user_attrs["fail_reason"] == "interrupted" for n in interrupted)
    assert all(study.trials[n].user_attrs["stop_reason"] == "interrupted" for n in interrupted)
    with_ckpt = _checkpointed(interrupted)
    assert with_ckpt
    outcome, study = _resume_in_process(path)
    assert outcome.exit_code == 0
    _check_completed_with_retries(study, 4, with_ckpt)


def test_sigint_checkpoints_and_exits_130(study_file):
    _signal_test(study_file, signal.SIGINT, 130)


def test_sigterm_behaves_like_ctrl_c(study_file):
    _signal_test(study_file, signal.SIGTERM, 143)


def test_a_hang_up_drains_as_sigterm_does(study_file):
    # the terminal closed or the ssh session lost: it killed the driver at once, its trials left RUNNING
    # until their heartbeats went stale (nohup, which ignores SIGHUP, keeps the sweep running instead)
    _signal_test(study_file, signal.SIGHUP, 129)


def test_under_nohup_a_hang_up_is_ignored(study_file):
    path = study_file(SLOW, replace=("model",))
    proc = subprocess.Popen([sys.executable, "-m", "sweeper.cli", "run", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))  # what nohup does
    try:
        _wait_for_checkpointed_running(path)
        os.kill(proc.pid, signal.SIGHUP)
        time.sleep(1.0)
        assert proc.poll() is None  # still sweeping
        os.kill(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and f"sweeper resume {path}" in out, out


def test_worker_sigkill_is_a_crash_and_is_retried(study_file):
    path = study_file(SLOW, replace=("model",))
    proc = _start(path)
    try:
        _, running = _wait_for_checkpointed_running(path)
        victim = next(t for t in running if Path(f"runs/tiny/trials/{t.number}/checkpoint.pt").exists())
        os.kill(victim.user_attrs["pid"], signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    study = _study(path)
    trials = study.get_trials()
    dead = trials[victim.number]
    assert dead.state == TrialState.FAIL and dead.user_attrs["fail_reason"] == "crash"
    assert dead.user_attrs["exit_code"] == -signal.SIGKILL
    retry = next(t for t in trials if t.user_attrs.get("retry_of") == victim.number)
    assert retry.params == dead.params and retry.state == TrialState.COMPLETE
    assert retry.user_attrs["resumed_from_epoch"] >= 1
    assert len([t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]) == 4
