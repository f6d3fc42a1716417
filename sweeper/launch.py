"""How the driver starts a child, every kind (:data:`sweeper.child.JOBS`) alike, chosen in
:func:`start`: the worker fork server (:class:`sweeper.dispatch.forkserver.ForkServer`: ready in
about 0.1 s) while it lives, else a fresh interpreter (seconds of imports).
The child's side is :mod:`sweeper.child`; this is the parent's, which a worker never loads."""

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import IO, Protocol

from sweeper.child import DRIVER_PID, JOBS

SPAWN_WAIT_S = 120.0  # for the fork server's answers: a worker's pid comes after its preload (~5 s)


class Child(Protocol):
    """What the driver uses of a child: a ``subprocess.Popen``, or a ForkedProc standing in for one."""

    stdin: IO[bytes] | None
    stdout: IO[bytes] | None
    returncode: int | None

    @property
    def pid(self) -> int: ...  # and its process group's (sweeper.child)

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class Launcher(Protocol):
    def spawn(self, job: str, argv: list[str], env: dict[str, str], out: int, err: int) -> Child | None:
        """``job`` started, its stdin a pipe, its stdout ``out``, its stderr ``err``; None where it cannot."""


def start(job: str, argv: list[str], env: Mapping[str, str], *, out: int | None = None, err: int,
          server: Launcher | None = None) -> Child:
    """``job`` started by the one choice: forked by ``server`` while it lives, else fresh; its
    stdout ``out`` or, where None, a pipe back (``Child.stdout``). Every child's environment has
    unbuffered output and the driver's pid, which it dies with."""
    env = {**env, "PYTHONUNBUFFERED": "1", DRIVER_PID: str(os.getpid())}
    back, theirs = os.pipe() if out is None else (None, out)
    forked = server.spawn(job, argv, env, theirs, err) if server is not None else None
    # else a fresh `python -m MODULE ARGV`, in its own session before it runs a line of ours: a
    # killpg at once cannot miss it
    child = forked or subprocess.Popen([sys.executable, "-m", JOBS[job], *argv], stdin=subprocess.PIPE,
                                       stdout=theirs, stderr=err, env=env, start_new_session=True)
    if back is not None:
        os.close(theirs)  # the child holds its own copy now
        child.stdout = os.fdopen(back, "rb", buffering=0)
    return child


def run(job: str, request: str, timeout: float, *, grace: float = 0.0,
        server: Launcher | None = None) -> tuple[str, int | None]:
    """Run ``job`` to its end as ``subprocess.run(input=request, capture_output=True)`` would, in
    this process's environment and folder: (its stdout; its exit code, or None when it ran past
    ``timeout`` and was killed, :func:`kill`). A fork the server never made starts again, fresh."""
    with open(os.devnull, "wb") as null:  # the child holds its own copy once started
        child = start(job, [], os.environ, err=null.fileno(), server=server)
    done = _run_to_end(child, request, timeout, grace)
    return done if done is not None else run(job, request, timeout, grace=grace)


def kill(child: Child, grace: float = 0.0) -> None:
    """Kill ``child``'s process group (with anything it started), after SIGTERM and ``grace``
    seconds to clean up where given (the summary removes its half-built cache entry); reap it."""
    if child.poll() is not None:  # a fork's waits for the server's answer: one never made is gone
        return
    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
        if grace > 0:
            os.killpg(child.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=grace)
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()


def _run_to_end(child: Child, request: str, timeout: float, grace: float) -> tuple[str, int | None] | None:
    assert child.stdout is not None
    code: int | None = None
    try:
        try:
            child.pid  # noqa: B018 - a fork's waits for the server's answer (the import under way)
        except ProcessLookupError:
            return None  # the server never forked it
        threading.Thread(target=feed, args=(child.stdin, request.encode()), daemon=True).start()
        chunks, fd, deadline = [], child.stdout.fileno(), time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0:
                if sel.select(left):
                    if not (chunk := os.read(fd, 65536)):  # it closed its stdout: it is exiting
                        code = child.wait(timeout=SPAWN_WAIT_S)
                        break
                    chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace"), code
    finally:
        child.stdout.close()
        if code is None:  # past the timeout, or this process was interrupted: a blocked feeder
            kill(child, grace)  # is freed too (the pipe's reader is gone)


def feed(pipe: IO[bytes] | None, data: bytes) -> None:
    """``data`` to a child's stdin, which it then closes."""
    assert pipe is not None
    # the child may die before reading it all (its exit code says how), or be killed
    with contextlib.suppress(OSError, ValueError), pipe:
        pipe.write(data)
