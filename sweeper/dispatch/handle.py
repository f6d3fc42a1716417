"""One worker subprocess, as the driver sees it: start, talk, read, stop, and the state
of the trial it runs. Its state changes only through its own methods."""

import contextlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sweeper import launch
from sweeper.devices import Slot
from sweeper.store.layout import slot_log
from sweeper.worker import protocol


@dataclass
class Running:
    """The trials a worker is on (one, or a population trained as one stack), as the driver tracks them."""

    trials: dict[int, int]  # number -> trial_id, of those not ended yet
    started: float
    last_event: float = 0.0  # monotonic time of the worker's last event; the stall watchdog reads it


class WorkerHandle:
    """One long-lived worker process bound to a device slot."""

    def __init__(self, slot: Slot, init: dict[str, Any], run_dir: Path,
                 server: launch.Launcher | None = None) -> None:
        self.slot, self.init = slot, init
        self.server = server  # forks READY workers in ~0.2 s; without it (or once it is gone), fresh ones
        # hosts may share the run folder: each writes its own slot logs
        self.log_path = slot_log(run_dir, init["driver"]["host"], slot.id)
        self.proc: launch.Child | None = None
        self.ready = self.was_ready = False
        self.early_exits = 0  # exits before ever becoming ready, in a row
        self.running: Running | None = None
        self.stop_sent = False  # a worker is told to stop once, however many loop turns the drain takes
        self.reserved = False  # its slot's turn is the study's baseline job's (reserve, release)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:  # the child keeps its own; stdin, stdout: commands, events
            self.proc = launch.start("worker", [], {**os.environ, **self.slot.env}, err=log.fileno(),
                                     server=self.server)
        self.ready, self.was_ready, self.running, self.stop_sent = False, False, None, False
        self._decoder = protocol.LineDecoder(self._malformed)
        self.send({"op": protocol.INIT, **self.init, "slot": {"id": self.slot.id, "label": self.slot.label}})

    @property
    def started(self) -> bool:
        """Whether its process was ever started: a packing driver starts some only when needed."""
        return self.proc is not None

    @property
    def idle(self) -> bool:
        """The one definition of a free worker: ready for a trial, running none, and its turn not
        taken by the baseline job."""
        return self.ready and self.running is None and not self.reserved

    def reserve(self) -> None:
        """The baseline job (:mod:`sweeper.dispatch.baseline_job`) takes its turn until :meth:`release`."""
        self.reserved = True

    def release(self) -> None:
        self.reserved = False

    @property
    def stdout(self) -> IO[bytes]:
        assert self.proc is not None and self.proc.stdout is not None, "the worker was never started"
        return self.proc.stdout

    def heard(self, ev: dict[str, Any]) -> None:
        """An event from the worker: it is ready, or its trial lives (what the stall watchdog reads:
        any event, a step's progress or a wait for the store, shows it is neither dead nor stuck)."""
        if ev.get("ev") == protocol.READY:
            self.ready = self.was_ready = True
            self.early_exits = 0
        if self.running is not None:
            self.running.last_event = time.monotonic()

    def assign(self, trials: list[tuple[int, int]], **run: Any) -> None:
        """Hand it trials ((trial_id, number): one, or a population): the clock of their time limit and
        stall watchdog starts now (loading the data and the batch probe count as well)."""
        now = time.monotonic()
        self.running = Running({number: trial_id for trial_id, number in trials}, started=now, last_event=now)
        (trial_id, number), more = trials[0], len(trials) > 1
        self.send({"op": protocol.RUN, "trial_id": trial_id, "number": number, **run,
                   **({"trials": [list(t) for t in trials]} if more else {})})

    def trial_ended(self, number: int, failed: bool) -> None:
        """One of its trials ended; after a failure the worker exits once its others have ended (its
        replacement comes on EOF), so it is not ready."""
        if self.running is not None:
            self.running.trials.pop(number, None)
            if not self.running.trials:
                self.running = None
        self.ready = self.ready and not failed

    def drain(self) -> None:
        """Tell it (once) to stop its trial at the next step."""
        if not self.stop_sent:
            self.send({"op": protocol.STOP})
            self.stop_sent = True

    def exited(self) -> int:
        """Its process ended (EOF): reap it, count an exit before it was ready; its exit code."""
        assert self.proc is not None
        code = self.proc.wait()
        self.close()
        self.running = None
        if not self.was_ready:
            self.early_exits += 1
        return code

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    def send(self, msg: dict[str, Any]) -> None:
        if self.proc is None:
            return  # never started: nothing to tell
        with contextlib.suppress(OSError):  # the worker died; its EOF on stdout reports it
            assert self.proc.stdin is not None
            self.proc.stdin.write(protocol.encode(msg))
            self.proc.stdin.flush()

    def last_line(self) -> str:
        """Its log's last line (a traceback's names what ended it); empty where there is none."""
        with contextlib.suppress(OSError):
            lines = self.log_path.read_text(errors="replace").splitlines()
            return next((x for x in reversed(lines) if x.strip()), "")
        return ""

    def _malformed(self, line: str) -> None:
        note = f"sweeper: skipped a malformed protocol line from the worker on {self.slot.label}: {line!r}"
        print(note, file=sys.stderr, flush=True)
        with open(self.log_path, "a") as log:
            log.write(note + "\n")

    def read_events(self) -> list[dict[str, Any]] | None:
        """Complete events available now; None at EOF (the worker exited)."""
        return self._decoder.feed(chunk) if (chunk := os.read(self.stdout.fileno(), 65536)) else None

    def kill(self) -> None:
        if self.proc is not None:
            launch.kill(self.proc)

    def request_close(self) -> None:
        """EOF on the worker's stdin: it stops at its next step and exits."""
        if self.proc and self.proc.poll() is None and self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def close(self, deadline: float | None = None) -> None:
        """Ask the worker to exit, wait until ``deadline`` (monotonic; default in 10 s), then kill it."""
        self.request_close()
        if self.proc and self.proc.poll() is None:
            try:
                self.proc.wait(timeout=10.0 if deadline is None else max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()
