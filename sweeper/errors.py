"""Domain errors.

``SweeperError`` and its subclasses are mistakes the user can fix (a bad study file, a missing
column, an unreachable store): the CLI prints one message and exits 2. ``TrialFailure``
subclasses end one trial, never the sweep; ``reason`` is the trial's ``fail_reason``.

Two exceptions stop things, one per boundary: :class:`StopRequested` stops a process's work (a signal, or a
worker's ``stop`` command, ends a wait or the set-up; the CLI exits 128 + the signal), and
:class:`Interrupted` stops one trial at a step boundary (recorded FAIL with ``fail_reason: interrupted``)."""

import signal
import sys
from enum import StrEnum


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


class StopRequested(KeyboardInterrupt):
    """Ctrl-C or SIGTERM (``signum``) arrived while waiting (for the claim lock, the store) or during
    set-up; the caller abandons the wait and drains. A KeyboardInterrupt, so that one ``except
    KeyboardInterrupt`` takes Python's Ctrl-C and ours alike, and ``except Exception`` lets it through."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(f"stop requested ({signal.Signals(signum).name})")
        self.signum = signum


def fp16_needs_cuda(key: str, training_on: str) -> ConfigError:
    """The one wording of the rule that fp16 (with its GradScaler) trains on CUDA only."""
    return ConfigError(f"{key}: fp16 needs a CUDA device (training on {training_on}); use bf16, fp32 or auto")


class FailReason(StrEnum):
    """A failed (or, for ``config``, pruned) trial's ``fail_reason`` user attribute."""

    CRASH = "crash"  # raised, segfaulted, or its worker exited
    NAN = "nan"  # the loss or the objective is not finite
    OOM = "oom"  # out of memory at the smallest micro-batch
    TIMEOUT = "timeout"  # killed past train.max_minutes and its grace
    STALL = "stall"  # no step and no event for study.stall_timeout
    INTERRUPTED = "interrupted"  # Ctrl-C, SIGTERM, a dead driver or host: re-run with its params
    CONFIG = "config"  # a sampled combination the model refuses: PRUNED, never retried
    DISK = "disk"  # a write found no space (ENOSPC) or no quota (EDQUOT): the sweep stops; re-run later


class StopReason(StrEnum):
    """Why a run's (or a trial's) training ended: its ``stop_reason`` user attribute."""

    EPOCHS = "epochs"  # it ran train.epochs
    EARLY_STOP = "early_stop"  # train.patience epochs without a better early_stop_metric
    PRUNED = "pruned"  # the pruner (the epoch hook) said stop
    TIME = "time"  # train.max_minutes ran out: the epoch ended and the best weights were scored
    INTERRUPTED = "interrupted"  # a failed trial's: Ctrl-C, SIGTERM, a dead driver or host


class TrialFailure(Exception):
    """A trial ended in a known failure mode; ``reason`` is its fail_reason."""

    reason = FailReason.CRASH


class NonFiniteLoss(TrialFailure):
    reason = FailReason.NAN


class OutOfMemory(TrialFailure):
    reason = FailReason.OOM


class Interrupted(TrialFailure):
    reason = FailReason.INTERRUPTED


class DiskFull(TrialFailure, OSError):
    """A write found no space left (ENOSPC) or no quota (EDQUOT): the trial fails as ``disk`` and
    the sweep starts no more."""

    reason = FailReason.DISK


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An error as one line (a log line, a warning, a stored attribute): its type and the first
    line of its message."""
    lines = f"{type(exc).__name__}: {exc}".splitlines()
    return (lines[0] if lines else type(exc).__name__)[:limit]


def say(line: str) -> None:
    """One line of sweeper's own, ``sweeper: <line>``, on stderr."""
    # stderr: the terminal for a driver, the slot log for a worker
    print(f"sweeper: {line}", file=sys.stderr, flush=True)
