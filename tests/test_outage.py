"""Storage outages are ridden out: which errors are transient, SQLite readers that
never wait for a writer, an ambiguous commit, the claim lock across a lost
session, a SQLite file locked past its busy timeout under two drivers, and a
throw-away PostgreSQL server stopped mid-sweep (restarted, and never restarted)."""
from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState

from pg_server import pg_url, skip_unless_required  # noqa: F401 - fixture
from sweeper.errors import StopRequested, StorageError, StorageOutage
from sweeper.store import AdvisoryLock, advisory_key, open_storage
from sweeper.store import outage as outage_module
from sweeper.store.outage import is_transient

PG_BIN = Path("/usr/lib/postgresql/15/bin")
SLOW = {"model": {"name": "fault_models:Slow", "step_sleep": 0.05},
        "train": {"epochs": 2, "batch_size": 128, "samples_per_epoch": 512, "patience": 10}}


def _locked_db(path: Path) -> sqlite3.Connection:
    """Another process's writer: a transaction holding the database's write lock."""
    conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("CREATE TABLE IF NOT EXISTS intruder (x)")
    return conn


@pytest.fixture
def sqlite_store(workdir, monkeypatch):
    monkeypatch.setenv("SWEEPER_FAKE_SQLITE_BUSY_TIMEOUT_S", "0.2")

    def make(outage_s: float):
        url = f"sqlite:///{workdir / 'db.sqlite'}"
        storage = open_storage(url, heartbeat_interval=1, grace_period=4, outage_s=outage_s)
        study = optuna.create_study(study_name="s", storage=storage, load_if_exists=True)
        return storage, study
    return make


def test_a_sqlite_file_that_cannot_be_written_for_now_is_transient(workdir):
    """An immutable database mid-sweep (chattr +i): the driver died in a traceback ("disk I/O error"), its
    trials left RUNNING; it is an outage to ride out, as a lock is."""
    db = workdir / "db.sqlite"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("CREATE TABLE t (x)")
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as ro:
        with pytest.raises(sqlite3.OperationalError) as readonly:
            ro.execute("INSERT INTO t VALUES (1)")
    # a read-only file is permanent: said at once, not waited on for storage_outage_s
    assert str(readonly.value) == "attempt to write a readonly database" and not is_transient(readonly.value)
    assert is_transient(sqlite3.OperationalError("disk I/O error"))  # what an immutable file mid-sweep gives
    assert not is_transient(sqlite3.OperationalError("no such table: t"))


def test_sqlite_locked_past_the_busy_timeout_is_transient_a_bad_query_is_not(sqlite_store, workdir):
    storage, study = sqlite_store(outage_s=0)
    holder = _locked_db(workdir / "db.sqlite")
    try:
        with pytest.raises(optuna.exceptions.StorageInternalError) as locked:
            optuna.storages.RDBStorage.set_study_user_attr(storage, study._study_id, "k", 1)  # no retries
    finally:
        holder.rollback()
    assert "database is locked" in str(locked.value.__cause__) and is_transient(locked.value)
    with pytest.raises(sqlalchemy.exc.OperationalError) as bad, storage.engine.connect() as conn:
        conn.exec_driver_sql("SELECT * FROM no_such_table")
    assert not is_transient(bad.value)
    with pytest.raises(optuna.exceptions.DuplicatedStudyError) as dup:
        storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], "s")
    assert not is_transient(dup.value)


def test_a_trial_ended_by_the_store_being_away_is_interrupted_not_a_crash():
    """Past study.storage_outage_s, or stopped (a drain) while the store was away: the trial is failed as
    ``interrupted`` (retried as such), not as a ``crash`` that spends study.retries and counts toward
    the consecutive-failure stop."""
    from sweeper.worker.trial import _failed

    for exc in (StorageOutage("storage x has been unreachable for 61 s"), StopRequested(signal.SIGTERM)):
        state, value, attrs = _failed(exc, lambda line: None)
        assert (state, value, attrs["fail_reason"], attrs["stop_reason"]) == \
               (TrialState.FAIL, None, "interrupted", "interrupted")
    assert _failed(RuntimeError("boom"), lambda line: None)[2]["fail_reason"] == "crash"


