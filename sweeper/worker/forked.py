"""The worker fork server: one process per driver that imports once what its children need
(:data:`PRELOAD`), then forks each child the driver asks for (:data:`sweeper.child.JOBS`): a
worker, the study's baseline job and, before the sweep starts, the summary of its panel and the
check of its models, so that the driver itself never imports torch.

Why: a fresh ``python -m sweeper.worker.main`` spends about 5 s (2-core box, loaded) before READY,
almost all of it importing (torch alone 1.6-2 s; the other children 2-3 s each); a fork of this
server is READY in about 0.2 s. The cost: the server itself (about 120 MB PSS, shared with its
children) and, per idle worker, only about 26 MB of private memory (the copy-on-write pages it
touched) against a fresh worker's 287 MB. The preload runs between requests (:func:`serve`).

Started by the driver (:mod:`sweeper.dispatch.forkserver`) as ``python -m sweeper.worker.forked
FD``: FD is its end of a ``SOCK_SEQPACKET`` socket pair. Each request is one message, a JSON
object ``{"req", "env", "cwd", "job", "argv"}`` (``job``: :data:`sweeper.child.JOBS`) with three
descriptors attached, the child's stdin, stdout and stderr. The server answers ``{"req", "pid"}``
and, when that child exits, ``{"exit": pid, "req", "code": c}`` (negative for a signal).

What the server must never do: run a tensor op (OpenMP's thread pool does not survive a fork:
a child's matmul hung), touch ``torch.cuda`` (even ``is_available()`` creates the driver's state;
each child picks its own GPU through CUDA_VISIBLE_DEVICES), or set torch's thread counts (the
child's ``TrialRunner`` sets them from OMP_NUM_THREADS). It starts no thread, so forking it is safe
(numpy's OpenBLAS and pyarrow's jemalloc keep one each, with fork handlers of their own).
``tests/test_fork_safety.py`` checks these rules on a real server after its preload.

The server and its children die with the driver (:func:`sweeper.child.set_up`), and the server
exits on EOF from the driver's socket: a ``kill -9`` of the driver takes them all down with it."""

import contextlib
import gc
import importlib
import json
import os
import selectors
import signal
import socket
import sys
from collections.abc import Callable, Mapping
from typing import Any

from sweeper import child

# what a worker imports before READY and at its first trial (alembic: ~0.3 s at the first
# storage open). Never __main__ and never sweeper.dispatch: the children inherit every module
# here, and a worker must not load the parent's code (tests/test_architecture.py).
PRELOAD = (
    # first what a sweep's first asks need (the panel's summary and the models' check: EARLY_JOBS)
    "torch", "pandas", "pyarrow.parquet", "sweeper.study.summary", "sweeper.data.load", "sweeper.data.folds",
    "sweeper.models.check", "sweeper.models.build",
    "optuna", "sqlalchemy", "sqlalchemy.orm", "sqlalchemy.dialects.sqlite",
    "sqlalchemy.dialects.postgresql", "optuna.storages._rdb.storage", "alembic.command", "alembic.config",
    "alembic.migration", "alembic.script", "optuna.artifacts",
    "sweeper.worker.main", "sweeper.worker.trial", "sweeper.validation.runner", "sweeper.validation.record",
    "lightgbm", "sweeper.baseline.job")  # lightgbm only loads its library: no OpenMP region runs here
# what is forked before the preload has ended (the rest is held until then, :func:`serve`)
EARLY_JOBS = ("summary", "check")
MAX_MESSAGE = 1 << 20
N_FDS = 3  # the worker's stdin, stdout and stderr


def _import(name: str) -> None:
    try:
        importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - an optional module missing only costs its child the import
        print(f"sweeper: fork server: preloading {name} failed: {exc}", file=sys.stderr, flush=True)
    gc.freeze()  # the children's collections then leave the server's objects (its shared pages) alone


def serve(ctl: socket.socket) -> int:
    """Fork a child per request until the driver's socket ends; report each child's exit.

    The preload runs here, one module whenever no request waits. A sweep's summary and model
    check (:data:`EARLY_JOBS`) are forked at once, waiting at most for the import under way; a
    worker or baseline job asked for meanwhile is held until the preload has ended (forked
    earlier, it would import the rest itself, into memory of its own, beside the server)."""
    todo = list(PRELOAD)
    held: list[tuple[dict[str, Any], list[int]]] = []  # (request, its descriptors), in order
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.siginterrupt(signal.SIGCHLD, False)  # an exiting child interrupts no system call of an import
    sel = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    children: dict[int, int] = {}  # pid -> request
    while True:
        events = sel.select(timeout=0 if todo else 1.0)
        for key, _ in events:
            if key.fileobj == wake_r:
                os.read(wake_r, 4096)
                continue
            try:
                data, fds, _flags, _addr = socket.recv_fds(ctl, MAX_MESSAGE, N_FDS)
            except OSError:
                data, fds = b"", []
            if not data:
                return 0  # the driver is done (or gone): the children's parent-death signal follows
            held.append((json.loads(data), fds))
        now = [h for h in held if not todo or h[0].get("job", "worker") in EARLY_JOBS]
        held = [h for h in held if h not in now]
        for i, (req, fds) in enumerate(now):
            theirs = [fd for _, f in (*now[i + 1:], *held) for fd in f]  # the other children's (_fork)
            children[_fork(ctl, req, fds, (wake_r, wake_w, *theirs))] = req["req"]
        _reap(ctl, children)
        if todo and not events:
            _import(todo.pop(0))


