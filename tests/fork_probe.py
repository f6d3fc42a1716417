"""A real fork server, watched: tests/test_fork_safety.py starts it as the driver starts its own
(``python -m fork_probe FD`` in place of ``python -m sweeper.worker.forked FD``).

It is :func:`sweeper.worker.forked.run` with three additions. Each preload import after torch's
runs under a torch dispatch mode that records every tensor op the server makes (allocations
included: a factory call is an op). ``FORK_PROBE_PRELOAD`` (module names, comma-separated) adds
to the preload. Once the last import is done the server notes its state (CUDA, torch's thread
settings, the Python threads it runs, the NVIDIA devices it holds open), and a ``probe`` job, held like a
worker until the preload has ended, answers with that note.
"""
from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sweeper import child
from sweeper.worker import forked

OPS: list[str] = []  # the tensor ops the server ran in its preload
GUARDED: list[str] = []  # the preload's imports the guard watched
STATE: dict[str, Any] = {}  # the server's state once its preload has ended


class _Recorder(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        OPS.append(str(func))
        return func(*args, **(kwargs or {}))


def _state() -> dict[str, Any]:
    fds = Path("/proc/self/fd")
    links = {os.readlink(p) for p in fds.iterdir() if p.is_symlink()}
    return {"ops": OPS, "guarded": GUARDED, "cuda": torch.cuda.is_initialized(),
            "threads": [torch.get_num_threads(), torch.get_num_interop_threads()],
            "python_threads": threading.active_count(),
            "nvidia": sorted(p for p in links if p.startswith("/dev/nvidia"))}


def _watched(real):
    def _import(name: str) -> None:
        if name == "torch":  # the guard is torch's own: it watches what comes after
            real(name)
        else:
            with _Recorder():
                real(name)
            GUARDED.append(name)
        if name == forked.PRELOAD[-1]:
            STATE.update(_state())
    return _import


def serve(fd: int) -> int:
    forked._import = _watched(forked._import)
    extra = [m for m in os.environ.get("FORK_PROBE_PRELOAD", "").split(",") if m]
    forked.PRELOAD = (*forked.PRELOAD, *extra)
    child.JOBS["probe"] = __name__  # not an early job: forked once the preload has ended
    return forked.run(fd)


def main() -> int:
    """The probe job: the server's state, as the server noted it."""
    child.answers().write(json.dumps(STATE) + "\n")
    return 0


if __name__ == "__main__":
    import fork_probe  # the module the probe job imports, not this __main__ copy of it

    sys.exit(fork_probe.serve(int(sys.argv[1])))
