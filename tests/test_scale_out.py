"""Scale-out pieces that need no PostgreSQL: host identity and the dead-driver
check, several drivers on one SQLite file, the S3 artifact pre-flight, and a
worker that can never start."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from sweeper.config import load_config
from sweeper.dispatch.claim import claim
from sweeper.dispatch.live import NullView
from sweeper.dispatch.retries import fail_dead_local
from sweeper.dispatch.run import run
from sweeper.errors import ConfigError
from sweeper.store import artifact_store, check_artifacts, claim_lock, open_storage
from sweeper.store.identity import Identity


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_identity_names_host_pid_driver_and_process_table(monkeypatch):
    monkeypatch.setenv("SWEEPER_HOST_ID", "gpu-node-3")
    a, b = Identity.current(), Identity.current()
    assert (a.host, a.pid) == ("gpu-node-3", os.getpid())
    assert a.driver_id != b.driver_id and len(a.driver_id) == 12
    assert a.pid_ns and a.pid_ns == b.pid_ns
    # a claim writes them one by one, host last: a driver killed between two writes (the three-host
    # drill at 995a2de) leaves either no host, or a host with its whole identity
    assert list(a.attrs()) == ["driver_pid", "driver_id", "pid_ns", "host"]


@pytest.mark.slow
def test_dead_local_driver_is_failed_only_when_its_pid_is_ours_to_judge(workdir, monkeypatch):
    """Same host id and process table: a dead pid is failed at once. Same host id
    but another process table (a second machine or pod given the same id): the
    pid means nothing here, so the trial is left to the heartbeat check."""
    monkeypatch.setenv("SWEEPER_HOST_ID", "node")
    storage = open_storage("sqlite:///db.sqlite", heartbeat_interval=1, grace_period=60)
    study = optuna.create_study(study_name="s", storage=storage)
    me, pid = Identity.current(), _dead_pid()
    here, elsewhere = study.ask(), study.ask()
    for trial, ns in ((here, me.pid_ns), (elsewhere, "other-boot:pid:[1]")):
        storage.record_heartbeat(trial._trial_id)
        for key, value in {"host": "node", "driver_pid": pid, "driver_id": "old", "pid_ns": ns}.items():
            trial.set_user_attr(key, value)
    fail_dead_local(study, me)
    assert study.trials[here.number].state == TrialState.FAIL
    assert study.trials[here.number].user_attrs["fail_reason"] == "interrupted"
    assert study.trials[elsewhere.number].state == TrialState.RUNNING


def test_a_retry_claimed_by_another_host_carries_that_hosts_identity(study_file, workdir, monkeypatch):
    path = study_file({"study": {"n_trials": 2}})
    cfg = load_config(path)
    storage = open_storage(cfg.study.resolved_storage, heartbeat_interval=1, grace_period=60)
    study = optuna.create_study(study_name="tiny", storage=storage, direction="maximize")
    lock = claim_lock(storage, cfg.study.resolved_storage, "tiny")
    monkeypatch.setenv("SWEEPER_HOST_ID", "a")
    (first,) = claim(study, cfg, lock, Identity.current(), Path("runs/tiny"))
    study._storage.set_trial_user_attr(first._trial_id, "fail_reason", "interrupted")
    study._storage.set_trial_state_values(first._trial_id, state=TrialState.FAIL)
    monkeypatch.setenv("SWEEPER_HOST_ID", "b")
    other = Identity.current()
    (retry,) = claim(study, cfg, lock, other, Path("runs/tiny"))
    got = study.trials[retry.number].user_attrs
    assert got["retry_of"] == first.number and study.trials[retry.number].params == first.params
    assert {k: got[k] for k in other.attrs()} == other.attrs()
    assert got["checkpoint"] == f"runs/tiny/trials/{retry.number}/checkpoint.pt"


@pytest.mark.slow
def test_three_drivers_on_one_sqlite_file_share_the_budget_exactly(study_file):
    path = study_file({"study": {"n_trials": 6}, "train": {"epochs": 1}, "devices": {"cpu_workers": 1}})
    procs = [subprocess.Popen([sys.executable, "-m", "sweeper.cli", "run", str(path)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env={**os.environ, "SWEEPER_HOST_ID": f"h{k}"})
             for k in range(3)]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    study = optuna.load_study(study_name="tiny", storage=open_storage("sqlite:///runs/tiny/study.db", create=False))
    trials = study.get_trials()
    assert [t.number for t in trials] == list(range(6))
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 6
    assert all("database is locked" not in o and "Traceback" not in o for o in outs)
    assert sorted(Path(p).name for p in Path("runs/tiny/logs").iterdir()) == [f"h{k}.slot-0.log" for k in range(3)]


@pytest.mark.slow
def test_a_worker_that_never_starts_stops_the_driver(study_file):
    """Without a limit the driver would respawn it forever (e.g. the database
    refusing connections: too many clients)."""
    path = study_file({"study": {"n_trials": 2}, "devices": {"cpu_workers": 1}})
    Path("runs/tiny").mkdir(parents=True)
    Path("runs/tiny/artifacts").write_text("a file where the workers need a folder")
    outcome = run(load_config(path), view=NullView())
    assert outcome.exit_code == 1
    assert "exited 3 times before it was ready (last exit code 1: " in outcome.message
    # what ended it, from its log: where a user saw only the log's name
    assert "Error: " in outcome.message.split("(last exit code 1: ")[1]
    # no trial was claimed: only the config's set (study.start_from_config) waits
    assert outcome.counts == {"RUNNING": 0, "COMPLETE": 0, "PRUNED": 0, "FAIL": 0, "WAITING": 1}


def test_s3_artifacts_without_boto3_is_a_clear_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)  # as if it were not installed
    with pytest.raises(ConfigError, match=r"study.artifacts: 's3://bucket' needs boto3.*pip install boto3"):
        check_artifacts("s3://bucket")
    with pytest.raises(ConfigError, match="needs boto3"):
        artifact_store("s3://bucket")
    with pytest.raises(ConfigError, match="no prefix"):
        check_artifacts("s3://bucket/some/prefix")
    assert check_artifacts("runs/x") is None


@pytest.mark.slow
def test_s3_artifacts_are_checked_before_anything_runs(study_file, monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)
    path = study_file({"study": {"artifacts": "s3://sweeps"}})
    with pytest.raises(ConfigError, match="needs boto3"):
        run(load_config(path), view=NullView())
    assert not Path("runs").exists()


@pytest.mark.slow
def test_a_trial_failed_by_another_driver_is_dropped_cleanly_and_rerun(study_file):
    """If another host ever fails a live trial (its heartbeats were late beyond the
    grace period), the worker keeps the stored outcome, logs one line, no traceback,
    and the sweep still finishes its budget with the retry."""
    import threading
    import time

    from sweeper.errors import FailReason
    from sweeper.study.ending import fail_trial

    path = study_file({"study": {"n_trials": 2, "grace_period": 60},
                       "model": {"name": "fault_models:Slow", "step_sleep": 0.1},
                       "train": {"epochs": 4, "batch_size": 128, "samples_per_epoch": 512, "patience": 10},
                       "devices": {"cpu_workers": 1}}, replace=("model",))
    victim: list[int] = []

    def intrude() -> None:  # plays the other host
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not victim:
            time.sleep(0.1)
            try:
                study = optuna.load_study(study_name="tiny", storage=open_storage("sqlite:///runs/tiny/study.db"))
            except Exception:  # noqa: BLE001 - not created yet
                continue
            for t in study.get_trials(states=(TrialState.RUNNING,)):
                if Path(f"runs/tiny/trials/{t.number}/checkpoint.pt").exists():
                    fail_trial(study, t._trial_id, FailReason.INTERRUPTED, "no heartbeat within study.grace_period (simulated)")
                    victim.append(t.number)

    thread = threading.Thread(target=intrude)
    thread.start()
    outcome = run(load_config(path), view=NullView())
    thread.join()
    assert victim and outcome.exit_code == 0
    study = optuna.load_study(study_name="tiny", storage=open_storage("sqlite:///runs/tiny/study.db"))
    trials = study.get_trials()
    assert trials[victim[0]].state == TrialState.FAIL
    retry = next(t for t in trials if t.user_attrs.get("retry_of") == victim[0])
    assert retry.state == TrialState.COMPLETE and retry.params == trials[victim[0]].params
    assert len([t for t in trials if t.state == TrialState.COMPLETE]) == 2
    log = "".join(p.read_text() for p in Path("runs/tiny/logs").iterdir())
    assert f"trial {victim[0]} was already finished as FAIL (interrupted) by another driver" in log
    assert "Traceback" not in log


def test_an_s3_artifact_stores_run_folder_lies_beside_the_study_file(tmp_path, monkeypatch):
    """With study.artifacts: s3://... the trials' files were kept in runs/<name> of the folder the command
    ran in (another cd, another run folder), while the default database stays beside the study file."""
    from sweeper.store.layout import run_dir

    (tmp_path / "exp").mkdir()
    (tmp_path / "exp/s.yaml").write_text("study: {name: t, artifacts: 's3://bucket'}\ndata: {path: p.parquet}\n")
    monkeypatch.chdir(tmp_path)
    cfg = load_config("exp/s.yaml")
    assert run_dir(cfg) == Path("exp/runs/t") and cfg.study.resolved_storage == "sqlite:///exp/runs/t/study.db"