def _fork(ctl: socket.socket, req: dict[str, Any], fds: list[int], not_its: tuple[int, ...]) -> int:
    """Fork the child ``req`` asks for. ``not_its``: the server's descriptors it must not keep,
    among them those of the requests still waiting here (the other children's: a copy in this one
    would keep, say, a killed worker's event pipe from ever reaching its EOF at the driver)."""
    started_r, started_w = os.pipe()
    server = os.getpid()
    if (pid := os.fork()) == 0:
        signal.set_wakeup_fd(-1)  # before its pipe closes: a signal would write to a closed descriptor
        for fd in (*not_its, started_r):
            os.close(fd)
        _child(req, fds, ctl, started_w, server)  # never returns
    for fd in (*fds, started_w):
        os.close(fd)
    # its EOF comes once the child has its own session (or has died): the pid the driver hears of
    # then names a process group, and a kill of it at once (killpg) cannot miss
    os.read(started_r, 1)
    os.close(started_r)
    ctl.send(json.dumps({"req": req["req"], "pid": pid}).encode())
    return pid


def _reap(ctl: socket.socket, children: dict[int, int]) -> None:
    for pid, req in list(children.items()):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 0
        if done:
            del children[pid]
            with contextlib.suppress(OSError):
                ctl.send(json.dumps({"exit": pid, "req": req,
                                     "code": os.waitstatus_to_exitcode(status)}).encode())


def _child(req: dict[str, Any], fds: list[int], ctl: socket.socket, started: int, server: int) -> None:
    """In the forked child: become what ``python -m MODULE ARGV`` would be (:data:`sweeper.child.JOBS`)."""
    code = 1
    try:
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        ctl.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        _environ(req["env"], req["cwd"])
        os.chdir(req["cwd"])
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - the process's own streams
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", closefd=False)  # noqa: SIM115 - stdout: child.run
        child.set_up(server)  # its own session first: the server tells the driver its pid once it has one
        os.close(started)
        code = child.run(_main(req.get("job", "worker"), list(req.get("argv", []))))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - report it in the slot log, as a fresh interpreter would
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _main(job: str, argv: list[str]) -> Callable[[], int | None]:
    """``job``'s main() as its ``__main__`` with these arguments (preloaded: nothing to import)."""
    module = importlib.import_module(child.JOBS[job])
    sys.modules["__main__"] = module  # what it is, as `python -m MODULE` names it
    sys.argv = [module.__file__ or child.JOBS[job], *argv]
    if job != "worker" and "OMP_NUM_THREADS" in os.environ:  # the worker's TrialRunner sets its own
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # read at the server's import
    return module.main


def _environ(env: dict[str, str], cwd: str) -> None:
    """The request's environment, before anything starts torch's threads or CUDA, and its sys.path as
    ``python -m`` in ``cwd`` with its PYTHONPATH would have it: the server serves every sweep of its
    driver's process, each with its own folder and PYTHONPATH, so the server's (:data:`_STARTED_WITH`) go."""
    os.environ.clear()
    os.environ.update(env)
    theirs = _python_path(env, cwd)
    sys.path[:] = [*theirs, *(p for p in sys.path if p not in _STARTED_WITH and p not in theirs)]


def _python_path(env: Mapping[str, str], folder: str) -> list[str]:
    """What ``python -m`` started in ``folder`` with ``env`` puts on sys.path before the interpreter's
    own: that folder (none under -P / PYTHONSAFEPATH), then its PYTHONPATH."""
    first = [] if sys.flags.safe_path else [folder]
    return [*first, *(os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]


_STARTED_WITH = set(_python_path(os.environ, sys.path[0]))  # the server's own


def run(fd: int) -> int:
    child.set_up()  # a child of the driver too: it dies with it, and leaves Ctrl-C to it
    return serve(socket.socket(fileno=fd))


if __name__ == "__main__":
    sys.exit(run(int(sys.argv[1])))
