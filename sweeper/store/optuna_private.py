"""Every private Optuna API sweeper uses, in one place, each with the reason.

Optuna 5 has no public way to do these; ``pyproject.toml`` bounds ``optuna``
below 6 so that a release that moves them cannot break a sweep silently. A new
use of a private name belongs here, with its reason, not at the call site."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

import optuna
import sqlalchemy
from optuna.trial import FrozenTrial, TrialState

if TYPE_CHECKING:
    from optuna.storages._heartbeat import BaseHeartbeat

    class HeartbeatStorage(optuna.storages.BaseStorage, BaseHeartbeat):
        """Optuna's storage API with its heartbeat API: an RDBStorage is one, and so is the
        _CachedStorage a Study puts in front of it (Optuna types ``Study._storage`` as the first)."""

# RDBStorage methods that Optuna's _CachedStorage (the cache a Study puts in front of an
# RDBStorage) calls directly, bypassing the public ones. sweeper's storage routes every
# call through its outage policy and tells SQLite whether the call writes, so it must
# wrap these too. ``_get_stale_trial_ids`` is Optuna's stale check (fail_stale_trials).
CACHED_STORAGE_READS = frozenset({"_get_trials", "_get_best_trial_id"})
CACHED_STORAGE_WRITES = frozenset({"_create_new_trial", "_set_trial_param", "_get_stale_trial_ids"})


def backend(study: optuna.Study) -> HeartbeatStorage:
    """The storage a study writes through. Optuna has no public accessor, and sweeper must write user attrs
    and states of trials it does not hold an ``optuna.Trial`` for (a worker's trial, failed by the driver)."""
    # a sweeper study's storage is always an RDBStorage (open_storage), behind Optuna's cache
    return cast("HeartbeatStorage", study._storage)


def study_id(study: optuna.Study) -> int:
    """The study's row id (``Study._study_id``): the storage API is keyed by it."""
    return study._study_id


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    """A trial's row id. ``FrozenTrial._trial_id`` and ``Trial._trial_id`` are private;
    resolving it publicly costs a query per call (number -> id) on every event."""
    return trial._trial_id


def stale_trial_ids(storage: HeartbeatStorage, study_id: int) -> list[int]:
    """RUNNING trials whose heartbeat is older than the grace period.

    The public ``optuna.storages.fail_stale_trials`` fails them at once, before a
    ``fail_reason`` can be written (Optuna refuses user attrs on finished trials)."""
    return storage._get_stale_trial_ids(study_id)


def heartbeat_ages(storage: optuna.storages.BaseStorage, study_id: int) -> dict[int, float | None]:
    """Seconds since each RUNNING trial's last heartbeat (trial id -> age; None: it has no heartbeat
    row at all), by the database's clock, which stamps the beats and which Optuna's stale check
    reads; ``status`` shows them.

    Optuna has no public reader of heartbeats; its ORM models are the only way to ask."""
    from optuna.storages._rdb import models

    rdb: Any = getattr(storage, "_backend", storage)  # a study wraps its RDBStorage in a cache
    trials, beats = models.TrialModel.__table__, models.TrialHeartbeatModel.__table__
    query = (sqlalchemy.select(trials.c.trial_id, beats.c.heartbeat)
             .outerjoin(beats, beats.c.trial_id == trials.c.trial_id)
             .where(trials.c.study_id == study_id, trials.c.state == TrialState.RUNNING))
    with rdb.engine.connect() as conn:
        now = conn.execute(sqlalchemy.select(sqlalchemy.func.now())).scalar_one().replace(tzinfo=None)
        return {trial: None if beat is None else (now - beat.replace(tzinfo=None)).total_seconds()
                for trial, beat in conn.execute(query)}


def quiet_trials_query_fallback() -> None:
    """Silence the warning RDBStorage._get_trials logs (the whole failed SQL, then "Falling back to a slower
    alternative") when its trials query fails and it queries again. In a sweep that failure is nearly always a
    connection lost in a store outage, which the outage policy already reports in one line and retries; the
    dump would bury that line. The logger is named after Optuna's private module, hence here."""
    logging.getLogger("optuna.storages._rdb.storage").addFilter(
        lambda record: not record.getMessage().startswith("Caught an error from sqlalchemy"))
