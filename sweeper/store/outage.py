"""Riding out storage outages: which errors mean "the store is away for now", and the one policy every storage
call retries them through.

A PostgreSQL restart or failover, a dropped connection, a SQLite file locked past its busy timeout or a SQLite
disk I/O error are transient: the same call succeeds once the store is back. Anything else (an integrity
error, a finished trial, a bad query) is not, and is raised at once. Transient errors are retried with capped
exponential backoff and jitter for up to ``study.storage_outage_s`` seconds from the first failure of the
outage; then :class:`~sweeper.errors.StorageOutage` ends the process with one message, and a later ``sweeper
run`` resumes.

The outage is the store's, not one call's: every call and thread of a process that talks to a store shares its
:class:`OutagePolicy`, so the limit counts from the first failure, and after one give-up the rest give up at
once (a driver's shutdown must not wait out another outage per call). Waits poll the policy's stop token
(:mod:`sweeper.interrupt`, handed over by the sweep that opened the store), so Ctrl-C works while the store is
away."""
from __future__ import annotations

import contextlib
import math
import random
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import sqlalchemy

from sweeper.config.anchor import redact, sqlite_path
from sweeper.errors import StorageOutage, say
from sweeper.interrupt import NEVER, StopToken
from sweeper.store.urls import normalize_url

T = TypeVar("T")

FIRST_DELAY_S = 0.5
MAX_DELAY_S = 10.0
DEFAULT_OUTAGE_S = 300.0  # study.storage_outage_s's default, for callers without a config
# SQLite reports a lock held past the busy timeout with these, and a write that failed for now (a network
# file system's hiccup, a file made immutable mid-sweep); every other sqlite3.OperationalError (no such
# table, a syntax error, a read-only file: permanent, said at once) is a real error
SQLITE_AWAY = ("database is locked", "database table is locked", "database schema is locked",
               "database is busy", "disk i/o error")