def test_a_refused_postgresql_connection_is_transient():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once the socket is closed
    engine = sqlalchemy.create_engine(f"postgresql+psycopg://x@127.0.0.1:{port}/x", poolclass=sqlalchemy.pool.NullPool)
    with pytest.raises(sqlalchemy.exc.OperationalError) as refused:
        engine.connect()
    assert "refused" in str(refused.value) and is_transient(refused.value)


def test_a_tell_commits_synced_to_disk_other_writes_do_not(sqlite_store):
    storage, study = sqlite_store(outage_s=30)
    trial = study.ask()
    synced: list[int] = []

    def record(conn):  # PRAGMA synchronous as each commit runs: 1 NORMAL, 2 FULL
        synced.append(conn.exec_driver_sql("PRAGMA synchronous").scalar())

    sqlalchemy.event.listen(storage.engine, "commit", record)
    storage.set_trial_user_attr(trial._trial_id, "val_ic", 0.1)
    storage.set_trial_intermediate_value(trial._trial_id, 0, 0.1)
    storage.record_heartbeat(trial._trial_id)
    assert synced == [1, 1, 1]
    storage.set_trial_state_values(trial._trial_id, TrialState.COMPLETE, [0.1])  # the tell
    assert synced == [1, 1, 1, 2]
    sqlalchemy.event.remove(storage.engine, "commit", record)


def test_sqlite_readers_never_wait_for_a_writer(sqlite_store, workdir):
    storage, study = sqlite_store(outage_s=0)  # no retries: any wait past 0.2 s fails
    trial = study.ask()
    holder = _locked_db(workdir / "db.sqlite")
    try:
        assert [t.number for t in storage.get_all_trials(study._study_id)] == [trial.number]
        assert storage.get_trial(trial._trial_id).state == TrialState.RUNNING
        assert [s.study_name for s in storage.get_all_studies()] == ["s"]
        with pytest.raises(StorageOutage, match=r"unreachable for 0 s.*database is locked.*sweeper run"):
            storage.set_trial_user_attr(trial._trial_id, "k", 1)
    finally:
        holder.rollback()


def _tell_through_a_held_lock(storage, study, workdir) -> int:
    """Tell a trial while another writer holds the database for 1.5 s (past the 0.2 s busy
    timeout); the tell must land. Returns how many retries it took."""
    trial = study.ask()
    holder = _locked_db(workdir / "db.sqlite")
    release = threading.Timer(1.5, holder.rollback)
    release.start()
    with _counting_retries() as retries:
        study.tell(trial, 0.5)
    release.join()
    assert storage.get_trial(trial._trial_id).state == TrialState.COMPLETE
    return len(retries)


@contextlib.contextmanager
def _counting_retries():
    """The retries of every outage policy of this process while the block runs, as the
    policies announce them to their listeners (a worker's stall-watchdog events)."""
    heard: list[float] = []
    remove = outage_module.on_retry(lambda: heard.append(time.monotonic()))
    try:
        yield heard
    finally:
        remove()


def test_a_write_waits_out_a_lock_held_past_the_busy_timeout(sqlite_store, workdir):
    storage, study = sqlite_store(outage_s=30)
    assert _tell_through_a_held_lock(storage, study, workdir) > 0


def test_every_retry_is_announced_to_the_listeners(sqlite_store, workdir, monkeypatch):
    """A worker waiting out an outage tells its driver at each retry (the stall watchdog
    must not take it for a hung trial): listeners hear every retry, and only retries."""
    heard = []
    monkeypatch.setattr(outage_module, "_retry_listeners", [lambda: heard.append(time.monotonic()),
                                                            lambda: 1 / 0])  # a broken listener is ignored
    storage, study = sqlite_store(outage_s=30)
    study.enqueue_trial({})  # (a write without trouble: nothing to hear)
    assert heard == []
    retries = _tell_through_a_held_lock(storage, study, workdir)
    assert len(heard) == retries > 0


