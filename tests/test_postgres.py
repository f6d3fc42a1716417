"""The PostgreSQL store against a real server on loopback: engine settings,
sessions pinned to UTC, schema creation and study creation under concurrency,
the advisory claim lock, ``init_db``, and refusing a host with other data or
another config."""
from __future__ import annotations

import getpass
import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState

from conftest import backdate_heartbeat, stale_check_later
from pg_server import pg_url  # noqa: F401 - fixture
from sweeper.config import load_config
from sweeper.data import write_synthetic
from sweeper.dispatch.claim import claim
from sweeper.dispatch.live import NullView
from sweeper.dispatch.run import init_db, run
from sweeper.errors import ConfigDrift, StorageError
from sweeper.store import AdvisoryLock, advisory_key, claim_lock, open_storage
from sweeper.store.identity import Identity
from sweeper.store.optuna_private import stale_trial_ids

pytestmark = pytest.mark.postgres


def _scalar(engine, sql):
    with engine.connect() as conn:
        return conn.exec_driver_sql(sql).scalar()


def test_engine_small_pool_pre_ping_and_utc_despite_pgtz(pg_url, monkeypatch):
    monkeypatch.setenv("PGTZ", "Asia/Tokyo")
    storage = open_storage(pg_url, heartbeat_interval=1, grace_period=4)
    engine = storage.engine
    assert engine.url.drivername == "postgresql+psycopg"
    assert (engine.pool.size(), engine.pool._max_overflow, engine.pool._pre_ping) == (2, 1, True)
    assert _scalar(engine, "SHOW TIME ZONE") == "UTC"
    # the same env without the hook: libpq applies PGTZ, which is what the hook undoes
    raw = sqlalchemy.create_engine(pg_url, poolclass=sqlalchemy.pool.NullPool)
    assert _scalar(raw, "SHOW TIME ZONE") == "Asia/Tokyo"
    raw.dispose()
    app = _scalar(engine, "SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()")
    assert app.startswith("sweeper@")


def test_postgresql_scheme_maps_to_psycopg_3(pg_url):
    plain = pg_url.replace("postgresql+psycopg://", "postgresql://")
    storage = open_storage(plain)
    assert storage.engine.url.drivername == "postgresql+psycopg"
    assert _scalar(storage.engine, "SELECT 1") == 1