_jitter = random.Random()  # its own generator: retries must not shift anyone's seeded draws
_registry_lock = threading.Lock()
_policies: dict[str, OutagePolicy] = {}
_last_trouble = -math.inf


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` (or what it wraps) says the store is unreachable for now.

    Optuna wraps SQLAlchemy errors in ``StorageInternalError`` (its ``_create_scoped_session``), SQLAlchemy
    wraps the driver's in ``DBAPIError``: the chain of causes is walked to the driver's own error. A
    ``PendingRollbackError`` is the aftermath of an earlier failure in the same transaction, so it is judged
    by that failure: Optuna's ``_get_trials`` catches an ``OperationalError`` (the connection died
    mid-query) to retry the query without its IN clause, and that second query raises it."""
    err: BaseException | None = exc
    for _ in range(6):
        if err is None or _transient_here(err):
            return err is not None
        err = err.__cause__ or getattr(err, "orig", None) or _aftermath_of(err)
    return False


def _aftermath_of(err: BaseException) -> BaseException | None:
    # a PendingRollbackError's context: the error being handled when the session was used again
    return err.__context__ if isinstance(err, sqlalchemy.exc.PendingRollbackError) else None


def _transient_here(err: BaseException) -> bool:
    # a timeout: the pool had no free connection in time (all checked out while the store was away)
    if isinstance(err, (sqlalchemy.exc.DisconnectionError, sqlalchemy.exc.TimeoutError)):
        return True
    if isinstance(err, sqlalchemy.exc.DBAPIError) and err.connection_invalidated:
        return True  # SQLAlchemy recognised a lost connection (closed, reset, admin shutdown)
    if isinstance(err, sqlite3.OperationalError):
        return str(err).lower().startswith(SQLITE_AWAY)
    if isinstance(err, sqlalchemy.exc.OperationalError):
        # the driver's error is checked next in the chain: sqlite3's by its message;
        # psycopg's OperationalError covers refused, reset, "terminating connection due
        # to administrator command", "the database system is starting up/shutting down"
        return not isinstance(err.orig, sqlite3.Error)
    kind = type(err).__mro__
    if any(k.__module__.split(".")[0] in ("psycopg", "psycopg2") for k in kind):
        # else by SQLSTATE, whatever class the driver maps it to: connection exceptions (08),
        # operator intervention such as a shutdown or a server still starting (57), insufficient
        # resources (53), and a serialization failure or deadlock (40001, 40P01)
        state = str(getattr(err, "sqlstate", None) or getattr(err, "pgcode", None) or "")
        return (any(k.__name__ == "OperationalError" for k in kind)
                or state[:2] in ("08", "57", "53") or state in ("40001", "40P01")
                or (any(k.__name__ == "InterfaceError" for k in kind) and "closed" in str(err).lower()))
    return isinstance(err, sqlalchemy.exc.InterfaceError) and "closed" in str(err).lower()


def for_url(url: str) -> OutagePolicy:
    """The process's policy for the store ``url`` names: one per store, shared by every storage
    object and thread that talks to it, keyed by its printable form (a SQLite file by its absolute
    path, so that one process's studies in different folders never share an outage)."""
    url = normalize_url(url)
    store = f"sqlite:///{path.resolve()}" if (path := sqlite_path(url)) is not None else redact(url)
    with _registry_lock:
        return _policies.setdefault(store, OutagePolicy(store))


def watch(url: str, stop: StopToken) -> None:
    """Waits for the store ``url`` names give up as soon as ``stop`` is requested."""
    for_url(url).stop = stop


def release(stop: StopToken) -> None:
    """No policy waits on ``stop`` any more (its sweep is over; the process may run another)."""
    with _registry_lock:
        for policy in _policies.values():
            if policy.stop is stop:
                policy.stop = NEVER


def last_trouble() -> float:
    """``time.monotonic()`` of the last transient storage error or recovery this
    process saw (``-inf`` if none): stale-trial judging restarts its clock then."""
    return _last_trouble


def _note_trouble(now: float) -> None:
    global _last_trouble
    _last_trouble = max(_last_trouble, now)


class OutagePolicy:
    """Retries transient errors of one store until ``limit_s`` after the outage began."""

    def __init__(self, store: str, limit_s: float = DEFAULT_OUTAGE_S) -> None:
        self.store, self.limit_s = store, limit_s
        self.gave_up = False
        self.stop: StopToken = NEVER  # the sweep's token: a wait for the store gives up when it is requested
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._first_error, self._episode_retries = "", 0

    def call(self, fn: Callable[[], T], *, max_delay: float = MAX_DELAY_S) -> T:
        """``fn()``, retried through transient errors; StorageOutage past the limit."""
        attempt = 0
        while True:
            try:
                result = fn()
            except Exception as exc:
                if not is_transient(exc):
                    self._recovered()  # the store answered, if only to refuse
                    raise
                delay = self._failed(exc, attempt, max_delay)
                for listener in _retry_listeners:
                    with contextlib.suppress(Exception):  # a listener must never turn a retry into a failure
                        listener()
                self.stop.wait(delay)
                attempt += 1
                continue
            self._recovered()
            return result

    def _failed(self, exc: BaseException, attempt: int, max_delay: float) -> float:
        """Record a failure; the delay before the next attempt, or StorageOutage."""
        now = time.monotonic()
        _note_trouble(now)
        with self._lock:
            if self._down_since is None:
                self._down_since, self._first_error, self._episode_retries = now, _first_line(exc), 0
                say(f"storage {self.store} is unavailable ({self._first_error}); "
                    f"retrying for up to {self.limit_s:g} s (study.storage_outage_s)")
            elapsed = now - self._down_since
            if self.gave_up or elapsed >= self.limit_s:
                self.gave_up = True
                raise StorageOutage(
                    f"storage {self.store} has been unreachable for {elapsed:.0f} s, more than "
                    f"study.storage_outage_s = {self.limit_s:g} ({self._first_error}); finished trials are "
                    "saved: run `sweeper run` again to resume once it is back") from None
            self._episode_retries += 1
            delay = min(max_delay, FIRST_DELAY_S * 2 ** min(attempt, 16)) * _jitter.uniform(0.5, 1.0)
            return max(0.05, min(delay, self._down_since + self.limit_s - now))

    def _recovered(self) -> None:
        if self._down_since is None and not self.gave_up:  # the usual case: nothing to record
            return
        now = time.monotonic()
        _note_trouble(now)
        with self._lock:
            if self._down_since is not None:
                say(f"storage {self.store} is back after {now - self._down_since:.1f} s "
                    f"({self._episode_retries} retries)")
            self._down_since, self.gave_up = None, False


_retry_listeners: list[Callable[[], None]] = []


def on_retry(listener: Callable[[], None]) -> Callable[[], None]:
    """Call ``listener`` before each wait for the store (a worker tells its driver that it lives, so that a
    trial waiting out an outage is not taken for a stalled one). Returns the call that removes it."""
    _retry_listeners.append(listener)
    return lambda: _retry_listeners.remove(listener)


def _first_line(exc: BaseException) -> str:
    inner = exc
    while (deeper := inner.__cause__ or _aftermath_of(inner)) is not None:
        inner = deeper
    lines = str(getattr(inner, "orig", None) or inner).strip().splitlines()
    return (lines[0] if lines else type(inner).__name__)[:300]
