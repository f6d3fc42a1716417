"""The driver <-> worker protocol survives garbage, and a worker never outlives a dead driver."""
from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from sweeper.worker.main import Commands
from sweeper.worker.protocol import LineDecoder


def test_malformed_lines_are_reported_and_skipped():
    errors = []
    decoder = LineDecoder(errors.append)
    assert decoder.feed(b'{"ev": "ready"}\nnot json\n[1]\n{"ev": "end"}\n{"ev": ') == [{"ev": "ready"}, {"ev": "end"}]
    assert decoder.feed(b'"epoch"}\n') == [{"ev": "epoch"}]  # a line split across reads is kept
    assert errors == ["not json", "[1]"]


def test_the_worker_skips_a_malformed_command(capsys):
    commands = Commands(io.StringIO('garbage\n{"op": "run", "number": 1}\n'))
    assert commands.next() == {"op": "run", "number": 1}
    assert commands.next() is None  # EOF
    assert "skipped a malformed command line from the driver: 'garbage'" in capsys.readouterr().err


EMIT_TO_A_DEAD_DRIVER = """
import os
from sweeper.worker import protocol
r, w = os.pipe()
os.close(r)  # the driver's end: it died
protocol.set_channel(os.fdopen(w, "w", buffering=1))
protocol.emit(protocol.EPOCH, number=3, epoch=2, metrics={})
print("still here")
"""


@pytest.mark.slow
def test_a_worker_whose_event_pipe_is_closed_exits_at_once_without_a_traceback():
    # a kill -9 of the driver closes the pipe before the worker's parent-death signal comes
    done = subprocess.run([sys.executable, "-c", EMIT_TO_A_DEAD_DRIVER], capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == "sweeper: the driver is gone (its event pipe is closed); exiting\n"


@pytest.mark.slow
def test_a_worker_whose_driver_is_already_gone_exits_at_once():
    # the parent-death signal only covers a parent that dies after it is set: the worker
    # re-checks its parent, here a pid that is not its parent (as after a driver died)
    env = {**os.environ, "SWEEPER_DRIVER_PID": str(os.getpid() + 1_000_000)}
    out = subprocess.run([sys.executable, "-m", "sweeper.worker.main"], input="", capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 1
    assert f"the driver (pid {os.getpid() + 1_000_000}) is gone; exiting" in out.stderr
    assert out.stdout == ""


@pytest.mark.slow
def test_a_worker_with_its_driver_waits_for_the_handshake():
    env = {**os.environ, "SWEEPER_DRIVER_PID": str(os.getpid())}
    out = subprocess.run([sys.executable, "-m", "sweeper.worker.main"], input="", capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 2  # EOF before 'init': no trial, and not the 'driver is gone' exit
    assert "is gone" not in out.stderr
