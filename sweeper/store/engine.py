"""The Optuna storage engine: an RDBStorage tuned for many writers.

Optuna sets no SQLite pragmas, and a deferred SQLite transaction that reads and
then writes fails at once with "database is locked" when another process wrote
in between (WAL's BUSY_SNAPSHOT skips the busy handler). So every connection
gets WAL and a busy timeout, and every transaction starts with BEGIN
IMMEDIATE, which waits for the write lock instead of failing. PostgreSQL gets
small pools, pre-ping, TCP keepalives and sessions pinned to UTC, because
Optuna's heartbeat column has no time zone. Creating Optuna's tables is
serialised (an advisory lock on PostgreSQL, a file lock on SQLite) because
RDBStorage's constructor races with itself on a fresh database.
"""
from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import warnings
from pathlib import Path
from typing import Any, Iterator

import optuna
import sqlalchemy
from sqlalchemy import event

from sweeper.errors import StorageError
from sweeper.store.locks import FileLock, advisory_key
from sweeper.store.urls import is_postgres, is_sqlite, normalize_url, redact, sqlite_path

SQLITE_BUSY_TIMEOUT_S = 60.0
# A driver uses two connections (its sessions and the claim lock), a worker two
# (its sessions and the heartbeat thread): docs/scale-out.md has the arithmetic.
PG_POOL_SIZE = 2
PG_MAX_OVERFLOW = 1
# The server drops a silent client after idle + interval * count seconds, which
# also frees an advisory lock held by a host that vanished from the network.
PG_KEEPALIVE = {"idle": 30, "interval": 10, "count": 3}
SCHEMA_LOCK = "sweeper:schema"

# sweeper records heartbeats for ask/tell trials itself (Optuna only does inside
# Study.optimize), so these warnings say nothing useful to a user
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


def engine_kwargs(url: str) -> dict[str, Any]:
    if is_sqlite(url):
        return {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}}
    if is_postgres(url):
        return {
            "pool_pre_ping": True,
            "pool_size": PG_POOL_SIZE,
            "max_overflow": PG_MAX_OVERFLOW,
            "pool_recycle": 1800,
            "connect_args": pg_connect_args(),
        }
    return {"pool_pre_ping": True}


def pg_connect_args() -> dict[str, Any]:
    """libpq settings: fail fast when the server is unreachable, notice a dead one,
    and name the host in ``pg_stat_activity``."""
    host = os.environ.get("SWEEPER_HOST_ID") or socket.gethostname()
    return {
        "connect_timeout": 10,
        "application_name": f"sweeper@{host}"[:63],
        "keepalives": 1,
        "keepalives_idle": PG_KEEPALIVE["idle"],
        "keepalives_interval": PG_KEEPALIVE["interval"],
        "keepalives_count": PG_KEEPALIVE["count"],
    }


