"""The worker fork server: its children are the driver's workers (their own session, their exit
codes reported, dead with a dead driver), a sweep forks its workers, and a fresh interpreter is
the fallback (sweeper.launch)."""
from __future__ import annotations

import math
import os
import select
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from sweeper import launch
from sweeper.config import load_config
from sweeper.dispatch import forkserver
from sweeper.dispatch.forkserver import ForkedProc, ForkServer
from sweeper.dispatch.live import NullView
from sweeper.dispatch.run import run

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not forkserver.USE_FORK_SERVER, reason="the fork server is Linux's")]


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()


def test_forked_children_report_their_exit_and_live_in_their_own_session(workdir):
    server = ForkServer.start()
    assert server is not None
    log_path = workdir / "slot.log"
    try:
        with open(log_path, "ab") as log:
            env = {**os.environ, "SWEEPER_DRIVER_PID": str(os.getpid())}
            eof = launch.start("worker", [], env, err=log.fileno(), server=server)
            killed = launch.start("worker", [], env, err=log.fileno(), server=server)
            dead = {**env, "SWEEPER_DRIVER_PID": str(os.getpid() + 1_000_000)}  # start() would set ours
            gone = server.spawn("worker", [], dead, log.fileno(), log.fileno())
        assert isinstance(eof, ForkedProc) and isinstance(killed, ForkedProc) and isinstance(gone, ForkedProc)
        assert eof.stdin is not None and eof.stdout is not None
        eof.stdin.close()  # EOF before 'init': the worker's handshake exit
        assert eof.wait(timeout=120) == 2 and eof.stdout.read() == b""
        assert gone.wait(timeout=60) == 1  # its driver is not alive
        stat = _stat(killed.pid)
        assert int(stat[1]) == server._proc.pid  # type: ignore[union-attr]  # the server is its parent
        assert int(stat[2]) == killed.pid  # its own process group (setsid): killpg reaches it alone
        assert killed.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            killed.wait(timeout=0.2)
        os.killpg(killed.pid, signal.SIGKILL)
        assert killed.wait(timeout=30) == -signal.SIGKILL and killed.returncode == -9
    finally:
        server.stop()
    assert "the driver (pid" in log_path.read_text()
    with open(os.devnull, "ab") as devnull:
        assert server.spawn("worker", [], {}, devnull.fileno(), 2) is None  # stopped: fresh ones start


def test_a_worker_killed_beside_one_forked_with_it_reaches_its_eof(workdir):
    """Two workers asked for together are held until the preload ends and then forked in one
    batch: neither may keep a copy of the other's pipes. A copy of the second's event pipe in the
    first kept the killed second's EOF from the driver, which never respawned its slot (a sweep
    that hung in CI). The kill comes as soon as the pid is known: the server answers only once
    the child has its own process group, so killpg cannot miss it."""
    server = ForkServer.start()
    assert server is not None
    try:
        with open(workdir / "slot.log", "ab") as log:
            env = {**os.environ, "SWEEPER_DRIVER_PID": str(os.getpid())}
            first, second = (launch.start("worker", [], env, err=log.fileno(), server=server)
                             for _ in range(2))
        assert isinstance(first, ForkedProc) and isinstance(second, ForkedProc)
        assert second.stdout is not None
        os.killpg(second.pid, signal.SIGKILL)
        assert second.wait(timeout=30) == -signal.SIGKILL
        readable, _, _ = select.select([second.stdout], [], [], 10.0)
        assert readable and second.stdout.read() == b""  # its EOF, with the first still alive
        assert first.poll() is None
    finally:
        server.stop()


def _sweep(study_file, monkeypatch, spawned: list[object], servers: list[ForkServer] | None = None,
           name: str = "tiny"):
    real = ForkServer.spawn

    def spawn(self, job, *args):
        proc = real(self, job, *args)
        if job == "worker":
            spawned.append(proc)
            if servers is not None:
                servers.append(self)
        return proc

    monkeypatch.setattr(ForkServer, "spawn", spawn)
    cfg = load_config(study_file({"study": {"n_trials": 2, "name": name}, "devices": {"cpu_workers": 1}},
                                 name=f"{name}.yaml"))
    start = time.monotonic()
    assert run(cfg, view=NullView()).exit_code == 0
    study = optuna.load_study(study_name=cfg.study.name, storage=cfg.study.resolved_storage)
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE] * 2
    return time.monotonic() - start


