"""Failures end one trial with the right fail_reason, retries stop when they should, a second
Ctrl-C kills, and nothing goes wrong silently: real workers, real signals, a real SQLite store."""
from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from conftest import PROBE
from sweeper.config import DevicesConfig, load_config
from sweeper.core import checkpoint_epoch
from sweeper.devices import list_gpus
from sweeper.devices.gpus import Telemetry
from sweeper.dispatch import view as view_module
from sweeper.dispatch.live import NullView
from sweeper.dispatch.run import run
from sweeper.dispatch.view import Warnings
from sweeper.errors import ConfigError
from sweeper.worker.heartbeat import Heartbeat


class Recorder(NullView):
    def __init__(self):
        self.warnings: list[tuple[str, str]] = []

    def warn(self, slot, text):
        self.warnings.append((slot.label, text))


def _sweep(path, view=None, **kw):
    cfg = load_config(path)
    outcome = run(cfg, view=view or NullView(), **kw)
    return outcome, optuna.load_study(study_name=cfg.study.name, storage=cfg.study.resolved_storage)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1] != "Z"


@pytest.mark.slow
def test_segfaulting_workers_are_crashes_and_retries_run_out(study_file):
    path = study_file({
        "study": {"n_trials": 4, "retries": 1, "max_consecutive_failures": 3},
        "model": {**PROBE, "kind": "segv"},
        "devices": {"cpu_workers": 1},
    })
    outcome, study = _sweep(path)
    assert outcome.exit_code == 1
    assert outcome.message == ("stopped: the last 3 trials all failed (study.max_consecutive_failures); "
                               "see runs/tiny/logs")
    first, retry, fresh = study.get_trials()
    for t in (first, retry, fresh):
        assert t.state == TrialState.FAIL and t.user_attrs["fail_reason"] == "crash"
        assert t.user_attrs["exit_code"] == -signal.SIGSEGV
        assert t.user_attrs["error"] == f"worker exited with code {-signal.SIGSEGV}"
    # one retry (study.retries=1) with the same params; after it failed too, no further retry:
    # the next trial is a new sample
    assert (retry.user_attrs["retry_of"], retry.user_attrs["crash_count"], retry.params) == (0, 1, first.params)
    assert "retry_of" not in fresh.user_attrs and fresh.params != first.params
    assert len({t.user_attrs["pid"] for t in (first, retry, fresh)}) == 3  # a fresh worker each time