def test_a_tell_whose_commit_landed_before_the_connection_broke_is_not_an_error(sqlite_store):
    """The COMMIT reaches the database but its reply is lost (the server went down
    just then): the retry finds the trial finished, as asked, and reports success."""
    storage, study = sqlite_store(outage_s=30)
    trial, other = study.ask(), study.ask()
    lost: list[bool] = []

    def lose_the_reply(conn):
        if not lost:
            lost.append(True)
            conn.connection.dbapi_connection.commit()
            raise sqlalchemy.exc.OperationalError("COMMIT", {}, ConnectionError("server closed the connection"),
                                                  connection_invalidated=True)

    sqlalchemy.event.listen(storage.engine, "commit", lose_the_reply)
    try:
        assert storage.set_trial_state_values(trial._trial_id, TrialState.COMPLETE, [0.25]) is True
    finally:
        sqlalchemy.event.remove(storage.engine, "commit", lose_the_reply)
    assert lost == [True]
    stored = storage.get_trial(trial._trial_id)
    assert (stored.state, stored.values) == (TrialState.COMPLETE, [0.25])
    storage.set_trial_state_values(other._trial_id, TrialState.FAIL)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):  # finished otherwise: still an error
        storage.set_trial_state_values(other._trial_id, TrialState.COMPLETE, [1.0])


def test_a_connection_killed_while_optuna_reads_the_trials_is_ridden_out(pg_url):
    """The server ends the session in the middle of Optuna's trials query. Optuna's
    _get_trials takes that OperationalError for "too many IN variables" and queries
    again on the dead session: the PendingRollbackError it gets is transient too
    (the PostgreSQL restart drill died of it in a loaded CI run)."""
    storage = open_storage(pg_url)
    study = optuna.create_study(study_name="s", storage=storage)
    study.ask()
    admin = sqlalchemy.create_engine(pg_url, poolclass=sqlalchemy.pool.NullPool)
    killed: list[int] = []

    def kill_once(conn, cursor, statement, *_):
        if statement.lstrip().startswith("SELECT trials.trial_id") and "FROM trials" in statement and not killed:
            killed.append(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar())
            with admin.connect() as other:
                other.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                    f"SELECT pg_terminate_backend({killed[0]})")

    sqlalchemy.event.listen(storage.engine, "before_cursor_execute", kill_once)
    heard: list[str] = []
    optuna_root = logging.getLogger("optuna")
    handler = logging.Handler()
    handler.emit = lambda record: heard.append(record.getMessage())
    optuna_root.addHandler(handler)
    policy = storage.outage_policy
    try:
        storage.outage_policy = None  # the raw error first
        with pytest.raises(optuna.exceptions.StorageInternalError) as raw:
            storage._get_trials(study._study_id, None, set(), -1)
        assert type(raw.value.__cause__) is sqlalchemy.exc.PendingRollbackError and is_transient(raw.value)
        killed.clear()
        storage.outage_policy = policy
        with _counting_retries() as retries:
            assert [t.number for t in storage.get_all_trials(study._study_id)] == [0]
        assert len(killed) == 1 and len(retries) == 1
    finally:
        optuna_root.removeHandler(handler)
        admin.dispose()
        storage.engine.dispose()
    assert heard == []  # not Optuna's dump of the failed SQL: the outage policy reports it in one line


