"""How the driver starts a child, in one place. Each kind (:data:`sweeper.child.JOBS`: a worker,
the study's baseline job, the panel's summary, the models' check) starts through a
:class:`Launcher`, of which there are two: the worker fork server
(:class:`sweeper.dispatch.forkserver.ForkServer`, on Linux: a child ready in about 0.1 s, its
imports done) and a fresh interpreter (:class:`Interpreter`, ``python -m MODULE``: seconds of
imports). :func:`start` chooses, for every kind alike: the server while it lives, else a fresh
interpreter. What the child does first, whichever way it started, is :mod:`sweeper.child`.

The parent's code: the worker never loads this module (tests/test_architecture.py).
"""
from __future__ import annotations

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

# the longest wait on the fork server's answers: the first worker's pid comes once the preload
# has ended (about 5 s on a loaded 2-core box); a summary's or a check's after the import under way
SPAWN_WAIT_S = 120.0


class Child(Protocol):
    """What the driver uses of a started child: a ``subprocess.Popen``, or the fork server's
    :class:`~sweeper.dispatch.forkserver.ForkedProc`, which stands in for one."""

    @property
    def pid(self) -> int: ...  # and its process group's (sweeper.child)

    @property
    def stdin(self) -> IO[bytes] | None: ...

    @property
    def stdout(self) -> IO[bytes] | None: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class Launcher(Protocol):
    def spawn(self, job: str, argv: list[str], env: dict[str, str], out: int | None,
              err: int) -> Child | None:
        """``job`` with these arguments and environment, its stdin a pipe (``Child.stdin``), its
        stdout ``out`` or, where None, a pipe back (``Child.stdout``), its stderr ``err``; None
        where this launcher cannot start it."""


class Interpreter:
    """A fresh ``python -m MODULE ARGV`` of this interpreter: it always starts."""

    def spawn(self, job: str, argv: list[str], env: dict[str, str], out: int | None,
              err: int) -> subprocess.Popen[bytes]:
        # its own session before it runs a line of ours: a killpg at once cannot miss it
        return subprocess.Popen([sys.executable, "-m", JOBS[job], *argv], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE if out is None else out, stderr=err, env=env,
                                start_new_session=True)


INTERPRETER = Interpreter()


def start(job: str, argv: list[str], env: Mapping[str, str], *, out: int | None = None, err: int,
          server: Launcher | None = None) -> Child:
    """``job`` started (:meth:`Launcher.spawn`) by the one choice: forked by ``server`` while it
    lives, else a fresh interpreter. Its environment gains what every child needs: unbuffered
    output, and the driver's pid, which it dies with (:mod:`sweeper.child`)."""
    env = {**env, "PYTHONUNBUFFERED": "1", DRIVER_PID: str(os.getpid())}
    forked = server.spawn(job, argv, env, out, err) if server is not None else None
    return forked or INTERPRETER.spawn(job, argv, env, out, err)


def run(job: str, request: str, timeout: float, *, grace: float = 0.0,
        server: Launcher | None = None) -> tuple[str, int | None]:
    """Run ``job`` to its end as ``subprocess.run(input=request, capture_output=True)`` would,
    with this process's environment and folder: (its stdout; its exit code, or None when it ran
    past ``timeout`` and was killed). Its stderr is dropped. Killed (past the timeout, or this
    process interrupted), it gets SIGTERM and ``grace`` seconds to clean up first where
    ``grace`` is given. A fork the server never made (it died first) starts again, fresh."""
    with open(os.devnull, "wb") as null:  # the child holds its own copy once started
        child = start(job, [], os.environ, err=null.fileno(), server=server)
    done = _run_to_end(child, request, timeout, grace)
    return done if done is not None else run(job, request, timeout, grace=grace)


def kill(child: Child, grace: float = 0.0) -> None:
    """Kill ``child`` with its process group (anything it started), after SIGTERM and ``grace``
    seconds to clean up where given, and reap it."""
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
        threading.Thread(target=_feed, args=(child.stdin, request.encode()), daemon=True).start()
        out, ended = _read_all(child.stdout.fileno(), time.monotonic() + timeout)
        if ended:  # it closed its stdout: it is exiting
            code = child.wait(timeout=SPAWN_WAIT_S)
        return out.decode(errors="replace"), code
    finally:
        child.stdout.close()
        if code is None:  # past the timeout, or this process was interrupted
            kill(child, grace)
        if child.stdin is not None:
            with contextlib.suppress(OSError):
                child.stdin.close()  # after the kill: a feeder blocked on a full pipe is freed first


def _feed(pipe: IO[bytes] | None, data: bytes) -> None:
    assert pipe is not None
    try:
        with pipe:
            pipe.write(data)
    except (OSError, ValueError):
        pass  # the child died before reading it all (its exit code says how), or was killed


def _read_all(fd: int, deadline: float) -> tuple[bytes, bool]:
    """What ``fd`` gives until its end or ``deadline``, and whether its end was reached."""
    chunks: list[bytes] = []
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if sel.select(left):
                chunk = os.read(fd, 65536)
                if not chunk:
                    return b"".join(chunks), True
                chunks.append(chunk)
    return b"".join(chunks), False
