"""The worker: a long-lived process per device slot that trains the trials the
driver hands it, through the shared training core, and records them in the store.

The driver starts it (:mod:`sweeper.launch`) with an environment that pins it to
one GPU (CUDA_VISIBLE_DEVICES) or to CPU threads. It speaks the JSON lines of
:mod:`sweeper.worker.protocol`: commands on stdin, events on its answers stream
(:func:`sweeper.child.answers`: stray prints go to the slot log, not among them).

The worker finishes its own trials (COMPLETE, PRUNED, or FAIL with a
``fail_reason``). After any failure it exits, so the next trial on the slot
runs in a clean process. It dies with the driver (:func:`sweeper.child.set_up`)."""

import os
import sys
import threading
from typing import Any, TextIO

from sweeper import child
from sweeper.errors import StopRequested
from sweeper.interrupt import StopToken
from sweeper.store import outage
from sweeper.worker import protocol


class Commands:
    """Reads driver commands on a thread, so that 'stop' arrives mid-trial: it requests
    the worker's stop token, which the training loop and any wait for the store watch."""

    def __init__(self, stream: TextIO) -> None:
        self.stream, self.stop = stream, StopToken()
        self._queue: list[dict[str, Any]] = []
        self._ready, self._closed = threading.Condition(), False
        threading.Thread(target=self._read, daemon=True, name="commands").start()

    def _read(self) -> None:
        for line in self.stream:
            if (msg := protocol.decode(line, self._malformed) if line.strip() else None) is None:
                continue
            if msg.get("op") == protocol.STOP:
                self.stop.request()
            with self._ready:
                self._queue.append(msg)
                self._ready.notify()
        # EOF: the driver is gone or done with us
        self.stop.request()
        with self._ready:
            self._closed = True
            self._ready.notify()

    @staticmethod
    def _malformed(line: str) -> None:
        note = f"skipped a malformed command line from the driver: {line!r}"
        print(f"sweeper: {note}", file=sys.stderr, flush=True)  # the slot log
        protocol.emit(protocol.WARN, text=note)

    def next(self) -> dict[str, Any] | None:
        with self._ready:
            while not self._queue and not self._closed and not self.stop.requested:
                self._ready.wait(timeout=1.0)
            while self._queue:
                if (msg := self._queue.pop(0)).get("op") != protocol.STOP:
                    return msg
            return None


def main() -> int:
    protocol.set_channel(child.answers())  # the driver relays Ctrl-C as 'stop' (sweeper.child)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # user models named by dotted path, like `python -m`
    commands = Commands(sys.stdin)
    if (init := commands.next()) is None or init.get("op") != protocol.INIT:
        return 2
    from sweeper.worker.trial import TrialRunner  # heavy imports (torch) after the handshake starts

    runner = TrialRunner(init, commands.stop)
    # a trial waiting out a storage outage makes no step: tell the driver's stall watchdog it lives
    outage.on_retry(lambda: protocol.emit(protocol.PROGRESS, waiting="storage"))
    protocol.emit(protocol.READY, pid=os.getpid(), threads=runner.threads)
    while (msg := commands.next()) is not None:
        if msg.get("op") != protocol.RUN:
            continue
        try:
            # a population's trials come as "trials" ([trial_id, number] pairs), one trial as its own
            trials = msg.get("trials") or [[msg["trial_id"], msg["number"]]]
            ok = runner.run([(int(i), int(n)) for i, n in trials], memory_limit_mb=msg.get("memory_limit_mb"))
        except StopRequested:  # stopped while the store was away: the trial stays RUNNING; a rerun runs it
            break
        if not ok or commands.stop.requested:
            break
    return 0


if __name__ == "__main__":
    sys.exit(child.main(main))