def test_the_claim_lock_is_taken_afresh_after_its_session_died(pg_url):
    """A server restart ends the lock's session: leaving the lock is then no error,
    and the next claim takes it again on a new connection."""
    storage = open_storage(pg_url)
    lock = AdvisoryLock(storage.engine, "sweeper:s", policy=outage_module.for_url(pg_url))
    admin = sqlalchemy.create_engine(pg_url, poolclass=sqlalchemy.pool.NullPool)
    key = advisory_key("sweeper:s")
    with admin.connect() as other:
        other = other.execution_options(isolation_level="AUTOCOMMIT")
        with lock:
            pid = lock._conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
            other.exec_driver_sql(f"SELECT pg_terminate_backend({pid})")
        with lock:
            assert lock._conn.exec_driver_sql("SELECT pg_backend_pid()").scalar() != pid
            assert other.exec_driver_sql(f"SELECT pg_try_advisory_lock({key})").scalar() is False
        assert other.exec_driver_sql(f"SELECT pg_try_advisory_lock({key})").scalar() is True
    admin.dispose()


def test_a_stale_trial_is_failed_only_on_a_second_look_a_grace_period_later(study_file, workdir, monkeypatch):
    """A heartbeat older than the grace period may only mean the store was down: a
    driver fails another driver's trial when it sees it stale twice, grace_period
    apart, with no storage trouble of its own in between; its own, never. (No waits: the
    heartbeats are backdated and the check's two looks moved apart, conftest's helpers.)"""
    from conftest import backdate_heartbeat, stale_check_later
    from sweeper.config import load_config
    from sweeper.dispatch.claim import claim
    from sweeper.store import claim_lock
    from sweeper.store import optuna_private as private
    from sweeper.store.identity import Identity

    monkeypatch.setenv("SWEEPER_FAKE_SQLITE_BUSY_TIMEOUT_S", "0.2")
    cfg = load_config(study_file({"study": {"n_trials": 20, "heartbeat_interval": 1, "grace_period": 2}}))
    url = cfg.study.resolved_storage
    storage = open_storage(url, heartbeat_interval=1, grace_period=2, outage_s=30)
    study = optuna.create_study(study_name="tiny", storage=storage, direction="maximize")
    lock, me = claim_lock(storage, url, "tiny"), Identity.current()

    def foreign() -> optuna.Trial:
        trial = study.ask()
        storage.record_heartbeat(trial._trial_id)
        trial.set_user_attr("driver_id", "another-driver")
        return trial

    def state(trial) -> TrialState:
        return storage.get_trial(trial._trial_id).state

    def silent(trial) -> None:  # its last beat a second past the grace period ago: stale now
        backdate_heartbeat(storage, trial._trial_id, 3)

    dead = foreign()
    silent(dead)
    (mine,) = claim(study, cfg, lock, me, workdir / "runs")
    assert state(dead) == TrialState.RUNNING  # first look: suspected only
    stale_check_later(2.1)
    silent(mine)
    claim(study, cfg, lock, me, workdir / "runs")
    assert state(dead) == TrialState.FAIL
    assert storage.get_trial(dead._trial_id).user_attrs["error"].startswith("no heartbeat within study.grace_period")
    assert mine._trial_id in private.stale_trial_ids(storage, study._study_id)
    assert state(mine) == TrialState.RUNNING  # stale too, but this driver's own

    dead = foreign()
    silent(dead)
    claim(study, cfg, lock, me, workdir / "runs")  # suspected
    holder = _locked_db(Path(storage.engine.url.database))  # then this process sees the store locked...
    threading.Timer(0.6, holder.rollback).start()
    storage.set_study_user_attr(study._study_id, "k", 1)  # ...and waits it out
    stale_check_later(2.1)
    claim(study, cfg, lock, me, workdir / "runs")
    assert state(dead) == TrialState.RUNNING  # the clock restarted when the store came back
    stale_check_later(2.1)
    claim(study, cfg, lock, me, workdir / "runs")
    assert state(dead) == TrialState.FAIL


# ---------------------------------------------------------------- real sweeps

def _sweep(path: Path, url: str | None = None, **env: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "sweeper.cli", "run", str(path)] + (["--storage", url] if url else [])
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **env})