def test_a_sweep_forks_its_workers(study_file, monkeypatch):
    spawned: list[object] = []
    _sweep(study_file, monkeypatch, spawned)
    assert spawned and all(isinstance(p, ForkedProc) for p in spawned)


def test_the_sweeps_of_one_process_share_one_server_and_a_failed_sweep_stops_it(study_file, monkeypatch):
    spawned: list[object] = []
    servers: list[ForkServer] = []
    _sweep(study_file, monkeypatch, spawned, servers, name="first")
    first = servers[0]
    assert first.alive  # kept for the next sweep
    _sweep(study_file, monkeypatch, spawned, servers, name="second")
    assert set(map(id, servers)) == {id(first)} and len(spawned) >= 2
    # each worker's own exit (the shutdown kills an idle worker), told apart by request, not pid
    assert [p.returncode for p in spawned] == [-signal.SIGKILL] * len(spawned)  # type: ignore[attr-defined]

    def broken(self):
        raise RuntimeError("the loop broke")

    monkeypatch.setattr("sweeper.dispatch.driver.Driver.loop", broken)
    with pytest.raises(RuntimeError, match="the loop broke"):
        run(load_config(study_file({"study": {"name": "third"}}, name="third.yaml")), view=NullView())
    assert not first.alive and forkserver._shared is None  # a straggler would have died with it
    try:
        assert ForkServer.shared() is not first  # the next sweep starts a new one
    finally:
        forkserver.stop_shared()


def test_a_forked_childs_path_is_its_own_folder_and_pythonpath_not_the_servers(tmp_path, monkeypatch):
    from sweeper.worker import forked

    mine, theirs, site = str(tmp_path / "a"), str(tmp_path / "b"), "/usr/lib/python3/site"
    monkeypatch.setattr(forked, "_STARTED_WITH", {"/first/folder", "/first/pythonpath"})
    monkeypatch.setattr("sys.path", ["/first/folder", "/first/pythonpath", site])
    monkeypatch.setattr("os.environ", {})
    forked._environ({"PYTHONPATH": f"{theirs}{os.pathsep}{site}"}, mine)
    import sys

    assert sys.path == [mine, theirs, site]
    assert os.environ == {"PYTHONPATH": f"{theirs}{os.pathsep}{site}"}


def test_without_the_fork_server_workers_start_fresh(study_file, monkeypatch):
    monkeypatch.setattr(forkserver, "USE_FORK_SERVER", False)
    spawned: list[object] = []
    _sweep(study_file, monkeypatch, spawned)
    assert spawned == []  # no server: every worker was a `python -m sweeper.worker.main`


def test_a_sweeps_baseline_job_is_forked_and_records_its_result(study_file, monkeypatch):
    jobs: list[tuple[str, object]] = []
    real = ForkServer.spawn

    def spawn(self, job, *args):
        proc = real(self, job, *args)
        if job not in ("worker", "summary", "check"):
            jobs.append((job, proc))
        return proc

    monkeypatch.setattr(ForkServer, "spawn", spawn)
    cfg = load_config(study_file({"study": {"n_trials": 2}, "devices": {"cpu_workers": 1},
                                  "report": {"baseline": "lightgbm"}}))
    assert run(cfg, view=NullView()).exit_code == 0
    assert [job for job, _ in jobs] == ["baseline"] and isinstance(jobs[0][1], ForkedProc)
    assert jobs[0][1].returncode == 0  # type: ignore[attr-defined]
    study = optuna.load_study(study_name=cfg.study.name, storage=cfg.study.resolved_storage)
    assert study.user_attrs["baseline_state"]["state"] == "done"
    assert math.isfinite(study.user_attrs["baseline"]["val_ic"])


HANG = """import os, time
from torch import nn
open(os.environ["HANG_PID"], "w").write(str(os.getpid()))
class Net(nn.Module):
    def __init__(self, n_features, lookback):
        super().__init__()
        time.sleep(600)
"""