def _tune_sqlite(engine: sqlalchemy.Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # autocommit at the driver level, so that the "begin" hook below owns BEGIN
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()


PG_SESSION_SETTINGS = (
    # A startup option ("-c timezone=UTC") is not enough: libpq sends PGTZ as a
    # startup parameter too, and the server applies it last.
    "SET TIME ZONE 'UTC'",
    f"SET tcp_keepalives_idle = {PG_KEEPALIVE['idle']}",
    f"SET tcp_keepalives_interval = {PG_KEEPALIVE['interval']}",
    f"SET tcp_keepalives_count = {PG_KEEPALIVE['count']}",
)


def _tune_postgres(engine: sqlalchemy.Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        with dbapi_conn.cursor() as cur:
            for statement in PG_SESSION_SETTINGS:
                cur.execute(statement)
        dbapi_conn.commit()

    engine.dispose()  # connections opened before the hook existed are not pinned: drop them


def prepare_sqlite_file(url: str) -> None:
    """Create the folder and switch the file to WAL (persistent) before Optuna opens it."""
    path = sqlite_path(url)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=SQLITE_BUSY_TIMEOUT_S)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
    finally:
        conn.close()


def open_storage(url: str, *, heartbeat_interval: int | None = None, grace_period: int | None = None,
                 create: bool = True) -> optuna.storages.RDBStorage:
    """An RDBStorage for ``url``; raises StorageError when it cannot be reached.

    With ``create=False`` a database without Optuna's tables (or a SQLite file
    that does not exist) is an error rather than being created: read-only
    commands must not write.
    """
    url = normalize_url(url)
    if is_sqlite(url):
        path = sqlite_path(url)
        if path is not None and not path.exists() and not create:
            raise StorageError(f"storage {url}: no such database file {path}")
        if create:
            prepare_sqlite_file(url)
    try:
        with quiet_optuna(), schema_guard(url, create) as ready:
            storage = optuna.storages.RDBStorage(
                url, engine_kwargs=engine_kwargs(url), skip_table_creation=ready,
                heartbeat_interval=heartbeat_interval, grace_period=grace_period,
            )
    except StorageError:
        raise
    except Exception as exc:  # noqa: BLE001 - any driver error means "unreachable"
        raise StorageError(f"storage {redact(url)}: cannot connect: {_first_line(exc)}") from None
    if is_sqlite(url):
        _tune_sqlite(storage.engine)
    elif is_postgres(url):
        _tune_postgres(storage.engine)
    return storage


@contextlib.contextmanager
def schema_guard(url: str, create: bool) -> Iterator[bool]:
    """Yields whether Optuna's schema is complete; while it is not, holds a lock
    across processes and hosts so that one RDBStorage at a time creates it.

    RDBStorage's constructor runs create_all, inserts the version row and stamps
    alembic, each in its own transaction: on a fresh PostgreSQL database several
    hosts starting together fail with duplicate keys or deadlock.
    """
    if is_postgres(url):
        with _pg_schema_guard(url, create) as ready:
            yield ready
        return
    path = sqlite_path(url) if is_sqlite(url) else None
    if path is None or not create:
        yield False
        return
    with FileLock(path.with_name(path.name + ".lock")):
        yield False  # create_all only reads when the tables exist


@contextlib.contextmanager
def _pg_schema_guard(url: str, create: bool) -> Iterator[bool]:
    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool, connect_args=pg_connect_args())
    try:
        with engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            if _pg_schema_ready(conn):
                yield True
                return
            if not create:
                raise StorageError(f"storage {redact(url)}: the database holds no sweeper study "
                                   "(no Optuna tables): create one with `sweeper db init` or `sweeper run`")
            key = advisory_key(SCHEMA_LOCK)
            conn.exec_driver_sql(f"SELECT pg_advisory_lock({key})")
            try:
                yield _pg_schema_ready(conn)  # another host may have finished while we waited
            finally:
                conn.exec_driver_sql(f"SELECT pg_advisory_unlock({key})")
    finally:
        engine.dispose()


def _pg_schema_ready(conn: Any) -> bool:
    """True once the last step of Optuna's set-up (the alembic stamp) is done."""
    if conn.exec_driver_sql("SELECT to_regclass('alembic_version') IS NOT NULL").scalar() is not True:
        return False
    return conn.exec_driver_sql("SELECT count(*) FROM alembic_version").scalar() > 0


def check_reachable(url: str) -> None:
    """Connect without creating anything (``sweeper validate`` and pre-flight checks)."""
    url = normalize_url(url)
    if is_sqlite(url):
        path = sqlite_path(url)
        if path is None:
            return
        if path.exists():
            _sqlite_readable(path, url)
            return
        parent = next((p for p in path.parents if p.exists()), Path("."))
        if not os.access(parent, os.W_OK):
            raise StorageError(f"storage {url}: cannot create {path}: {parent} is not writable")
        return
    try:
        engine = sqlalchemy.create_engine(url, **engine_kwargs(url))
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        engine.dispose()
    except Exception as exc:  # noqa: BLE001
        raise StorageError(f"storage {redact(url)}: cannot connect: {_first_line(exc)}") from None


def _sqlite_readable(path: Path, url: str) -> None:
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        conn.execute("SELECT name FROM sqlite_master LIMIT 1").fetchall()
        conn.close()
    except sqlite3.DatabaseError as exc:
        raise StorageError(f"storage {url}: {path} is not a SQLite database ({exc})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc.__cause__ or exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(level)
