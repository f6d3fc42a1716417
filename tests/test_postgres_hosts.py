"""Several hosts, one study, on a real PostgreSQL server: separate driver
processes (``python -m sweeper.cli run STUDY --storage URL``) with distinct
SWEEPER_HOST_IDs, a shared run folder, real SIGKILLs."""
from __future__ import annotations

import glob
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState

from pg_server import pg_url  # noqa: F401 - fixture
from sweeper.store import open_storage

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

HOSTS = {
    "study": {"n_trials": 30, "retries": 1, "heartbeat_interval": 1, "grace_period": 4},
    "model": {"name": "fault_models:Slow", "step_sleep": 0.05},
    "train": {"epochs": 3, "batch_size": 128, "samples_per_epoch": 512, "patience": 10},
    "devices": {"cpu_workers": 2},
}
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
BAD = ("Cannot tell", "Traceback", "StorageInternalError", "OperationalError", "database is locked",
       "deadlock", "UpdateFinishedTrialError", "already finished")


class Host:
    """One simulated host: a driver process in its own process group."""

    def __init__(self, name: str, path: Path, url: str, **env: str | None) -> None:
        self.name = name
        self.log = path.parent / f"driver-{name}.log"
        full = {**os.environ, "SWEEPER_HOST_ID": name, **env}
        full = {k: v for k, v in full.items() if v is not None}  # None unsets
        with self.log.open("w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "sweeper.cli", "run", str(path), "--storage", url],
                                         stdout=out, stderr=subprocess.STDOUT, env=full, start_new_session=True)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def freeze(self) -> list[int]:
        """SIGSTOP the driver and everything under it (its fork server and workers run in their own
        sessions, so its process group alone would miss them), until no new process appears."""
        frozen: list[int] = []
        while fresh := [pid for pid in [self.proc.pid, *_descendants(self.proc.pid)] if pid not in frozen]:
            for pid in fresh:
                _signal(pid, signal.SIGSTOP)
            frozen += fresh
        return frozen

    def crash(self, frozen: list[int]) -> None:
        """The whole host dies at once: every process of it, as a power cut would."""
        for pid in frozen:
            _signal(pid, signal.SIGKILL)
        self.kill()

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not finish in {timeout:g} s:\n{self.log.read_text()[-3000:]}")

    def output(self) -> str:
        return self.log.read_text()


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it exited while we looked
        children.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
    found, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _study(url: str, name: str = "tiny") -> optuna.Study | None:
    try:
        return optuna.load_study(study_name=name, storage=open_storage(url, create=False))
    except Exception:  # noqa: BLE001 - the hosts may still be creating it
        return None


def _victims(study: optuna.Study, host: str) -> list[int]:
    """``host``'s RUNNING trials that have a checkpoint, once some trials have finished."""
    trials = study.get_trials(deepcopy=False)
    done = sum(t.state in FINISHED for t in trials)
    mine = [t.number for t in trials if t.state == TrialState.RUNNING and t.user_attrs.get("host") == host]
    return [n for n in mine if Path(f"runs/tiny/trials/{n}/checkpoint.pt").exists()] if done >= 6 else []