def _study(url: str) -> optuna.Study | None:
    try:
        return optuna.load_study(study_name="tiny", storage=open_storage(url, create=False))
    except Exception:  # noqa: BLE001 - not created yet, or the store is down
        return None


def _wait(url: str, ready, procs: list[subprocess.Popen], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    study = None
    while True:
        study = study or _study(url)  # one storage: each opens a connection pool
        if study is not None and ready(study.get_trials(deepcopy=False)):
            return
        assert all(p.poll() is None for p in procs), [p.communicate()[0] for p in procs]
        assert time.monotonic() < deadline, "the sweep never got there"
        time.sleep(0.05)


def _logs(outs: list[str]) -> str:
    return "".join(outs) + "".join(Path(p).read_text() for p in glob.glob("runs/tiny/logs/*.log"))


def _retries(text: str) -> int:
    return sum(int(n) for n in re.findall(r"is back after [0-9.]+ s \((\d+) retries\)", text))


@pytest.mark.slow
def test_two_drivers_ride_out_a_sqlite_lock_held_past_the_busy_timeout(study_file):
    """A writer holds the database for 8 s, twice the grace period, while both
    drivers have a trial running: every write waits it out, and neither driver
    fails the other's trial although its heartbeat lapsed."""
    path = study_file({**SLOW, "study": {"n_trials": 6}, "devices": {"cpu_workers": 1}}, replace=("model",))
    url = "sqlite:///runs/tiny/study.db"
    procs = [_sweep(path, SWEEPER_FAKE_SQLITE_BUSY_TIMEOUT_S="0.5", SWEEPER_HOST_ID=f"h{k}") for k in range(2)]
    try:
        _wait(url, lambda ts: sum(t.state == TrialState.COMPLETE for t in ts) >= 1
              and sum(t.state == TrialState.RUNNING and "host" in t.user_attrs for t in ts) == 2, procs)
        holder = _locked_db(Path("runs/tiny/study.db"))
        time.sleep(8)
        holder.rollback()
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    trials = _study(url).get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 6, [(t.state, t.user_attrs) for t in trials]
    logs = _logs(outs)
    assert "database is locked" in logs and "is back after" in logs and "Traceback" not in logs
    print(f"\nSQLite locked 8 s: {_retries(logs)} retries logged")


class ThrowawayPostgres:
    """A PostgreSQL server this test owns: initdb into a temporary folder, on a free
    port, stopped and started at will (as the ``postgres`` user when run as root)."""

    def __init__(self) -> None:
        if not (PG_BIN / "initdb").exists():
            skip_unless_required(f"no PostgreSQL server binaries in {PG_BIN}")
        self.root = Path(tempfile.mkdtemp(prefix="sweeper-pg-"))
        self.data = self.root / "data"
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
        self._pg("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _pg(self, tool: str, *args: str) -> None:
        cmd = [str(PG_BIN / tool), *args]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w", "start", "-o",
                 f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off")

    def stop(self) -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def remove(self) -> None:
        try:
            self.stop()
        except subprocess.CalledProcessError:
            pass  # not running
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def throwaway_pg():
    server = ThrowawayPostgres()
    server.start()
    try:
        yield server
    finally:
        server.remove()


@pytest.mark.slow
def test_a_postgresql_restart_mid_sweep_loses_nothing(study_file, throwaway_pg):
    path = study_file({**SLOW, "study": {"n_trials": 12}}, replace=("model",))
    started = time.monotonic()
    proc = _sweep(path, throwaway_pg.url)
    try:
        _wait(throwaway_pg.url, lambda ts: sum(t.state == TrialState.COMPLETE for t in ts) >= 2
              and sum(t.state == TrialState.RUNNING for t in ts) >= 1, [proc])
        down = time.monotonic()
        throwaway_pg.stop()
        time.sleep(8)  # twice the grace period: every running trial's heartbeat lapses
        throwaway_pg.start()
        outage = time.monotonic() - down
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    wall = time.monotonic() - started
    assert proc.returncode == 0, out[-8000:]  # the driver's own output: its traceback, whole
    trials = _study(throwaway_pg.url).get_trials()
    states = [t.state for t in trials]
    assert states.count(TrialState.COMPLETE) == 12 and TrialState.RUNNING not in states, states
    logs = _logs([out])
    assert "is unavailable" in logs and "Traceback" not in logs
    print(f"\nPostgreSQL down {outage:.1f} s mid-sweep: sweep {wall:.1f} s, exit 0, {len(trials)} trials "
          f"({states.count(TrialState.COMPLETE)} complete), {_retries(logs)} retries logged")


@pytest.mark.slow
def test_a_worker_that_opens_the_store_while_it_restarts_waits_for_it(throwaway_pg):
    """A driver's child (``checked``) opening the store while it restarts rides the outage out: it
    used to exit before it was ready, and three such exits in a row stopped the sweep as a broken
    worker. A first open (the driver's: a wrong address is the likelier cause) does not wait."""
    open_storage(throwaway_pg.url).engine.dispose()  # the tables, as the driver made them
    throwaway_pg.stop()
    with pytest.raises(StorageError, match="cannot connect"):
        open_storage(throwaway_pg.url, outage_s=30)
    timer = threading.Timer(3, throwaway_pg.start)
    timer.start()
    began = time.monotonic()
    storage = open_storage(throwaway_pg.url, outage_s=60, checked=True)
    timer.join()
    assert time.monotonic() - began >= 3 and storage.get_all_studies() == []


@pytest.mark.slow
def test_sessions_killed_again_and_again_mid_sweep_lose_nothing(study_file, pg_url):
    """Every sweeper session (driver, lock, workers, heartbeats) is terminated every
    0.1 s for 15 s, so connections die mid-query, mid-commit and mid-checkout, not
    only at a clean server stop: every call rides it out and the sweep finishes."""
    path = study_file({**SLOW, "study": {"n_trials": 12}}, replace=("model",))
    proc = _sweep(path, pg_url)
    admin = sqlalchemy.create_engine(pg_url, poolclass=sqlalchemy.pool.NullPool)
    kill_all = ("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name LIKE 'sweeper@%%' AND datname = current_database()")
    kills = 0
    try:
        _wait(pg_url, lambda ts: any(t.state == TrialState.COMPLETE for t in ts), [proc])
        end = time.monotonic() + 15
        with admin.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            while time.monotonic() < end and proc.poll() is None:
                kills += conn.exec_driver_sql(kill_all).scalar()
                time.sleep(0.1)
        out = proc.communicate(timeout=180)[0]
    finally:
        admin.dispose()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-8000:]
    states = [t.state for t in _study(pg_url).get_trials()]
    assert states.count(TrialState.COMPLETE) == 12 and TrialState.RUNNING not in states, states
    logs = _logs([out])
    assert kills >= 20 and "is unavailable" in logs and "Traceback" not in logs, (kills, logs[-4000:])
    print(f"\n{kills} sessions killed in 15 s: exit 0, 12/12 complete, {_retries(logs)} retries logged")


def _wait_connected(url: str, app: str, n: int, proc: subprocess.Popen) -> None:
    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    deadline = time.monotonic() + 90
    try:
        while True:
            with engine.connect() as conn:
                sessions = conn.exec_driver_sql(
                    f"SELECT count(*) FROM pg_stat_activity WHERE application_name = '{app}'").scalar()
            if sessions >= n:
                return
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.2)
    finally:
        engine.dispose()


