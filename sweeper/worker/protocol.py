"""The driver <-> worker protocol: JSON lines over the worker's pipes.

Driver -> worker (the worker's stdin), one object per line with an ``op``: ``init`` (config, storage, study,
run_dir, artifacts, driver, slot), ``run`` (trial_id, number; with ``trials_per_gpu: auto`` also
memory_limit_mb, the trial's allotment of its GPU in MB) and ``stop``.

Worker -> driver (a private copy of the worker's stdout; the stdout file descriptor itself is pointed at the
slot log so that a stray print cannot corrupt the stream), one object per line with an ``ev``: ``ready``
(pid, threads), ``start`` (number, params), ``progress`` (number, steps: training steps so far; sent at most
every few seconds while steps or evaluation batches go on, for the driver's stall watchdog), ``epoch``
(number, epoch, metrics), ``warn`` (text: one line about something that went wrong without ending the trial,
such as a failed heartbeat or artifact upload), ``memory`` (number, peak_mb: the device memory the trial was
measured to need, sent when its batch probe has measured it, for packing trials on a GPU) and ``end``
(number, state, value, reason, metrics).

Both sides import this module, and only this one, to speak to each other."""

import json
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, TextIO

# ops (driver -> worker)
INIT, RUN, STOP = "init", "run", "stop"
# events (worker -> driver)
READY, START, PROGRESS, EPOCH = "ready", "start", "progress", "epoch"
WARN, MEMORY, END = "warn", "memory", "end"

_channel: TextIO | None = None  # None: sys.stdout as it is at the time of writing
_lock = threading.Lock()  # the heartbeat thread warns while the training thread reports


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, default=_json_default) + "\n").encode()


def _json_default(obj: Any) -> Any:
    return obj.item() if hasattr(obj, "item") else str(obj)  # item(): numpy and torch scalars


class LineDecoder:
    """Splits a byte stream into complete JSON messages, keeping a partial last line.

    A line that is not a JSON object is handed to ``on_error`` and skipped: one
    garbled line must not cost the trial, let alone the driver."""

    def __init__(self, on_error: Callable[[str], None] = lambda line: None) -> None:
        self._buf, self.on_error = b"", on_error

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        messages = (decode(line.decode(errors="replace"), self.on_error) for line in lines if line.strip())
        return [m for m in messages if m is not None]


def decode(line: str, on_error: Callable[[str], None]) -> dict[str, Any] | None:
    """One message, or None (after ``on_error``) when the line is not a JSON object."""
    try:
        message = json.loads(line)
    except ValueError:
        message = None
    if not isinstance(message, dict):
        on_error(line.rstrip()[:500])
        return None
    return message


def set_channel(stream: TextIO) -> None:
    """Where :func:`emit` writes: the worker's private copy of its stdout."""
    global _channel
    _channel = stream


def emit(event: str, **fields: Any) -> None:
    """Send one event to the driver (from the worker process), one whole line at a time.

    A closed pipe means the driver is gone (killed: this process's parent-death signal may come a moment
    later). The worker exits at once, as that signal would have it, with one line in its slot log: the trial
    stays RUNNING, and the stale-trial rule fails it as interrupted, not this worker with a traceback."""
    line = json.dumps({"ev": event, **fields}, default=_json_default) + "\n"
    with _lock:
        channel = _channel or sys.stdout
        try:
            channel.write(line)
            channel.flush()
        except BrokenPipeError:
            note = "sweeper: the driver is gone (its event pipe is closed); exiting"
            print(note, file=sys.stderr, flush=True)
            os._exit(1)
