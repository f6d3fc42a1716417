"""The driver <-> worker protocol: JSON lines over the worker's pipes.

Driver -> worker (the worker's stdin), one object per line with an ``op``:
``init`` (config, storage, study, run_dir, artifacts, driver, slot), ``run``
(trial_id, number) and ``stop``.

Worker -> driver (a private copy of the worker's stdout; the stdout file
descriptor itself is pointed at the slot log so that a stray print cannot
corrupt the stream), one object per line with an ``ev``: ``ready`` (pid,
threads), ``start`` (number, params), ``epoch`` (number, epoch, metrics) and
``end`` (number, state, value, reason, metrics).

Both sides import this module, and only this one, to speak to each other.
"""
from __future__ import annotations

import json
import sys
from typing import Any, TextIO

# ops (driver -> worker)
INIT, RUN, STOP = "init", "run", "stop"
# events (worker -> driver)
READY, START, EPOCH, END = "ready", "start", "epoch", "end"

_channel: TextIO = sys.stdout


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, default=_json_default) + "\n").encode()


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy and torch scalars
        return obj.item()
    return str(obj)


class LineDecoder:
    """Splits a byte stream into complete JSON messages, keeping a partial last line."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]


def set_channel(stream: TextIO) -> None:
    """Where :func:`emit` writes: the worker's private copy of its stdout."""
    global _channel
    _channel = stream


def emit(event: str, **fields: Any) -> None:
    """Send one event to the driver (from the worker process)."""
    _channel.write(json.dumps({"ev": event, **fields}, default=_json_default) + "\n")
    _channel.flush()
