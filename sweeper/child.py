"""What every child of the driver does first, whichever way it started (:mod:`sweeper.launch`):

- its own session and process group, so that the driver's ``killpg`` reaches it and a terminal's
  Ctrl-C only the driver (a fresh interpreter has them from Popen, before it runs a line);
- death with its parent, so that no orphan keeps holding a GPU;
- its stdout set aside for its answers (:func:`answers`) and pointed at stderr, its log, so that
  nothing it prints (a model, a C library) lands among them."""

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from typing import TextIO

# what a child may be: the module whose main() it runs, as `python -m MODULE ARGV` would
JOBS = {"worker": "sweeper.worker.main", "baseline": "sweeper.baseline.job", "check": "sweeper.models.check",
        "summary": "sweeper.study.summary"}
DRIVER_PID = "SWEEPER_DRIVER_PID"  # in every child's environment (sweeper.launch)
PR_SET_PDEATHSIG = 1
_answers: TextIO | None = None


def main(job: Callable[[], int | None]) -> int:
    """A fresh interpreter's child (``python -m MODULE``): its parent is the driver."""
    set_up()
    return run(job)


def set_up(parent: int | None = None) -> None:
    """Its own session, Ctrl-C left to the driver, and death with ``parent`` (by default the
    driver, :data:`DRIVER_PID`; a fork's is the server)."""
    if os.getpgrp() != os.getpid():  # a group leader (Popen's new session, a shell's job) has one
        os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # prctl(PR_SET_PDEATHSIG, SIGKILL), which covers only a parent that dies after the call: so the
    # parent is checked afterwards, and the driver where the parent is the fork server
    try:
        # the running interpreter's own symbols include libc's, whatever its file is called
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: no parent-death signal
        print("sweeper: no parent-death signal on this platform", file=sys.stderr, flush=True)
    driver = int(os.environ.get(DRIVER_PID) or 0)
    parent = parent or driver
    orphan = bool(parent) and os.getppid() != parent
    if orphan or (driver not in (0, parent) and not os.path.exists(f"/proc/{driver}")):
        print(f"sweeper: the driver (pid {driver}) is gone; exiting", file=sys.stderr, flush=True)
        os._exit(1)


def run(job: Callable[[], int | None]) -> int:
    """``job`` (a child's main) behind the stdout prologue; its exit code."""
    global _answers
    _answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return code if isinstance(code := job(), int) else 0


def answers() -> TextIO:
    """The child's own stdout, set aside by :func:`run`: the one stream its answers go to."""
    assert _answers is not None, "not a child: sweeper.child.run sets its answers aside"
    return _answers

