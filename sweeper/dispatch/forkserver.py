"""The driver's side of the worker fork server (:mod:`sweeper.worker.forked`): start it once,
as the sweep's checks begin, ask it for the user models' check, workers and the baseline job,
hear their exits, and stop it.

A worker forked from the server is READY in about 0.2 s instead of about 5 s, and holds about
26 MB of private memory idle instead of about 287 MB (``docs/performance.md``). The driver is not
its parent (the server is), so :class:`ForkedProc` stands in for the ``subprocess.Popen`` a
:class:`~sweeper.dispatch.handle.WorkerHandle` would hold: ``pid``, ``stdin``, ``stdout``,
``poll()``, ``wait(timeout)`` and ``returncode``, the exit code reported by the server.

One server serves every sweep of a process (:meth:`ForkServer.shared`): ``sweeper run`` runs one,
but a notebook's second sweep, or a test session's hundredth, then skips the server's preload
(about 3.4 s of CPU, on the first worker's path). A sweep that ends by an exception stops it (a
straggler dies with it); the last one is stopped at the process's exit. It costs an idle process
of about 120 MB between sweeps; :func:`stop_shared` hands that back.

The server is used wherever it starts: on Linux (``USE_FORK_SERVER``, an internal constant,
not a config key: nothing a user sees changes but the start-up time). Anywhere it is off, fails
to start or has died, a worker is started as before, ``python -m sweeper.worker.main``.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO

USE_FORK_SERVER = sys.platform.startswith("linux")
# the first worker's ask waits for the server's preload (about 5 s on a loaded 2-core box); a
# summary's or a check's, for the import under way (worker.forked.serve)
SPAWN_WAIT_S = 120.0
_shared: ForkServer | None = None
_shared_lock = threading.Lock()


class ForkServer:
    """One fork server per driver."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._cond = threading.Condition()
        self._pids: dict[int, int] = {}  # request -> pid
        self._codes: dict[int, int] = {}  # request -> exit code (a long-lived server's pids may recur)
        self._next = 0
        self._gone = False

    @classmethod
    def start(cls, log: IO[bytes] | None = None) -> ForkServer | None:
        """The server, starting; None where it is off or cannot start (workers then start fresh)."""
        if not USE_FORK_SERVER:
            return None
        server = cls()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "SWEEPER_DRIVER_PID": str(os.getpid())}
        try:
            cmd = [sys.executable, "-m", "sweeper.worker.forked", str(theirs.fileno())]
            server._proc = subprocess.Popen(
                cmd, pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL, stdout=log or subprocess.DEVNULL, stderr=log or subprocess.DEVNULL,
                env=env, start_new_session=True)  # a terminal's Ctrl-C reaches only the driver
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
        """This process's server, started by its first sweep (or again, once the last one died or
        was stopped); None where it is off or cannot start."""
        global _shared
        if not USE_FORK_SERVER:
            return None
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
                if "pid" in msg:
                    self._pids[msg["req"]] = msg["pid"]
                elif "exit" in msg:
                    self._codes[msg["req"]] = msg["code"]
                self._cond.notify_all()

    def spawn(self, env: dict[str, str], log: IO[bytes]) -> ForkedProc | None:
        """Ask for a worker with this environment and slot log (its stdin the command pipe, its
        stdout the event pipe); None when the server is gone."""
        ev_r, ev_w = os.pipe()
        proc = self._ask("worker", [], env, ev_w, log.fileno())
        os.close(ev_w)  # the child holds its own copy now
        if proc is None:
            os.close(ev_r)
            return None
        proc.stdout = os.fdopen(ev_r, "rb", buffering=0)
        return proc

    def spawn_job(self, job: str, argv: list[str], env: dict[str, str], log: IO[bytes]) -> ForkedProc | None:
        """Ask for ``job`` (``baseline``) with these arguments, environment and log (its stdout and
        stderr; its stdin a pipe, :attr:`ForkedProc.stdin`); None when the server is gone."""
        return self._ask(job, argv, env, log.fileno(), log.fileno())

    def run_job(self, job: str, request: str, timeout: float, *,
                grace: float = 0.0) -> tuple[str, int | None] | None:
        """Run ``job`` to its end as ``subprocess.run(input=request, capture_output=True)`` would,
        with this process's environment and folder: (its stdout; its exit code, or None when it
        ran past ``timeout`` and was killed). Its stderr is dropped. None when the server is gone
        before it forked the job (the caller then starts it some other way). Killed (past the
        timeout, or this process interrupted), it gets SIGTERM and ``grace`` seconds to clean up
        first where ``grace`` is given (the summary's child removes a half-built cache entry)."""
        out_r, out_w = os.pipe()
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            proc = self._ask(job, [], dict(os.environ), out_w, null)
        finally:
            os.close(out_w)  # the child holds its own copies now
            os.close(null)
        code: int | None = None
        try:
            if proc is None or not _forked(proc):
                return None
            threading.Thread(target=_feed, args=(proc.stdin, request.encode()), daemon=True).start()
            out, ended = _read_all(out_r, time.monotonic() + timeout)
            if ended:  # it closed its stdout: it is exiting, and the server reports how
                code = proc.wait(timeout=SPAWN_WAIT_S)
            return out.decode(errors="replace"), code
        finally:
            os.close(out_r)
            if proc is not None and code is None:  # past the timeout, or this process was interrupted
                _kill_group(proc, grace)

    def _ask(self, job: str, argv: list[str], env: dict[str, str], out: int, err: int) -> ForkedProc | None:
        if not self.alive:
            return None
        in_r, in_w = os.pipe()
        with self._cond:
            self._next += 1
            req = self._next
        msg = json.dumps({"req": req, "env": env, "cwd": os.getcwd(), "job": job, "argv": argv}).encode()
        try:
            assert self._sock is not None
            socket.send_fds(self._sock, [msg], [in_r, out, err])
        except OSError:
            os.close(in_w)
            return None
        finally:
            os.close(in_r)  # the child holds its own copy now
        return ForkedProc(self, req, os.fdopen(in_w, "wb"), None)

    def pid_of(self, req: int) -> int | None:
        with self._cond:
            self._cond.wait_for(lambda: req in self._pids or self._gone, timeout=SPAWN_WAIT_S)
            return self._pids.get(req)

    def code_of(self, req: int, timeout: float | None) -> int | None:
        with self._cond:
            self._cond.wait_for(lambda: req in self._codes or self._gone, timeout=timeout)
            if req not in self._codes and self._gone:
                return -9  # the server died: its children were killed with it
            return self._codes.get(req)

    def stop(self) -> None:
        """Kill it, at once: called after the driver has shut its workers down, it holds nothing
        (a straggler dies with it, by its parent-death signal, as shutdown's kill would have it),
        and while it still preloads it would read no EOF until the import under way ends (torch:
        seconds)."""
        if self._proc is not None:
            try:
                self._proc.kill()
            except OSError:
                pass
            self._proc.wait()
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


