"""The Optuna storage engine: an RDBStorage tuned for many writers, whose calls ride out storage outages.

Optuna sets no SQLite pragmas, and a deferred SQLite transaction that reads and then writes fails at once
with "database is locked" when another process wrote in between (WAL's BUSY_SNAPSHOT skips the busy
handler). So every connection gets WAL and a busy timeout, and every transaction that writes starts with
BEGIN IMMEDIATE, which waits for the write lock instead of failing. A change of a trial's state (a tell)
commits with ``synchronous=FULL``, so a told trial, and everything written before it, survives a power loss.
Transactions that only read begin deferred: under WAL they never wait for a writer, so the dashboard and
``sweeper status`` do not queue behind a sweep. :class:`SweeperStorage` knows which is which by the Optuna
method it runs. PostgreSQL gets small pools, pre-ping, TCP keepalives and sessions pinned to UTC, because
Optuna's heartbeat column has no time zone. Creating Optuna's tables is serialised (an advisory lock on
PostgreSQL, a file lock on SQLite) because RDBStorage's constructor races with itself on a fresh database."""

import contextlib
import sqlite3
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from optuna.storages import RDBStorage
from optuna.trial import TrialState
from sqlalchemy import event

from sweeper.atomic import unwritable
from sweeper.config.anchor import redact, sqlite_path
from sweeper.devices import fake
from sweeper.errors import StorageError, StorageOutage
from sweeper.store import optuna_private as private
from sweeper.store import outage
from sweeper.store.identity import host_id
from sweeper.store.locks import FileLock, acquire, advisory_key
from sweeper.store.urls import is_postgres, is_sqlite, normalize_url

SQLITE_BUSY_TIMEOUT_S = 60.0  # the outage tests shorten it through sweeper.devices.fake
# A driver uses two connections (its sessions and the claim lock), a worker two
# (its sessions and the heartbeat thread): docs/scale-out.md has the arithmetic.
PG_POOL_SIZE = 2
PG_MAX_OVERFLOW = 1
# The server drops a silent client after idle + interval * count seconds, which
# also frees an advisory lock held by a host that vanished from the network.
PG_KEEPALIVE = {"idle": 30, "interval": 10, "count": 3}
SCHEMA_LOCK = "sweeper:schema"
NO_TABLES = ("the database holds no sweeper study (no Optuna tables): create one with `sweeper db init` "
             "or `sweeper run`")

# sweeper records heartbeats for ask/tell trials itself (Optuna only does inside
# Study.optimize), so these warnings say nothing useful to a user
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
private.quiet_trials_query_fallback()


def sqlite_busy_timeout_s() -> float:
    """How long a SQLite write waits for the lock before "database is locked" (read per connection)."""
    return fake.sqlite_busy_timeout_s(SQLITE_BUSY_TIMEOUT_S)


def engine_kwargs(url: str) -> dict[str, Any]:
    if is_sqlite(url):
        return {"connect_args": {"timeout": sqlite_busy_timeout_s()}}
    if is_postgres(url):
        return {"pool_pre_ping": True, "pool_size": PG_POOL_SIZE, "max_overflow": PG_MAX_OVERFLOW,
                "pool_recycle": 1800, "connect_args": pg_connect_args()}
    return {"pool_pre_ping": True}


def pg_connect_args() -> dict[str, Any]:
    """libpq settings: fail fast when the server is unreachable, notice a dead one,
    and name the host in ``pg_stat_activity``."""
    return {"connect_timeout": 10, "application_name": f"sweeper@{host_id()}"[:63], "keepalives": 1,
            **{f"keepalives_{k}": v for k, v in PG_KEEPALIVE.items()}}


