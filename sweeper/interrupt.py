"""The process's stop request, visible to waits far below the driver.

The driver's SIGINT/SIGTERM handler records the request here; a wait that can
last (the claim lock, a storage call retried through an outage) polls
:func:`check` and gives up with :class:`~sweeper.errors.StopRequested`, so that
Ctrl-C works at any moment, not only between trials.
"""
from __future__ import annotations

import threading

from sweeper.errors import StopRequested

_requested = threading.Event()


def request_stop() -> None:
    _requested.set()


def clear() -> None:
    """A new sweep in this process starts with no request pending."""
    _requested.clear()


def stop_requested() -> bool:
    return _requested.is_set()


def check() -> None:
    """Raise StopRequested when a stop was requested."""
    if _requested.is_set():
        raise StopRequested("stop requested")
