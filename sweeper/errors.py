"""Domain errors.

``SweeperError`` and its subclasses are mistakes the user can fix (a bad study
file, a missing column, an unreachable store). The CLI maps them to one message
and exit code 2. ``TrialFailure`` subclasses end one trial, never the sweep;
``reason`` is the ``fail_reason`` user attribute the driver stores.
"""
from __future__ import annotations


class SweeperError(Exception):
    """A user-facing error: one clear message, exit code 2, no traceback."""


class ConfigError(SweeperError):
    """The study file or a ``--set`` override is invalid."""


class DataError(SweeperError):
    """The data file is missing, unreadable or violates the panel contract."""


class StorageError(SweeperError):
    """The Optuna storage cannot be reached or holds something unexpected."""


class DeviceError(SweeperError):
    """A requested GPU does not exist or cannot be used."""


class StudyNotFound(SweeperError):
    """``resume``/``status``/... named a study that the storage does not hold."""


class ConfigDrift(SweeperError):
    """The study file differs from the config the study was created with."""


class StorageOutage(Exception):
    """The store stayed unreachable past ``study.storage_outage_s``: one message,
    exit code 1 (not a user mistake, and a later ``sweeper run`` resumes)."""


class StopRequested(Exception):
    """Ctrl-C or SIGTERM arrived while waiting (for the claim lock, the store);
    the caller abandons the wait and drains."""


class TrialFailure(Exception):
    """A trial ended in a known failure mode; ``reason`` is its fail_reason."""

    reason = "crash"


class NonFiniteLoss(TrialFailure):
    reason = "nan"


class OutOfMemory(TrialFailure):
    reason = "oom"


class TrialTimeout(TrialFailure):
    reason = "timeout"


class Interrupted(TrialFailure):
    reason = "interrupted"
