"""The fork server's safety rules (:mod:`sweeper.worker.forked`), checked on a real server once
its preload has ended (tests/fork_probe.py): it ran no tensor op (OpenMP's pool does not survive
a fork), made no CUDA context and holds no NVIDIA device open, left torch's thread settings as a
fresh interpreter has them, and started no thread (numpy's OpenBLAS pool and pyarrow's jemalloc
keep a native one each, as in any process that imports them, with fork handlers of their own).
The same check on a server whose preload breaks the rules (tests/fork_unsafe.py) fails on each."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from sweeper import launch
from sweeper.dispatch import forkserver
from sweeper.dispatch.forkserver import ForkServer
from sweeper.worker.forked import PRELOAD

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not forkserver.USE_FORK_SERVER, reason="the fork server is Linux's")]

THREADS = "import json, torch; print(json.dumps([torch.get_num_threads(), torch.get_num_interop_threads()]))"


def _after_preload(monkeypatch) -> dict:
    """What a real server noted once its preload had ended, asked through the driver's launcher."""
    monkeypatch.setattr(forkserver, "SERVER", ("-m", "fork_probe"))
    server = ForkServer.start()
    assert server is not None
    try:
        out, code = launch.run("probe", "", 300, server=server)
    finally:
        server.stop()
    assert code == 0, out
    return json.loads(out)


def _fresh_threads() -> list[int]:
    """torch's thread counts in a fresh interpreter with this environment (the server's)."""
    done = subprocess.run([sys.executable, "-c", THREADS], capture_output=True, text=True, timeout=120,
                          check=True)
    return json.loads(done.stdout)


def test_after_its_preload_the_server_ran_no_tensor_op_made_no_cuda_context_and_left_threads_alone(
        workdir, monkeypatch):
    state = _after_preload(monkeypatch)
    assert state["guarded"] == list(PRELOAD[1:])  # the guard watched every import after torch's
    assert state["ops"] == []
    assert state["cuda"] is False and state["nvidia"] == []
    assert state["threads"] == _fresh_threads()
    assert state["python_threads"] == 1


def test_the_check_fails_on_a_preload_that_breaks_the_rules(workdir, monkeypatch):
    monkeypatch.setenv("FORK_PROBE_PRELOAD", "fork_unsafe")
    monkeypatch.setenv("FORK_UNSAFE", "tensor,threads,thread")
    state = _after_preload(monkeypatch)
    assert state["guarded"][-1] == "fork_unsafe"
    assert "aten.zeros.default" in state["ops"]
    assert state["threads"] == [n + 1 for n in _fresh_threads()]
    assert state["python_threads"] == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA context needs a GPU")
def test_the_check_fails_on_a_preload_that_makes_a_cuda_context(workdir, monkeypatch):
    monkeypatch.setenv("FORK_PROBE_PRELOAD", "fork_unsafe")
    monkeypatch.setenv("FORK_UNSAFE", "cuda")
    state = _after_preload(monkeypatch)
    assert state["cuda"] is True and state["nvidia"]