@pytest.mark.slow
def test_a_second_ctrl_c_kills_hung_workers_and_fails_their_trials(study_file, workdir):
    marker = workdir / "hanging"
    path = study_file({"study": {"n_trials": 2}, "model": {**PROBE, "kind": "hang", "marker": str(marker)},
                       "devices": {"cpu_workers": 1}})
    proc = subprocess.Popen([sys.executable, "-m", "sweeper.cli", "run", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert marker.exists(), "the model never started to hang"
        os.kill(proc.pid, signal.SIGINT)
        time.sleep(1.0)
        assert proc.poll() is None  # the first Ctrl-C waits for the step that never ends
        sent = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    assert took < 10, took
    assert f"sweeper resume {path}" in out
    study = optuna.load_study(study_name="tiny", storage="sqlite:///runs/tiny/study.db")
    [trial] = study.get_trials()
    assert trial.state == TrialState.FAIL
    ua = trial.user_attrs
    assert (ua["fail_reason"], ua["stop_reason"], ua["error"]) == ("interrupted", "interrupted",
                                                                     "killed by a second Ctrl-C")
    assert ua["exit_code"] == -signal.SIGKILL and not _alive(ua["pid"])


@pytest.mark.slow
def test_a_second_ctrl_c_as_the_driver_exits_is_no_traceback(study_file):
    """It cut the fork server's reaping short at exit: "Exception ignored in atexit callback", a traceback."""
    path = study_file({"study": {"n_trials": 2}, "model": {"name": "fault_models:Slow", "step_sleep": 0.05},
                       "devices": {"cpu_workers": 1}})
    proc = subprocess.Popen([sys.executable, "-m", "sweeper.cli", "run", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        lines = iter(proc.stdout.readline, "")
        assert any("started on" in line for line in lines), "no trial started"
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the group
        assert any(line.startswith("next:") or "] next:" in line for line in lines)
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:  # more, until the driver has exited
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            time.sleep(0.01)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    assert "Traceback" not in out and "Exception ignored" not in out, out


@pytest.mark.slow
def test_a_combination_the_model_refuses_is_a_config_failure_told_to_the_sampler(study_file):
    path = study_file({
        "study": {"n_trials": 2, "retries": 2},
        "model": {"name": "transformer", "d_model": 8, "nhead": 2, "num_layers": 1, "dim_feedforward": 16},
        "devices": {"cpu_workers": 1},
        "search_space": {"model.nhead": {"type": "categorical", "choices": [2, 3]}},
    }, replace=("model", "search_space"))
    from sweeper.store import open_storage

    study = optuna.create_study(study_name="tiny", storage=open_storage("sqlite:///runs/tiny/study.db"),
                                direction="maximize")
    for nhead in (3, 2):
        study.enqueue_trial({"model.nhead": nhead})
    outcome, study = _sweep(path)
    assert outcome.exit_code == 0
    refused, done = study.get_trials()
    # PRUNED with no intermediate values, so that TPE ranks it below every other trial
    assert (refused.state, refused.params, refused.intermediate_values) == (TrialState.PRUNED, {"model.nhead": 3}, {})
    assert refused.user_attrs["fail_reason"] == "config"
    assert "d_model (8) must be divisible by nhead (3)" in refused.user_attrs["error"]
    assert "stop_reason" not in refused.user_attrs
    assert done.state == TrialState.COMPLETE and "retry_of" not in done.user_attrs  # not retried
    assert done.user_attrs["pid"] == refused.user_attrs["pid"]  # and the worker was not replaced


@pytest.mark.slow
def test_config_failures_in_a_row_stop_the_sweep(study_file):
    # the constructor refuses odd widths (the study file's own, 8, it takes): a space of only those is
    # refused before any trial, since the model check builds a user model's int key at its low bound
    over = {"study": {"n_trials": 5, "max_consecutive_failures": 2}, "model": {**PROBE, "kind": "picky"},
            "devices": {"cpu_workers": 1},
            "search_space": {"model.hidden": {"type": "int", "low": 3, "high": 5, "step": 2}}}
    with pytest.raises(ConfigError, match=r"^search_space: none of the 1 model shapes can be built: model.hidden=3"):
        _sweep(study_file(over, replace=("search_space",)))
    # a space with one width it takes, whose first two trials draw the others: stopped after them
    over["search_space"] = {"model.hidden": {"type": "categorical", "choices": [3, 5, 8]}}
    path = study_file(over, replace=("search_space",))
    from sweeper.store import open_storage

    queued = optuna.create_study(study_name="tiny", storage=open_storage("sqlite:///runs/tiny/study.db"),
                                 direction="maximize")
    for hidden in (3, 5):
        queued.enqueue_trial({"model.hidden": hidden})
    outcome, study = _sweep(path)
    assert outcome.exit_code == 1
    assert outcome.message == ("stopped: the last 2 trials all failed (study.max_consecutive_failures); "
                               "see runs/tiny/logs")
    trials = study.get_trials()
    assert [(t.state, t.user_attrs["fail_reason"]) for t in trials] == [(TrialState.PRUNED, "config")] * 2
    for t in trials:
        assert t.user_attrs["error"].endswith(f"failed (ValueError: hidden ({t.params['model.hidden']}) must be even)")


@pytest.mark.slow
def test_after_force_a_retry_with_another_configs_checkpoint_starts_fresh(study_file):
    path = study_file({"study": {"n_trials": 1, "keep": {"checkpoints": "all"}}, "devices": {"cpu_workers": 1}})
    _, study = _sweep(path)
    [first] = study.get_trials()
    ckpt = first.user_attrs["checkpoint"]
    assert checkpoint_epoch(ckpt) == 2
    # a retry of it, queued as after an interruption; then the study file changes under --force
    study.enqueue_trial(first.params, user_attrs={"retry_of": 0, "attempt": 1, "resume_from": ckpt})
    path = study_file({"study": {"n_trials": 2}, "model": {"hidden_size": 12}, "devices": {"cpu_workers": 1}})
    outcome, study = _sweep(path, force=True)
    assert outcome.exit_code == 0
    retry = study.get_trials()[1]
    assert retry.state == TrialState.COMPLETE and retry.user_attrs["retry_of"] == 0
    assert "resumed_from_epoch" not in retry.user_attrs
    problem = "the checkpoint was written by a different run: model.hidden_size was 8, now 12"
    assert retry.user_attrs["resume_skipped"] == problem
    assert sorted(retry.intermediate_values) == [1, 2]  # trained from epoch 1, nothing replayed
    log = Path(f"runs/tiny/trials/{retry.number}/train.log").read_text()
    assert f"not resuming from {ckpt}: {problem}" in log and "starting fresh" in log


@pytest.mark.slow
def test_the_same_retry_resumes_when_the_config_is_unchanged(study_file):
    path = study_file({"study": {"n_trials": 1, "keep": {"checkpoints": "all"}}, "devices": {"cpu_workers": 1}})
    _, study = _sweep(path)
    [first] = study.get_trials()
    study.enqueue_trial(first.params, user_attrs={"retry_of": 0, "attempt": 1,
                                                  "resume_from": first.user_attrs["checkpoint"]})
    _, study = _sweep(study_file({"study": {"n_trials": 2}, "devices": {"cpu_workers": 1}}))
    retry = study.get_trials()[1]
    assert retry.user_attrs["resumed_from_epoch"] == 2 and "resume_skipped" not in retry.user_attrs
    assert retry.intermediate_values == first.intermediate_values  # replayed, nothing left to train


@pytest.mark.slow
def test_a_failed_artifact_upload_is_logged_and_shown_once(study_file, workdir):
    path = study_file({
        "study": {"n_trials": 1},
        "model": {"name": "fault_models:Slow", "step_sleep": 0.3, "hidden": 8},
        "train": {"epochs": 2, "batch_size": 128, "samples_per_epoch": 512},
        "devices": {"cpu_workers": 1},
    }, replace=("model",))
    store = workdir / "runs" / "tiny" / "artifacts"

    def break_the_artifact_store():
        # once the trial trains (its worker made the store's folder long before), the folder
        # becomes a file: every upload of the trial's files fails
        deadline = time.monotonic() + 60
        while not Path("runs/tiny/trials/0/metrics.csv").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        for child in store.iterdir():
            child.unlink()
        store.rmdir()
        store.write_text("not a folder")

    breaker = threading.Thread(target=break_the_artifact_store)
    breaker.start()
    view = Recorder()
    outcome, study = _sweep(path, view=view)
    breaker.join()
    assert outcome.exit_code == 0
    [trial] = study.get_trials()
    assert trial.state == TrialState.COMPLETE  # the files stay in the run folder
    [(slot, text)] = view.warnings
    assert slot == "cpu0"
    assert text.startswith("trial 0: artifact upload failed for config.yaml, metrics.csv, train.log, weights.pt, "
                           "daily_ic_valid.csv, daily_ic_test.csv (NotADirectoryError: ")
    assert text.endswith("; the files stay in runs/tiny/trials/0")
    line = "warning: " + text.removeprefix("trial 0: ")
    assert line in Path("runs/tiny/trials/0/train.log").read_text()
    assert line in Path(f"runs/tiny/logs/{trial.user_attrs['host']}.slot-0.log").read_text()


def test_repeated_warnings_are_held_back_and_counted(monkeypatch):
    monkeypatch.setattr(view_module, "WARN_REPEAT_S", 0.3)
    view, slot, other = Recorder(), types.SimpleNamespace(label="cpu0"), types.SimpleNamespace(label="cpu1")
    warnings = Warnings(view)
    for _ in range(3):
        warnings(slot, "heartbeat failed")
    warnings(other, "heartbeat failed")
    time.sleep(0.35)
    warnings(slot, "heartbeat failed")
    assert view.warnings == [("cpu0", "heartbeat failed"), ("cpu1", "heartbeat failed"),
                             ("cpu0", "heartbeat failed (and 2 more times)")]


class FlakyStorage:
    """Refuses the first ``failures`` heartbeats, as SQLite does past its busy timeout."""

    def __init__(self, failures):
        self.failures, self.beats = failures, 0

    def record_heartbeat(self, trial_id):
        if self.failures:
            self.failures -= 1
            raise sqlite3.OperationalError("database is locked")
        self.beats += 1


def test_a_failing_heartbeat_is_told_once_and_its_recovery_too():
    storage, lines = FlakyStorage(failures=3), []
    with Heartbeat(storage, 7, 0.05, warn=lines.append):
        deadline = time.monotonic() + 10
        while storage.beats < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert lines == ["heartbeat failed (OperationalError: database is locked); retrying every 0.05 s",
                     "heartbeat recorded again after 3 failed beat(s)"]


def test_telemetry_errors_are_printed_once_and_sampling_goes_on(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SWEEPER_FAKE_GPUS", "1")
    folder = tmp_path / "devices.csv"
    folder.mkdir()  # not a file: every sample fails to be written
    telemetry = Telemetry(folder, [types.SimpleNamespace(kind="gpu", gpu=list_gpus()[0])], interval=0.02)
    telemetry.start()
    time.sleep(0.3)
    assert telemetry._thread.is_alive()
    telemetry.stop()
    err = capsys.readouterr().err.splitlines()
    assert err == [f"sweeper: GPU telemetry failed (IsADirectoryError: [Errno 21] Is a directory: '{folder}'); "
                   f"{folder} misses samples while it does (the sweep goes on)"]


def test_telemetry_samples_the_sweeps_own_gpus_not_every_gpu_of_the_node(tmp_path, monkeypatch):
    # a run kept to GPUs 2 and 3 (CUDA_VISIBLE_DEVICES) sampled all 8, and the report and status showed them
    from sweeper.devices import plan_slots

    monkeypatch.setenv("SWEEPER_FAKE_GPUS", "4")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    path = tmp_path / "devices.csv"
    telemetry = Telemetry(path, plan_slots(DevicesConfig()), interval=0.02)
    telemetry.start()
    time.sleep(0.2)
    telemetry.stop()
    import pandas as pd

    assert sorted(set(pd.read_csv(path)["index"])) == [2, 3]
    assert not Telemetry(tmp_path / "cpu.csv", plan_slots(DevicesConfig(gpus="none"))).gpus


def _stop_rule(study_file, **study):
    from sweeper.dispatch.stopping import StopRule
    from sweeper.interrupt import StopToken

    cfg = load_config(study_file({"study": study}))
    return StopRule(cfg.study, StopToken(), Path("runs/tiny"))


def test_the_stop_rule_answers_without_writing(study_file):
    """stopping() is a query: the reason is recorded by what happened (a trial's end, the clock),
    and asking again, however often, changes nothing."""
    from sweeper.dispatch.stopping import Ending, TrialEnd

    rule = _stop_rule(study_file, max_consecutive_failures=2)
    for number in (0, 1):
        before = dict(vars(rule))
        assert not rule.stopping() and not rule.stopping()
        assert vars(rule) == before
        rule.trial_ended(TrialEnd(number, TrialState.FAIL, reason="crash", reported=True))
    assert rule.stopping() and rule.ending() is Ending.FAILED
    assert rule.message == ("stopped: the last 2 trials all failed (study.max_consecutive_failures); "
                            f"see {Path('runs/tiny') / 'logs'}")
    rule.trial_ended(TrialEnd(2, TrialState.FAIL, reason="crash", reported=True))  # one that was running
    assert rule.message.startswith("stopped: the last 3 trials all failed")


def test_study_timeout_is_judged_by_the_clock_once_a_turn(study_file):
    rule = _stop_rule(study_file, timeout=5)
    rule.clock(rule.started + 4)
    assert not rule.stopping() and rule.message == ""
    rule.clock(rule.started + 6)
    assert rule.stopping() and rule.message == "study.timeout (5 s) reached"
    rule.budget_used("budget reached")  # a later reason does not replace the first
    assert rule.message == "study.timeout (5 s) reached"