def test_read_only_open_of_an_empty_database_creates_nothing(pg_url):
    with pytest.raises(StorageError, match="sweeper db init"):
        open_storage(pg_url, create=False)
    engine = sqlalchemy.create_engine(pg_url, poolclass=sqlalchemy.pool.NullPool)
    assert _scalar(engine, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == 0
    engine.dispose()


RACE = textwrap.dedent("""
    import json, sys
    from sweeper.config import load_config
    from sweeper.dispatch.run import init_db, prepare
    cfg = load_config(sys.argv[1])
    prepare(cfg, sys.argv[2], devices=False)  # warm up: imports, data, model; writes nothing
    print("ready", flush=True)
    sys.stdin.readline()  # everyone goes at the same instant
    print(json.dumps({"created": init_db(cfg, sys.argv[2]).created}), flush=True)
""")


@pytest.mark.slow
def test_six_processes_create_schema_and_study_at_the_same_instant(study_file, pg_url):
    path = study_file({"study": {"name": "race"}})
    procs = [subprocess.Popen([sys.executable, "-c", RACE, str(path), pg_url], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(6)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
        for p in procs:
            p.stdin.write("go\n")
        for p in procs:
            p.stdin.flush()
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for proc, (out, err) in zip(procs, results):
        assert proc.returncode == 0, err
    created = [json.loads(out.strip().splitlines()[-1])["created"] for out, _ in results]
    assert sorted(created) == [False] * 5 + [True]
    storage = open_storage(pg_url, create=False)
    assert [s.study_name for s in storage.get_all_studies()] == ["race"]


@pytest.mark.slow
def test_init_db_creates_the_study_once_without_devices(study_file, pg_url):
    path = study_file({"study": {"name": "init"}, "devices": {"gpus": [0]}})  # no GPU here: not needed
    # a URL with a password (the test server trusts its clients, so any will do; else its own)
    url = sqlalchemy.engine.make_url(pg_url)
    url = url.set(username=url.username or getpass.getuser(), password=url.password or "s3cret-pw")
    secret, pg_url = url.password, url.render_as_string(hide_password=False)
    first = init_db(load_config(path), pg_url)
    assert (first.study, first.created, first.n_trials) == ("init", True, 1)  # the config's own set
    assert "sweeper_test_" in first.storage and secret not in first.storage
    second = init_db(load_config(path), pg_url)
    assert second.created is False
    study = optuna.load_study(study_name="init", storage=open_storage(pg_url, create=False))
    attrs = study.user_attrs
    assert attrs["config"]["study"]["name"] == "init" and len(attrs["data_fingerprint"]) >= 16
    # the password is hidden where others read it (the dashboard shows the attributes), as every line hides it
    assert attrs["config"]["study"]["storage"] == url.render_as_string(hide_password=True)
    assert secret not in json.dumps(attrs) and "***@" in attrs["config"]["study"]["storage"]
    # its trials, on CPU slots: no file of the run folder holds the password (each trial's config.yaml)
    run(load_config(study_file({"study": {"name": "init"}}, name="cpu.yaml")), view=NullView(), storage_url=pg_url)
    assert {t.state for t in study.get_trials()} == {TrialState.COMPLETE}
    files = [p for p in Path("runs/init").rglob("*") if p.is_file()]
    assert Path("runs/init/trials/0/config.yaml") in files
    assert [p for p in files if secret.encode() in p.read_bytes()] == []
    drifted = study_file({"study": {"name": "init"}, "train": {"epochs": 3}})
    with pytest.raises(ConfigDrift, match=r"train\.epochs \(2 -> 3\)"):
        init_db(load_config(drifted), pg_url)


@pytest.mark.slow
def test_advisory_lock_excludes_and_dies_with_its_holder(pg_url):
    storage = open_storage(pg_url)
    lock = claim_lock(storage, pg_url, "s")
    assert isinstance(lock, AdvisoryLock)
    other = sqlalchemy.create_engine(pg_url, poolclass=sqlalchemy.pool.NullPool)
    key = advisory_key("sweeper:s")
    probe = f"SELECT pg_try_advisory_lock({key}) AND pg_advisory_unlock({key})"
    with lock:
        assert _scalar(other, probe) is False
    assert _scalar(other, probe) is True
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from sweeper.store import claim_lock, open_storage
        s = open_storage({pg_url!r})
        claim_lock(s, {pg_url!r}, "s").__enter__()
        print("held", flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert _scalar(other, probe) is False
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    deadline = time.monotonic() + 10
    while _scalar(other, probe) is not True:  # the server ends the dead session and frees the lock
        assert time.monotonic() < deadline, "the advisory lock outlived its killed holder"
        time.sleep(0.1)
    other.dispose()


@pytest.mark.slow
def test_claim_fails_a_trial_left_without_any_heartbeat(study_file, pg_url, tmp_path):
    """A driver that died between ask() and its first heartbeat leaves a RUNNING
    trial Optuna never calls stale. A claim suspects it (its claimer may only be
    waiting out an outage); a claim grace_period later fails and re-queues it."""
    path = study_file({"study": {"name": "orphan", "n_trials": 3}})
    cfg = load_config(path)
    init_db(cfg, pg_url)
    storage = open_storage(pg_url, heartbeat_interval=1, grace_period=4)
    study = optuna.load_study(study_name="orphan", storage=storage)
    orphan = study.ask({"train.lr": optuna.distributions.FloatDistribution(1e-3, 1e-2, log=True)})
    ident = Identity.current()
    lock = claim_lock(storage, pg_url, "orphan")
    (first,) = claim(study, cfg, lock, ident, tmp_path)
    assert study.trials[orphan.number].state == TrialState.RUNNING and first.number == orphan.number + 1
    stale_check_later(cfg.study.grace_period)  # the second look, a grace period later, without the wait
    backdate_heartbeat(storage, first._trial_id, cfg.study.grace_period + 1)  # as it would be by then
    assert first._trial_id in stale_trial_ids(storage, study._study_id)
    (trial,) = claim(study, cfg, lock, ident, tmp_path)
    assert study.trials[first.number].state == TrialState.RUNNING  # this driver's own: never judged by heartbeat
    dead = study.trials[orphan.number]
    assert dead.state == TrialState.FAIL and dead.user_attrs["fail_reason"] == "interrupted"
    assert "no heartbeat was ever recorded" in dead.user_attrs["error"]
    got = study.trials[trial.number]
    assert got.user_attrs["retry_of"] == orphan.number and got.params == dead.params
    assert (got.user_attrs["host"], got.user_attrs["driver_id"]) == (ident.host, ident.driver_id)


def _two_folders(tmp_path, seeds):
    """Host folders, each with data/panel.parquet at the same relative path."""
    folders = []
    for name, seed in zip(("host-a", "host-b"), seeds):
        folder = tmp_path / name
        (folder / "data").mkdir(parents=True)
        write_synthetic(folder / "data" / "panel.parquet", assets=12, dates=120, features=3, seed=seed)
        folders.append(folder)
    return folders


def _panel_study(folder, epochs=2):
    import yaml

    from conftest import TINY, merge

    raw = merge(TINY, {"study": {"name": "shared"}, "train": {"epochs": epochs}})
    raw["data"] = {"path": "data/panel.parquet", "synthetic": None, "lookback": 5}
    (folder / "study.yaml").write_text(yaml.safe_dump(raw))
    return folder / "study.yaml"


@pytest.mark.slow
def test_a_host_with_other_data_or_config_is_refused(workdir, pg_url, monkeypatch):
    host_a, host_b = _two_folders(workdir, seeds=(1, 2))
    monkeypatch.chdir(host_a)
    init_db(load_config(_panel_study(host_a)), pg_url)
    monkeypatch.chdir(host_b)
    with pytest.raises(ConfigDrift, match=r"data fingerprint .*data file \S+/host-b/data/panel.parquet is not the data"):
        run(load_config(_panel_study(host_b)), view=NullView(), storage_url=pg_url)
    monkeypatch.chdir(host_a)
    with pytest.raises(ConfigDrift, match=r"these keys differ: train\.epochs \(2 -> 5\)"):
        run(load_config(_panel_study(host_a, epochs=5)), view=NullView(), storage_url=pg_url)
    monkeypatch.chdir(host_b)
    proc = subprocess.run([sys.executable, "-m", "sweeper.cli", "run", "study.yaml", "--storage", pg_url],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "data/panel.parquet is not the data this study was run on" in proc.stderr
    assert "Traceback" not in proc.stderr
    study = optuna.load_study(study_name="shared", storage=open_storage(pg_url, create=False))
    # nobody that was refused ran (or enqueued) anything: only the config's set db init enqueued
    assert [(t.state, t.user_attrs) for t in study.get_trials()] == [
        (TrialState.WAITING, {"warm_start_from": "config"})]
