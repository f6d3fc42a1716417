"""The Optuna store: an RDBStorage tuned for many writers, a claim lock, and
the artifact store.

Optuna sets no SQLite pragmas, and a deferred SQLite transaction that reads and
then writes fails at once with "database is locked" when another process wrote
in between (WAL's BUSY_SNAPSHOT skips the busy handler). So every connection
gets WAL and a busy timeout, and every transaction starts with BEGIN
IMMEDIATE, which waits for the write lock instead of failing. PostgreSQL gets
small pools, pre-ping and sessions pinned to UTC, because Optuna's heartbeat
column has no time zone.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import sqlite3
import warnings
from pathlib import Path
from typing import Any, Iterator

import optuna
import sqlalchemy
from sqlalchemy import event

from sweeper.errors import StorageError

SQLITE_BUSY_TIMEOUT_S = 60.0
PG_POOL_SIZE = 2
PG_MAX_OVERFLOW = 2

# sweeper records heartbeats for ask/tell trials itself (Optuna only does inside
# Study.optimize), so these warnings say nothing useful to a user
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def is_postgres(url: str) -> bool:
    return url.startswith("postgresql")


def sqlite_path(url: str) -> Path | None:
    """The database file of a ``sqlite:///`` URL (None for in-memory)."""
    path = sqlalchemy.engine.make_url(url).database
    return Path(path) if path and path != ":memory:" else None


def normalize_url(url: str) -> str:
    # SQLAlchemy 2.1 maps postgresql:// to psycopg 3; older ones to psycopg2.
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def engine_kwargs(url: str) -> dict[str, Any]:
    if is_sqlite(url):
        return {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}}
    if is_postgres(url):
        return {
            "pool_pre_ping": True,
            "pool_size": PG_POOL_SIZE,
            "max_overflow": PG_MAX_OVERFLOW,
            "pool_recycle": 1800,
            "connect_args": {"options": "-c timezone=UTC", "connect_timeout": 10},
        }
    return {"pool_pre_ping": True}


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


def _tune_postgres(engine: sqlalchemy.Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # belt and braces with the connect option: PGTZ in the client env must not leak in
        with dbapi_conn.cursor() as cur:
            cur.execute("SET TIME ZONE 'UTC'")
        dbapi_conn.commit()

    engine.dispose()


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

    With ``create=False`` a SQLite file that does not exist is an error rather than
    being created (read-only commands must not write).
    """
    url = normalize_url(url)
    if is_sqlite(url):
        path = sqlite_path(url)
        if path is not None and not path.exists() and not create:
            raise StorageError(f"storage {url}: no such database file {path}")
        if create:
            prepare_sqlite_file(url)
    try:
        with _quiet_optuna():
            storage = optuna.storages.RDBStorage(
                url, engine_kwargs=engine_kwargs(url),
                heartbeat_interval=heartbeat_interval, grace_period=grace_period,
            )
    except Exception as exc:  # noqa: BLE001 - any driver error means "unreachable"
        raise StorageError(f"storage {redact(url)}: cannot connect: {_first_line(exc)}") from None
    if is_sqlite(url):
        _tune_sqlite(storage.engine)
    elif is_postgres(url):
        _tune_postgres(storage.engine)
    return storage


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


def redact(url: str) -> str:
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001
        return url


def _first_line(exc: BaseException) -> str:
    text = str(exc.__cause__ or exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@contextlib.contextmanager
def _quiet_optuna() -> Iterator[None]:
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(level)


# ------------------------------------------------------------- claim lock

class FileLock:
    """An exclusive flock on a file beside the SQLite database (one host)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def __enter__(self) -> "FileLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class AdvisoryLock:
    """A PostgreSQL session advisory lock, shared by every host of a study."""

    def __init__(self, engine: sqlalchemy.Engine, key: str) -> None:
        self.engine = engine
        self.key = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big", signed=True)
        self._conn: Any = None

    def __enter__(self) -> "AdvisoryLock":
        self._conn = self.engine.connect()
        self._conn.exec_driver_sql(f"SELECT pg_advisory_lock({self.key})")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._conn is not None:
            try:
                self._conn.exec_driver_sql(f"SELECT pg_advisory_unlock({self.key})")
                self._conn.commit()
            finally:
                self._conn.close()
                self._conn = None


class NullLock:
    def __enter__(self) -> "NullLock":
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def claim_lock(storage: optuna.storages.RDBStorage, url: str, study_name: str) -> Any:
    """The lock under which a driver counts the budget and asks for a trial."""
    url = normalize_url(url)
    if is_sqlite(url):
        path = sqlite_path(url)
        return FileLock(path.with_name(path.name + ".lock")) if path else NullLock()
    if is_postgres(url):
        return AdvisoryLock(storage.engine, f"sweeper:{study_name}")
    return NullLock()


# ---------------------------------------------------------- artifacts

def artifact_store(location: str) -> Any:
    """FileSystemArtifactStore for a folder; Boto3ArtifactStore for ``s3://bucket/prefix``."""
    from optuna.artifacts import Boto3ArtifactStore, FileSystemArtifactStore

    if location.startswith("s3://"):
        bucket = location[len("s3://"):].split("/", 1)[0]
        return Boto3ArtifactStore(bucket)
    base = Path(location) / "artifacts"
    base.mkdir(parents=True, exist_ok=True)
    return FileSystemArtifactStore(str(base))