def test_a_job_run_to_its_end_answers_and_one_past_its_timeout_is_killed(tmp_path, monkeypatch):
    """``launch.run`` (the user models' check): the request in, the answer lines and the exit code
    out; a child still running at the timeout is killed, with what it said until then; with the
    server gone, a fresh interpreter answers instead."""
    monkeypatch.chdir(tmp_path)  # the model is found in the asking process's folder
    (tmp_path / "hang.py").write_text(HANG)
    monkeypatch.setenv("HANG_PID", str(tmp_path / "pid"))
    server = ForkServer.start()
    assert server is not None
    try:
        request = '{"n_features": 3, "lookback": 5, "jobs": [%s]}'
        good = '{"name": "mlp", "model": {"name": "mlp", "hidden_size": 8}, "fatal": true}'
        out, code = launch.run("check", request % good, 120, server=server)
        assert (out, code) == ('{"error": null}\n', 0)
        hang = '{"name": "hang:Net", "model": {"name": "hang:Net"}, "fatal": true}'
        started = time.monotonic()
        out, code = launch.run("check", request % ", ".join([good, hang]), 5, server=server)
        assert (out, code) == ('{"error": null}\n', None)
        assert 5 <= time.monotonic() - started < 30
        pid = int((tmp_path / "pid").read_text())
        assert not Path(f"/proc/{pid}").exists()  # killed, and reaped by the server
    finally:
        server.stop()
    assert server.spawn("check", [], {}, 2, 2) is None  # a stopped server forks nothing
    assert launch.run("check", request % good, 120, server=server) == ('{"error": null}\n', 0)


def test_the_panels_summary_is_made_in_a_forked_child_as_it_is_made_here(study_file):
    """``sweeper run``'s driver imports no torch: the server's child loads the panel and answers
    its summary (or the data layer's error); with no answer the driver makes it itself."""
    import json

    from sweeper.config import to_dict, with_overrides
    from sweeper.dispatch.run import _summary
    from sweeper.errors import DataError
    from sweeper.study.summary import read_answer, summarize_panel

    cfg = load_config(study_file({"validation": {"scheme": "walk_forward", "folds": 2}}))
    here = summarize_panel(cfg)
    assert (here.features, len(here.folds)) == (["f00", "f01", "f02"], 2)
    bad = with_overrides(cfg, {"data.features": ["f0"]}, "test")
    server = ForkServer.start()  # asked at once: it forks the child between two of its preload's imports
    assert server is not None
    try:
        out, code = launch.run("summary", json.dumps(to_dict(cfg)), 120, server=server)
        assert code == 0 and read_answer(out) == here
        out, code = launch.run("summary", json.dumps(to_dict(bad)), 120, server=server)
        with pytest.raises(DataError, match=r"column 'f0' \(data.features\) not found"):
            read_answer(out)
    finally:
        server.stop()
    assert _summary(cfg, server) == here  # the server is gone: made in this process
    assert read_answer("") is None  # a child that died before it answered
    # not a user's mistake: made again in the driver, where it raises with its traceback
    assert read_answer('{"error": {"type": "ValueError", "message": "a bug"}}') is None


PRELOADED = """import sys
from torch import nn
class Net(nn.Module):
    def __init__(self, n_features, lookback):
        raise ValueError(" ".join(f"{m}={m in sys.modules}" for m in ("torch", "lightgbm")))
"""


def test_a_check_asked_at_once_is_forked_before_the_preload_ends(tmp_path, monkeypatch):
    """The server imports its preload between requests: a sweep's first asks (its panel's
    summary, its models' check), sent as it starts, are forked at most one import later, not
    once LightGBM, at the preload's end, is loaded (the child imports torch itself if need be)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "preloaded.py").write_text(PRELOADED)
    server = ForkServer.start()
    assert server is not None
    try:
        request = '{"n_features": 3, "lookback": 5, "jobs": [{"name": "preloaded:Net", "model": ' \
                  '{"name": "preloaded:Net"}, "fatal": true}]}'
        out, code = launch.run("check", request, 120, server=server)
    finally:
        server.stop()
    assert code == 0
    assert "failed (ValueError: torch=True lightgbm=False)" in out, out
