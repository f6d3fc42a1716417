"""The driver's side of the worker fork server (:mod:`sweeper.worker.forked`), one of the two
launchers :func:`sweeper.launch.start` chooses from: start it, ask it for children, hear their
exits (:class:`ForkedProc` stands in for the ``Popen`` of a child the driver is not the parent of),
stop it. It is used wherever it starts: on Linux (``USE_FORK_SERVER``).

One server serves every sweep of a process (:meth:`ForkServer.shared`): a notebook's second sweep,
or a test session's hundredth, skips its preload (about 3.4 s of CPU, on the first worker's path),
for an idle process of about 120 MB between sweeps. A sweep that ends by an exception stops it (a
straggler dies with it, :func:`stop_shared`); the last one is stopped at the process's exit."""
from __future__ import annotations

import atexit
import itertools
import json
import os
import socket
import subprocess
import sys
import threading
from typing import IO

from sweeper import launch
from sweeper.child import DRIVER_PID

USE_FORK_SERVER = sys.platform.startswith("linux")
SERVER = ("-m", "sweeper.worker.forked")  # how the server starts (tests/test_fork_safety.py: a probe's)
_shared: ForkServer | None = None
_shared_lock = threading.Lock()


class ForkServer:
    """One fork server per driver."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._cond = threading.Condition()
        # ("pid" or "code", request) -> its pid, its exit code (by request: a long-lived server's pids recur)
        self._answers: dict[tuple[str, int], int] = {}
        self._ids = itertools.count(1)  # requests (the driver's thread alone asks)
        self._gone = False

    @classmethod
    def start(cls) -> ForkServer | None:
        """The server, starting; None where it is off or cannot start (children then start fresh)."""
        if not USE_FORK_SERVER:
            return None
        server = cls()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", DRIVER_PID: str(os.getpid())}
        try:
            server._proc = subprocess.Popen(
                [sys.executable, *SERVER, str(theirs.fileno())], pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                start_new_session=True)  # a terminal's Ctrl-C reaches only the driver
        except OSError:
            ours.close()
            return None
        finally:
            theirs.close()
        server._sock = ours
        threading.Thread(target=server._listen, daemon=True, name="fork-server").start()
        return server

    @classmethod
    def shared(cls) -> ForkServer | None:
        """This process's server, started by its first sweep (again once the last one died or was
        stopped); None where it is off or cannot start."""
        global _shared
        with _shared_lock:
            if _shared is None or not _shared.alive:
                _shared = cls.start()
                if _shared is not None:
                    atexit.register(_shared.stop)
            return _shared

    @property
    def alive(self) -> bool:
        return self._sock is not None and not self._gone

    def _listen(self) -> None:
        assert self._sock is not None
        while True:
            try:
                data = self._sock.recv(65536)
            except OSError:
                data = b""
            with self._cond:
                if not data:
                    self._gone = True  # its children die with it (their parent-death signal)
                    self._cond.notify_all()
                    return
                msg = json.loads(data)
                key = "code" if "exit" in msg else "pid"
                self._answers[key, msg["req"]] = msg[key]
                self._cond.notify_all()

    def spawn(self, job: str, argv: list[str], env: dict[str, str], out: int, err: int) -> ForkedProc | None:
        """Ask for ``job`` (:meth:`sweeper.launch.Launcher.spawn`); None when the server is gone."""
        if not self.alive:
            return None
        in_r, in_w = os.pipe()
        req = next(self._ids)
        msg = json.dumps({"req": req, "env": env, "cwd": os.getcwd(), "job": job, "argv": argv}).encode()
        try:
            assert self._sock is not None
            socket.send_fds(self._sock, [msg], [in_r, out, err])
        except OSError:
            os.close(in_w)
            return None
        finally:
            os.close(in_r)  # the child holds its own copy now
        return ForkedProc(self, req, os.fdopen(in_w, "wb"))

    def answer(self, key: str, req: int, timeout: float | None) -> int | None:
        """Request ``req``'s pid (``key`` "pid") or exit code ("code") once the server sends it; None
        past ``timeout``, or once the server is gone (a code then -9: its children were killed with it)."""
        with self._cond:
            self._cond.wait_for(lambda: (key, req) in self._answers or self._gone, timeout=timeout)
            return self._answers.get((key, req), -9 if self._gone and key == "code" else None)

    def stop(self) -> None:
        """Kill it at once: after the driver has shut its workers down it holds nothing (a straggler
        dies with it, by its parent-death signal), and while it still preloads it would read no EOF
        until the import under way ends (torch: seconds)."""
        if self._proc is not None:
            launch.kill(self._proc)
        if self._sock is not None:
            self._sock.close()
        with self._cond:
            self._gone = True
            self._cond.notify_all()


def stop_shared() -> None:
    """Stop this process's server, if one runs (a sweep that ends by an exception does so too)."""
    global _shared
    with _shared_lock:
        server, _shared = _shared, None
    if server is not None:
        server.stop()


class ForkedProc:
    """A forked child, with what the driver uses of a ``subprocess.Popen`` (:class:`sweeper.launch.Child`)."""

    def __init__(self, server: ForkServer, req: int, stdin: IO[bytes]) -> None:
        self._server, self._req = server, req
        self.stdin: IO[bytes] | None = stdin
        self.stdout: IO[bytes] | None = None  # a pipe back, where the launcher made one
        self._pid: int | None = None
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        """Its pid (and process group: sweeper.child); waits for the server's answer."""
        if self._pid is None:
            if (pid := self._server.answer("pid", self._req, launch.SPAWN_WAIT_S)) is None:
                raise ProcessLookupError("the fork server did not start the child")
            self._pid = pid
        return self._pid

    def poll(self) -> int | None:
        return self._code(0.0)

    def wait(self, timeout: float | None = None) -> int:
        if (code := self._code(timeout)) is None:
            raise subprocess.TimeoutExpired(f"worker {self._pid}", timeout or 0.0)
        return code

    def _code(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            try:
                self.pid  # noqa: B018 - waits for the server's answer: a child it never started is gone
            except ProcessLookupError:
                self.returncode = -9
                return self.returncode
            self.returncode = self._server.answer("code", self._req, timeout)
        return self.returncode
