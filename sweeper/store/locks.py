"""Locks shared by every driver of a study: the claim lock, and the lock that
serialises creating Optuna's tables.

SQLite studies live on one host, so a ``flock`` on a file beside the database serves; PostgreSQL studies
span hosts, so they take a session advisory lock. Neither blocks in the kernel or the server: both are tried
every ``LOCK_POLL_S`` and the wait in between looks for a stop request, so Ctrl-C and SIGTERM end a process
that waits for a lock another driver holds."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy

from sweeper.config.anchor import sqlite_path
from sweeper.errors import say
from sweeper.interrupt import NEVER, StopToken
from sweeper.store import outage
from sweeper.store.urls import is_postgres, normalize_url

LOCK_POLL_S = 0.1
LOCK_NOTICE_S = 3.0  # a claim takes milliseconds: a longer wait is worth a line


def acquire(try_once: Callable[[], bool], what: str, stop: StopToken = NEVER) -> None:
    """Call ``try_once`` until it takes the lock. Between tries: StopRequested when
    ``stop`` was requested (a signal's own StopRequested passes through as raised)."""
    started, told = time.monotonic(), False
    while not try_once():
        if not told and time.monotonic() - started >= LOCK_NOTICE_S:
            say(f"waiting for {what}, held by another sweeper process")
            told = True
        stop.wait(LOCK_POLL_S)


class FileLock:
    """An exclusive flock on a file beside the SQLite database (one host)."""

    def __init__(self, path: Path, stop: StopToken = NEVER) -> None:
        self.path, self.stop = path, stop
        self._fd: int | None = None

    def __enter__(self) -> FileLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            acquire(lambda: _try_flock(fd), f"the lock file {self.path}", self.stop)
        except BaseException:
            os.close(fd)  # closing the descriptor drops the lock if the last try did take it
            raise
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def advisory_key(name: str) -> int:
    """A stable signed 64-bit key for ``pg_advisory_lock`` (scoped to the database)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


class AdvisoryLock:
    """A PostgreSQL session advisory lock, shared by every host of a study.

    Held on its own autocommit connection, so that the session sits idle rather than idle in a transaction;
    if the holder dies the server ends the session (socket closed, or keepalives unanswered) and the lock is
    released. A server restart ends the session too: the lost connection is invalidated, never reused, and
    the next ``with`` takes the lock afresh. Tries that fail because the server is away are retried through
    the store's outage policy."""

    def __init__(self, engine: sqlalchemy.Engine, key: str, policy: outage.OutagePolicy,
                 stop: StopToken = NEVER) -> None:
        self.engine, self.stop, self.policy = engine, stop, policy
        self.name, self.key = key, advisory_key(key)
        self._conn: Any = None
        self._pending: Any = None  # the connection of a try in flight

    def __enter__(self) -> AdvisoryLock:
        try:
            acquire(lambda: self.policy.call(self._try), f"the claim lock {self.name!r}", self.stop)
        except BaseException:
            self._drop_pending()
            raise
        return self

    def _try(self) -> bool:
        self._drop_pending()
        self._pending = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        if not self._pending.exec_driver_sql(f"SELECT pg_try_advisory_lock({self.key})").scalar():
            self._pending.close()
            self._pending = None
            return False
        self._conn, self._pending = self._pending, None
        return True

    def _drop_pending(self) -> None:
        """A try cut short (an error, Ctrl-C) may hold the lock: end its session."""
        conn, self._pending = self._pending, None
        if conn is not None:
            conn.invalidate()
            conn.close()

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        if self._conn is None:
            return
        conn, self._conn = self._conn, None
        try:
            conn.exec_driver_sql(f"SELECT pg_advisory_unlock({self.key})")
        except Exception as err:
            conn.invalidate()  # closing the session releases the lock
            # lost with the connection (a server restart): the server already released it
            if exc_type is None and not outage.is_transient(err):
                raise
        finally:
            conn.close()


class NullLock(contextlib.nullcontext[None]):
    """No lock: an in-memory SQLite store, or a database other than SQLite and PostgreSQL."""


ClaimLock = FileLock | AdvisoryLock | NullLock


def claim_lock(storage: optuna.storages.RDBStorage, url: str, study_name: str,
               stop: StopToken = NEVER) -> ClaimLock:
    """The lock under which a driver counts the budget and asks for a trial; a wait for it
    gives up when ``stop`` is requested."""
    url = normalize_url(url)
    if (path := sqlite_path(url)) is not None:
        return FileLock(path.with_name(path.name + ".lock"), stop)
    if is_postgres(url):
        return AdvisoryLock(storage.engine, f"sweeper:{study_name}", policy=outage.for_url(url), stop=stop)
    return NullLock()