@pytest.mark.slow
def test_an_outage_past_storage_outage_s_exits_1_with_one_line(study_file, throwaway_pg):
    """The driver waits on another driver's trial (polling the store) when the
    server goes away for good: after study.storage_outage_s it gives up with one
    message and exit 1, without a traceback, and a later run can resume."""
    path = study_file({"study": {"n_trials": 1, "storage_outage_s": 5}}, replace=())
    storage = open_storage(throwaway_pg.url, heartbeat_interval=1, grace_period=4)
    study = optuna.create_study(study_name="tiny", storage=storage, direction="maximize")
    other = study.ask()  # another driver's trial, alive until the server goes
    proc = _sweep(path, throwaway_pg.url, SWEEPER_HOST_ID="under-test")
    beating = threading.Event()

    def beat() -> None:
        while not beating.wait(0.5):
            storage.record_heartbeat(other._trial_id)

    storage.record_heartbeat(other._trial_id)
    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        _wait_connected(throwaway_pg.url, "sweeper@under-test", 3, proc)  # the driver and both workers
        time.sleep(1)  # the workers are ready: the driver polls the store for the other trial
        beating.set()
        thread.join()
        down = time.monotonic()
        throwaway_pg.stop()
        out = proc.communicate(timeout=60)[0]
        took = time.monotonic() - down
    finally:
        beating.set()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out
    errors = [line for line in out.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, out
    assert re.fullmatch(r"Error: storage postgresql\+psycopg://postgres@127\.0\.0\.1:\d+/postgres has been "
                        r"unreachable for [5-9] s, more than study\.storage_outage_s = 5 \(.+\); finished trials "
                        r"are saved: run `sweeper run` again to resume once it is back", errors[0]), errors[0]
    assert "Traceback" not in out
    print(f"\nPostgreSQL gone for good, storage_outage_s=5: exit 1 after {took:.1f} s")


@pytest.mark.slow
def test_ctrl_c_while_the_store_is_down_exits_130_and_a_later_run_resumes(study_file, throwaway_pg):
    """Ctrl-C while the driver's workers wait out an outage mid-trial: exit 130 within
    seconds (every wait gives up), no traceback; once the server is back, `sweeper
    run` finishes the study, re-running what was cut short."""
    path = study_file({**SLOW, "study": {"n_trials": 12}}, replace=("model",))
    proc = _sweep(path, throwaway_pg.url)
    try:
        _wait(throwaway_pg.url, lambda ts: sum(t.state == TrialState.COMPLETE for t in ts) >= 1
              and sum(t.state == TrialState.RUNNING for t in ts) >= 1, [proc])
        throwaway_pg.stop()
        time.sleep(3)  # the driver and workers are retrying now
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=60)[0]
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    assert "Traceback" not in out
    print(f"\nSIGINT while PostgreSQL is down mid-trial: exit 130 after {took:.1f} s")
    throwaway_pg.start()
    again = _sweep(path, throwaway_pg.url)
    out = again.communicate(timeout=120)[0]
    assert again.returncode == 0, out
    states = [t.state for t in _study(throwaway_pg.url).get_trials()]
    assert states.count(TrialState.COMPLETE) == 12 and TrialState.RUNNING not in states, states


def test_a_server_error_is_judged_by_its_sqlstate():
    import psycopg

    class Shutdown(psycopg.errors.InternalError):  # a class the driver might map 57P01 to
        sqlstate = "57P01"

    class Unique(psycopg.errors.IntegrityError):
        sqlstate = "23505"

    assert is_transient(optuna.exceptions.StorageInternalError("x").with_traceback(None)) is False
    wrapped = optuna.exceptions.StorageInternalError("commit failed")
    wrapped.__cause__ = sqlalchemy.exc.InternalError("SELECT 1", {}, Shutdown("terminating connection"))
    wrapped.__cause__.__cause__ = wrapped.__cause__.orig
    assert is_transient(wrapped) is True
    assert is_transient(sqlalchemy.exc.IntegrityError("INSERT", {}, Unique("duplicate key"))) is False
    pool_wait = optuna.exceptions.StorageInternalError("commit failed")
    pool_wait.__cause__ = sqlalchemy.exc.TimeoutError("QueuePool limit of size 2 overflow 1 reached")
    assert is_transient(pool_wait) is True
