"""The baseline's states, in one home: the study user attribute ``baseline_state``, the one claim
rule, the transitions, and the exit codes of ``python -m sweeper.baseline.job``.

``baseline_state`` is ``{state, host, driver, at[, error]}`` (``at``: UTC, ISO 8601 to the second;
``error`` on ``failed`` and ``interrupted``; ``running`` adds the ``pid`` and ``pid_ns`` that run it).
The states and who moves between them::

    (none) | interrupted ──claim──► running ──► done          the job, when its fit is recorded
                                        │ ├──► failed        the job (its error), or the sweep for a
                                        │ │                  job that died without a word
                                        │ └──► interrupted   the sweep: Ctrl-C, or the store away
    any ──compute──► running                                 ``sweeper baseline``: asked for by name

The one claim rule (:data:`CLAIMABLE`, :func:`claim`): a sweep takes the study's baseline only when the
study has none yet, the last one was interrupted, or its driver died without a word (``kill -9``, out of
memory: a running one whose pid this host sees gone), under the claim lock, so of two drivers that ask at once
one gets it and a resume never computes a done (or failed) one again. The sweep settles only its own run
(:func:`settle`): a state another driver or the job itself wrote since is left as it is."""

import datetime as dt
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Any

import optuna

from sweeper.store.identity import Identity
from sweeper.store.locks import ClaimLock

ATTR = "baseline_state"  # the study user attribute (status, best and the report read it by name)


class State(StrEnum):
    """A baseline's state, as stored (the values are the stored words)."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    INTERRUPTED = "interrupted"  # no fault of the baseline's (Ctrl-C, the store away)


# A later sweep may claim these again: an interrupted run says nothing about the baseline. A done
# one is kept; a failed one would fail again on the same config (``sweeper baseline`` reruns it).
CLAIMABLE = frozenset({State.INTERRUPTED})


class ExitCode(IntEnum):
    """The exit codes of ``python -m sweeper.baseline.job``, which the sweep reads."""

    DONE = 0  # recorded done by the job
    FAILED = 1  # recorded failed, with its error, by the job
    STORE_AWAY = 75  # EX_TEMPFAIL: the job could not reach the store; the sweep records it interrupted


STOPPED = "the sweep stopped before the baseline ended"  # the error of a run a sweep's Ctrl-C ends


def read(study: optuna.Study) -> dict[str, Any] | None:
    """The stored ``baseline_state``; None when no baseline was ever started."""
    return stored if isinstance(stored := study.user_attrs.get(ATTR), dict) else None


def claimable(stored: dict[str, Any] | None, ident: Identity | None = None) -> bool:
    """The one claim rule: no baseline yet, one in a :data:`CLAIMABLE` state, or one whose driver is
    gone (as ``ident`` sees it) while it says ``running``."""
    if stored is None or stored.get("state") in CLAIMABLE:
        return True
    return ident is not None and stored.get("state") == State.RUNNING and ident.sees_dead(
        stored.get("host"), stored.get("pid"), stored.get("pid_ns"))


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def mark(study: optuna.Study, state: State, host: str, driver: str, error: str | None = None,
         **who: Any) -> None:
    """Record ``state``, stamped now, whatever was stored: the job's transitions, ``sweeper baseline``'s."""
    stored = {"state": str(state), "host": host, "driver": driver, "at": _now(), **who}
    study.set_user_attr(ATTR, stored if error is None else {**stored, "error": error})


def claim(study: optuna.Study, lock: ClaimLock, ident: Identity) -> bool:
    """Take the baseline run under the claim lock: True, with ``running`` written, when the rule allows it."""
    with lock:
        if not claimable(read(study), ident):
            return False
        mark(study, State.RUNNING, ident.host, ident.driver_id, pid=ident.pid, pid_ns=ident.pid_ns)
        return True


def settle(study: optuna.Study, state: State, host: str, driver: str, error: str) -> bool:
    """The sweep ends its own run as ``state``: only while the stored state is ``running`` by ``driver``
    (the job may have recorded its end first, or another driver claimed it). True when recorded."""
    if (now := read(study) or {}).get("state") != State.RUNNING or now.get("driver") != driver:
        return False
    mark(study, state, host, driver, error)
    return True


def after_exit(code: int, log: Path) -> tuple[State, str] | None:
    """What the sweep records for a job that exited with ``code`` (``log``: its output), through
    :func:`settle`: nothing when it was done; interrupted when the store was away (the next sweep
    may claim it again); failed otherwise (a job that recorded its failure itself is settled)."""
    if code == ExitCode.DONE:
        return None
    if code == ExitCode.STORE_AWAY:
        return State.INTERRUPTED, f"the study's storage was away; see {log}"
    return State.FAILED, f"the baseline job exited with code {code}; see {log}"