def _crash_mid_trial(url: str, host: Host, timeout: float = 90.0) -> optuna.Study:
    """Kill every process of ``host`` while it has a checkpointed trial RUNNING mid-sweep.

    The host is frozen first and the trial read again: a loaded box can let a trial seen running
    finish before a kill lands (its worker tells the store itself), and then no trial dies with it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.1)
        study = _study(url)
        if study is None or not _victims(study, host.name):
            continue
        frozen = host.freeze()
        if _victims(study, host.name):
            host.crash(frozen)
            return study
        for pid in frozen:
            _signal(pid, signal.SIGCONT)
    raise AssertionError(f"{host.name} never had a checkpointed running trial mid-sweep")


def _logs(hosts: list[Host]) -> str:
    worker_logs = "".join(Path(p).read_text() for p in glob.glob("runs/tiny/logs/*.log"))
    return "".join(h.output() for h in hosts) + worker_logs


def test_three_hosts_one_killed_exact_budget_and_reruns(study_file, pg_url):
    # 5 epochs, not 3: the kill lands while host-b's checkpointed trial still runs (it has about
    # 0.8 s of steps left after its first checkpoint; with 3, 0.4 s, and a loaded box's poll of
    # the study once let it finish first)
    path = study_file({**HOSTS, "train": {**HOSTS["train"], "epochs": 5}}, replace=("model",))
    hosts = [Host("host-a", path, pg_url, PGTZ="America/New_York"), Host("host-b", path, pg_url),
             Host("host-c", path, pg_url, PGTZ="Asia/Tokyo")]
    try:
        study = _crash_mid_trial(pg_url, hosts[1])
        codes = {h.name: h.wait(timeout=120) for h in (hosts[0], hosts[2])}
    finally:
        for h in hosts:
            if h.proc.poll() is None:
                h.kill()
    assert codes == {"host-a": 0, "host-c": 0}, _logs(hosts)[-4000:]
    trials = study.get_trials()
    by_number = {t.number: t for t in trials}
    assert sorted(by_number) == list(range(len(trials)))  # unique and contiguous
    assert len([t for t in trials if t.state in FINISHED]) == 30
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    # the dead host: whatever it had RUNNING is FAIL/interrupted and re-run elsewhere with the same params.
    # A trial with no host at all was asked by host-b and killed inside its claim, before the
    # identity was written: it belongs to the dead host too.
    def owner(t):
        return t.user_attrs.get("host", "host-b")

    dead = [t for t in trials if owner(t) == "host-b" and t.state not in FINISHED]
    assert dead
    for t in dead:
        assert t.state == TrialState.FAIL and t.user_attrs["fail_reason"] == "interrupted"
        if "host" in t.user_attrs:
            assert "no heartbeat within study.grace_period" in t.user_attrs["error"]
        retry = next(r for r in trials if r.user_attrs.get("retry_of") == t.number)
        # a trial killed between ask() and suggest() has no params yet: its retry samples them afresh
        assert t.params.items() <= retry.params.items() and retry.state == TrialState.COMPLETE
        assert retry.params == t.params or not t.params
        assert retry.user_attrs["host"] in ("host-a", "host-c")
        assert retry.user_attrs["driver_id"] != t.user_attrs.get("driver_id")
        if Path(f"runs/tiny/trials/{t.number}/checkpoint.pt").exists():
            assert retry.user_attrs["resumed_from_epoch"] >= 1
    # the live hosts lost nothing, and each host id stamps one driver
    assert not [t for t in trials if t.state == TrialState.FAIL and owner(t) != "host-b"]
    for name in ("host-a", "host-b", "host-c"):
        mine = [t for t in trials if t.user_attrs.get("host") == name]
        assert mine and len({t.user_attrs["driver_id"] for t in mine}) == 1
    logs = _logs(hosts)
    for bad in BAD:
        assert bad not in logs, bad
    # a shared study's budget is counted across its hosts, and the line says so (issue 42)
    assert re.search(r"budget reached: study\.n_trials=\d+ trials are finished \(counted across every host\); "
                     r"nothing left for host-[ac] to run", hosts[0].output() + hosts[2].output())


def _heartbeat_skew_s(url: str) -> float:
    """Largest distance between a stored heartbeat and the server's UTC clock."""
    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    with engine.connect() as conn:
        skew = conn.exec_driver_sql(
            "SELECT max(abs(extract(epoch FROM (now() AT TIME ZONE 'UTC') - heartbeat))) FROM trial_heartbeats"
        ).scalar()
    engine.dispose()
    return float(skew)


def test_mixed_client_time_zones_cause_no_false_stale_trials(study_file, pg_url):
    path = study_file({**HOSTS, "study": {**HOSTS["study"], "n_trials": 8}, "devices": {"cpu_workers": 1},
                       "train": {**HOSTS["train"], "epochs": 4}}, replace=("model",))
    hosts = [Host("utc", path, pg_url, PGTZ=None), Host("tokyo", path, pg_url, PGTZ="Asia/Tokyo")]
    try:
        codes = [h.wait(timeout=120) for h in hosts]
    finally:
        for h in hosts:
            if h.proc.poll() is None:
                h.kill()
    assert codes == [0, 0], _logs(hosts)[-4000:]
    trials = _study(pg_url).get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 8  # nobody's live trial was failed
    assert {t.user_attrs["host"] for t in trials} == {"utc", "tokyo"}
    assert _heartbeat_skew_s(pg_url) < 120  # all stored in UTC (Tokyo would be 9 h off)
    _read_back(path, pg_url, finished=8)


def _read_back(path: Path, url: str, finished: int) -> None:
    """status, best and the dashboard read the study through --storage."""
    status = subprocess.run([sys.executable, "-m", "sweeper.cli", "status", str(path), "--storage", url, "--json"],
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["finished"] == finished and report["best"]["trial"] is not None
    from sweeper.config import load_config
    from sweeper.inspect.dashboard import app

    got: dict = {}
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/api/studies", "SERVER_NAME": "localhost",
               "SERVER_PORT": "80", "wsgi.input": io.BytesIO(), "wsgi.url_scheme": "http", "QUERY_STRING": ""}
    body = b"".join(app(load_config(path), storage_url=url)(environ, lambda s, h, e=None: got.update(status=s)))
    assert got["status"] == "200 OK"
    assert [s["study_name"] for s in json.loads(body)["study_summaries"]] == ["tiny"]


def test_six_drivers_started_in_the_same_second_on_a_fresh_database(study_file, pg_url):
    path = study_file({"study": {"n_trials": 6}, "train": {"epochs": 1}, "devices": {"cpu_workers": 1}})
    hosts = [Host(f"h{k}", path, pg_url) for k in range(6)]
    try:
        codes = [h.wait(timeout=150) for h in hosts]
    finally:
        for h in hosts:
            if h.proc.poll() is None:
                h.kill()
    assert codes == [0] * 6, _logs(hosts)[-4000:]
    storage = open_storage(pg_url, create=False)
    assert [s.study_name for s in storage.get_all_studies()] == ["tiny"]
    trials = optuna.load_study(study_name="tiny", storage=storage).get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 6
    logs = _logs(hosts)
    for bad in BAD:
        assert bad not in logs, bad
