"""The store: Optuna storage engines and their tuning, the locks drivers share,
the artifact store, and the run folder's layout.

- :mod:`~sweeper.store.urls`: what a storage URL names, and its printable form;
- :mod:`~sweeper.store.engine`: an RDBStorage tuned for SQLite and PostgreSQL;
- :mod:`~sweeper.store.outage`: which errors are transient, and the policy that rides them out;
- :mod:`~sweeper.store.locks`: the claim lock (flock or advisory lock), tried until a stop request;
- :mod:`~sweeper.store.artifacts`: Optuna's artifact store (folder or S3);
- :mod:`~sweeper.store.layout`: ``runs/<study>/trials/<n>/...``;
- :mod:`~sweeper.store.trial_folder`: a trial's folder: everything that copies, moves or removes its
  files (plain cells, no run grid);
- :mod:`~sweeper.store.identity`: who runs a trial (host, driver, run) and whether it is alive;
- :mod:`~sweeper.store.run_folder`: a run folder holds one study's files (``owner.json``);
- :mod:`~sweeper.store.studies`: opening an existing study, its best trial;
- :mod:`~sweeper.store.optuna_private`: the private Optuna APIs sweeper needs, with reasons."""

from sweeper.config.anchor import redact
from sweeper.store.artifacts import artifact_store, check_artifacts
from sweeper.store.engine import PG_MAX_OVERFLOW, PG_POOL_SIZE, SweeperStorage, open_storage, quiet_optuna
from sweeper.store.locks import AdvisoryLock, FileLock, NullLock, advisory_key, claim_lock
from sweeper.store.urls import normalize_url

__all__ = ["PG_MAX_OVERFLOW", "PG_POOL_SIZE", "AdvisoryLock", "FileLock", "NullLock", "SweeperStorage",
           "advisory_key", "artifact_store", "check_artifacts", "claim_lock",
           "normalize_url", "open_storage", "quiet_optuna", "redact"]