def _tune_sqlite(engine: sqlalchemy.Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # autocommit at the driver level, so that the "begin" hook below owns BEGIN
        dbapi_conn.isolation_level = None
        dbapi_conn.execute(f"PRAGMA busy_timeout = {int(sqlite_busy_timeout_s() * 1000)}")
        dbapi_conn.execute("PRAGMA synchronous = FULL")

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Only a call known to read begins deferred; anything else (Optuna's own set-up,
        # a raw query) keeps the safe IMMEDIATE. Only a change of a trial's state (a tell)
        # syncs the WAL at its commit (FULL): that fsync (about 6 ms here) also makes every
        # earlier write of any process durable, since they precede it in the same log, and a
        # trial writes some 40 transactions, which FULL on each would cost 0.25 s a trial.
        mode = getattr(_txn, "mode", None)
        sync = "NORMAL" if mode in (READ, WRITE) else "FULL"
        if conn.info.get("synchronous") != sync:
            conn.exec_driver_sql(f"PRAGMA synchronous = {sync}")
            conn.info["synchronous"] = sync
        conn.exec_driver_sql("BEGIN" if mode == READ else "BEGIN IMMEDIATE")


PG_SESSION_SETTINGS = (
    # A startup option ("-c timezone=UTC") is not enough: libpq sends PGTZ as a
    # startup parameter too, and the server applies it last.
    "SET TIME ZONE 'UTC'", *(f"SET tcp_keepalives_{k} = {v}" for k, v in PG_KEEPALIVE.items()))


def _tune_postgres(engine: sqlalchemy.Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        with dbapi_conn.cursor() as cur:
            for statement in PG_SESSION_SETTINGS:
                cur.execute(statement)
        dbapi_conn.commit()


# What the storage call running on this thread does (READ, WRITE or DURABLE), for the "begin" hook
_txn = threading.local()
READ, WRITE, DURABLE = "read", "write", "durable"

# Optuna's storage methods by whether their transaction writes (the private ones, with
# their reason, live in sweeper.store.optuna_private).
READS = frozenset({"get_study_id_from_name", "get_study_name_from_id", "get_study_directions",
                   "get_study_user_attrs", "get_study_system_attrs", "get_all_studies",
                   "get_trial_id_from_study_id_trial_number", "get_trial_number_from_id", "get_trial_param",
                   "get_trial", "get_all_trials", "get_n_trials", "get_best_trial", "get_trial_params",
                   "get_trial_user_attrs", "get_trial_system_attrs"}) | private.CACHED_STORAGE_READS
WRITES = frozenset({
    "create_new_study", "delete_study", "set_study_user_attr", "set_study_system_attr", "create_new_trial",
    "set_trial_param", "set_trial_intermediate_value", "set_trial_user_attr", "set_trial_system_attr",
    # (the stale check, _get_stale_trial_ids, reads but counts as a write on purpose: while
    # a writer holds SQLite's lock no heartbeat can land, so the check must not see trials
    # stale then; it waits, or fails as an outage, until the store takes writes again)
}) | private.CACHED_STORAGE_WRITES  # record_heartbeat and set_trial_state_values are defined below


class SweeperStorage(RDBStorage):
    """Optuna's RDBStorage whose every call rides out outages through the store's
    :class:`~sweeper.store.outage.OutagePolicy`, and tells the SQLite "begin" hook whether it only reads
    (deferred), writes (IMMEDIATE) or changes a trial's state (IMMEDIATE, synced to disk at commit).

    A retried write whose first attempt did commit (the connection dropped before the reply) is harmless for
    upserts; a finished trial told again is recognised in :meth:`set_trial_state_values`. A trial created
    twice by ``ask`` in an outage is left RUNNING without a heartbeat; the stale check fails and re-queues it.
    """

    outage_policy: outage.OutagePolicy | None = None

    def _through(self, mode: str, fn: Callable[[], Any], max_delay: float = outage.MAX_DELAY_S) -> Any:
        outer = getattr(_txn, "mode", None), getattr(_txn, "depth", 0)
        _txn.mode, _txn.depth = mode, outer[1] + 1
        try:
            # nested (get_best_trial -> get_trial): the outermost call retries
            policy = None if outer[1] else self.outage_policy
            return fn() if policy is None else policy.call(fn, max_delay=max_delay)
        finally:
            _txn.mode, _txn.depth = outer

    def record_heartbeat(self, trial_id: int) -> None:
        # retried at least once an interval: a live trial's beat is back within one
        # interval of the store's return, well inside the stale check's wait
        cap = min(outage.MAX_DELAY_S, float(self.heartbeat_interval or outage.MAX_DELAY_S))
        self._through(WRITE, lambda: RDBStorage.record_heartbeat(self, trial_id), max_delay=cap)

    def set_trial_state_values(self, trial_id: int, state: TrialState,
                               values: Sequence[float] | None = None) -> bool:
        tries: list[None] = []

        def attempt() -> bool:
            tries.append(None)
            try:
                return RDBStorage.set_trial_state_values(self, trial_id, state, values)
            except optuna.exceptions.UpdateFinishedTrialError:
                # a retry refused because the trial is finished: if it is finished the way
                # this call asked, the attempt that seemed lost did commit
                stored = RDBStorage.get_trial(self, trial_id) if len(tries) > 1 else None
                if (stored is not None and stored.state == state
                        and (values is None or stored.values == [float(v) for v in values])):
                    return True
                raise
        return self._through(DURABLE, attempt)


def _routed(name: str, mode: str) -> Callable[..., Any]:
    base = getattr(RDBStorage, name)

    def method(self: SweeperStorage, *args: Any, **kwargs: Any) -> Any:
        return self._through(mode, lambda: base(self, *args, **kwargs))
    method.__name__, method.__qualname__, method.__doc__ = name, f"SweeperStorage.{name}", base.__doc__
    return method


for _name in READS | WRITES:
    setattr(SweeperStorage, _name, _routed(_name, WRITE if _name in WRITES else READ))


def open_storage(url: str, *, heartbeat_interval: int | None = None, grace_period: int | None = None,
                 create: bool = True, outage_s: float | None = None, checked: bool = False) -> SweeperStorage:
    """A :class:`SweeperStorage` for ``url``; raises StorageError when it cannot be reached.

    With ``create=False`` a database without Optuna's tables (or a missing SQLite file) is an error rather
    than being created: read-only commands must not write. ``outage_s`` (``study.storage_outage_s``): how
    long calls ride out an outage of this store (None: the store's current limit). ``checked=True``: the
    driver that started this process checked the schema's version against this Optuna, so it is not checked
    again (RDBStorage's check reads alembic's migration scripts: about 0.2 s of every worker's start), and a
    store away now is an outage to ride out (a worker that exits before it is ready is counted broken)."""
    url = normalize_url(url)
    if (path := sqlite_path(url)) is not None and not path.exists() and not create:
        raise StorageError(f"storage {url}: no such database file {path}")
    if create and path is not None:
        _make_sqlite(url, path)

    def connect() -> SweeperStorage:
        with quiet_optuna(), schema_guard(url, create) as ready:
            return SweeperStorage(url, engine_kwargs=engine_kwargs(url), skip_table_creation=ready,
                                  skip_compatibility_check=checked and ready,
                                  heartbeat_interval=heartbeat_interval, grace_period=grace_period)

    policy = outage.for_url(url)
    policy.limit_s = policy.limit_s if outage_s is None else outage_s
    try:
        storage = policy.call(connect) if checked else connect()
    except (StorageError, StorageOutage):
        raise
    except Exception as exc:  # noqa: BLE001 - any driver error means "unreachable"
        raise StorageError(f"storage {redact(url)}: cannot connect: {_first_line(exc)}") from None
    if is_sqlite(url):
        _tune_sqlite(storage.engine)
    elif is_postgres(url):
        _tune_postgres(storage.engine)
    storage.engine.dispose()  # connections opened before the hooks existed are not tuned: drop them
    storage.outage_policy = policy
    return storage


@contextlib.contextmanager
def schema_guard(url: str, create: bool) -> Iterator[bool]:
    """Yields whether Optuna's schema is complete; while it is not, holds a lock
    across processes and hosts so that one RDBStorage at a time creates it.

    RDBStorage's constructor runs create_all, inserts the version row and stamps
    alembic, each in its own transaction: on a fresh PostgreSQL database several
    hosts starting together fail with duplicate keys or deadlock."""
    if is_postgres(url):
        with _pg_schema_guard(url, create) as ready:
            yield ready
        return
    if (path := sqlite_path(url)) is None:
        yield False
        return
    if not create:
        # never create_all outside the lock: it would race with a driver creating the tables
        if not _sqlite_schema_ready(path):
            raise StorageError(f"storage {url}: {NO_TABLES}")
        yield True
        return
    # the store's stop token: a worker told to stop (or a sweep's Ctrl-C) stops waiting for it
    with FileLock(path.with_name(path.name + ".lock"), outage.for_url(url).stop):
        yield _sqlite_schema_ready(path)


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
                raise StorageError(f"storage {redact(url)}: {NO_TABLES}")
            key = advisory_key(SCHEMA_LOCK)
            acquire(lambda: bool(conn.exec_driver_sql(f"SELECT pg_try_advisory_lock({key})").scalar()),
                    "the lock that guards creating the tables", outage.for_url(url).stop)
            try:
                yield _pg_schema_ready(conn)  # another host may have finished while we waited
            finally:
                conn.exec_driver_sql(f"SELECT pg_advisory_unlock({key})")
    finally:
        engine.dispose()


def _sqlite_schema_ready(path: Path) -> bool:
    """True once the last step of Optuna's set-up (the alembic stamp) is done (read-only)."""
    stamp = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'"
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True,
                                            timeout=sqlite_busy_timeout_s())) as conn:
        return (bool(conn.execute(stamp).fetchall())
                and conn.execute("SELECT count(*) FROM alembic_version").fetchone()[0] > 0)


def _pg_schema_ready(conn: sqlalchemy.Connection) -> bool:
    """True once the last step of Optuna's set-up (the alembic stamp) is done."""
    return (conn.exec_driver_sql("SELECT to_regclass('alembic_version') IS NOT NULL").scalar() is True
            and (conn.exec_driver_sql("SELECT count(*) FROM alembic_version").scalar() or 0) > 0)


def _make_sqlite(url: str, path: Path) -> None:
    """The database's folder, and the file in WAL (persistent) before Optuna opens it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.closing(sqlite3.connect(path, timeout=sqlite_busy_timeout_s())) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
    except (OSError, sqlite3.Error) as exc:  # a file where its folder should be, no permission
        raise StorageError(f"storage {url}: cannot make the database {path} ({exc})") from None


def check_reachable(url: str) -> None:
    """Connect without creating anything (``sweeper validate`` and pre-flight checks)."""
    url = normalize_url(url)
    if is_sqlite(url):
        if (path := sqlite_path(url)) is not None and path.exists():
            try:
                with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
                    db.execute("SELECT name FROM sqlite_master LIMIT 1").fetchall()
            except sqlite3.DatabaseError as exc:
                raise StorageError(f"storage {url}: {path} is not a SQLite database ({exc})") from None
        elif path is not None and (why := unwritable(path.parent)) is not None:  # tried: root passes access()
            raise StorageError(f"storage {url}: cannot create {path} ({why})")
        return
    try:
        engine = sqlalchemy.create_engine(url, **engine_kwargs(url))
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        engine.dispose()
    except Exception as exc:  # noqa: BLE001
        raise StorageError(f"storage {redact(url)}: cannot connect: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    return text[0] if (text := str(exc.__cause__ or exc).strip().splitlines()) else type(exc).__name__


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(level)
