"""Locks shared by every driver of a study: the claim lock, and the lock that
serialises creating Optuna's tables.

SQLite studies live on one host, so a ``flock`` on a file beside the database
serves; PostgreSQL studies span hosts, so they take a session advisory lock.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy

from sweeper.store.urls import is_postgres, is_sqlite, normalize_url, sqlite_path


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


def advisory_key(name: str) -> int:
    """A stable signed 64-bit key for ``pg_advisory_lock`` (scoped to the database)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


class AdvisoryLock:
    """A PostgreSQL session advisory lock, shared by every host of a study.

    Held on its own autocommit connection, so that the session sits idle rather
    than idle in a transaction; if the holder dies the server ends the session
    (socket closed, or keepalives unanswered) and the lock is released.
    """

    def __init__(self, engine: sqlalchemy.Engine, key: str) -> None:
        self.engine = engine
        self.key = advisory_key(key)
        self._conn: Any = None

    def __enter__(self) -> "AdvisoryLock":
        conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            conn.exec_driver_sql(f"SELECT pg_advisory_lock({self.key})")
        except BaseException:
            conn.invalidate()  # a lock request cut short may still be granted: never reuse it
            conn.close()
            raise
        self._conn = conn
        return self

    def __exit__(self, *exc: object) -> None:
        if self._conn is None:
            return
        conn, self._conn = self._conn, None
        try:
            conn.exec_driver_sql(f"SELECT pg_advisory_unlock({self.key})")
        except BaseException:
            conn.invalidate()  # closing the session releases the lock
            raise
        finally:
            conn.close()


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