def _forked(proc: ForkedProc) -> bool:
    """Whether the server forked it: waits for its answer (a worker's comes after the preload)."""
    try:
        proc.pid  # noqa: B018
    except ProcessLookupError:
        return False
    return True


def _kill_group(proc: ForkedProc, grace: float = 0.0) -> None:
    try:
        if proc._pid is not None:  # one not known to be forked yet finds its stdin closed, and ends
            if grace > 0:
                os.killpg(proc._pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=grace)
            os.killpg(proc._pid, signal.SIGKILL)  # its process group: it called setsid
            proc.wait(timeout=SPAWN_WAIT_S)
    except (OSError, subprocess.TimeoutExpired):
        pass  # already gone
    finally:
        if proc.stdin is not None:
            try:
                proc.stdin.close()  # after the kill: a feeder blocked on a full pipe is freed first
            except OSError:
                pass


class ForkedProc:
    """A forked worker, with what the driver uses of a ``subprocess.Popen``."""

    def __init__(self, server: ForkServer, req: int, stdin: IO[bytes], stdout: IO[bytes] | None) -> None:
        self._server, self._req = server, req
        self.stdin: IO[bytes] | None = stdin
        self.stdout: IO[bytes] | None = stdout
        self._pid: int | None = None
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        """Its pid (and process group: it called setsid); waits for the server's answer."""
        if self._pid is None:
            pid = self._server.pid_of(self._req)
            if pid is None:
                raise ProcessLookupError("the fork server did not start the worker")
            self._pid = pid
        return self._pid

    def poll(self) -> int | None:
        return self._code(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._code(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"worker {self._pid}", timeout or 0.0)
        return code

    def _code(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            try:
                self.pid  # noqa: B018 - waits for the server's answer: a child it never started is gone
            except ProcessLookupError:
                self.returncode = -9
                return self.returncode
            self.returncode = self._server.code_of(self._req, timeout)
        return self.returncode
