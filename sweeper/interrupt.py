"""The stop token: one sweep's request to stop, handed to everything that waits (the driver's
loop, the claim lock, the store's outage policy, a worker's waits), so that Ctrl-C and SIGTERM
work at any moment, not only between trials.

In a driver the token is also the SIGINT/SIGTERM handler: during set-up a signal ends the command at once;
once the dispatch loop runs, the first signal asks for a drain (running trials stop at their next step) and
the second for a kill. In a worker the driver's ``stop`` command or the end of its stdin requests the stop.
A reader of stdout or stderr that leaves (``| head``) stops nothing: :func:`unheard`."""

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TextIO

from sweeper.errors import StopRequested

POLL_S = 0.1  # how often a wait looks at the token


class StopToken:
    """Requested by a signal or a command; counted, so that a second signal can escalate. ``raise_at_once``:
    a signal raises StopRequested where the process is (set-up, before the loop has anything to drain).

    Lock-free on purpose: the handler runs in the main thread between two bytecodes, maybe inside
    a wait on this very token, so it must take no lock a wait may hold (a ``threading.Event``
    would deadlock there). Waits poll a plain flag instead."""

    def __init__(self) -> None:
        self.requested, self.count = False, 0
        self.signum: int | None = None
        self.raise_at_once = False

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        """The SIGINT/SIGTERM handler."""
        self.request(signum)
        if self.raise_at_once:
            raise StopRequested(signum)

    def hung_up(self, signum: int, frame: FrameType | None) -> None:
        """The SIGHUP handler: the terminal is gone (closed, an ssh session lost), so what would be printed
        to it goes nowhere (a write to a hung-up terminal fails) and the sweep drains as on SIGTERM; the
        slot logs keep every trial's lines."""
        quiet = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            os.dup2(quiet, fd)
        os.close(quiet)
        self(signum, frame)

    def request(self, signum: int | None = None) -> None:
        self.count += 1
        self.signum = self.signum or signum
        self.requested = True

    def check(self) -> None:
        if self.requested:
            raise StopRequested(self.signum or signal.SIGINT)

    def wait(self, seconds: float) -> None:
        """Sleep ``seconds``, giving up with StopRequested as soon as a stop is requested."""
        deadline = time.monotonic() + seconds
        self.check()
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(POLL_S, left))
            self.check()


class _Never(StopToken):
    """The token of code that nothing stops (read-only commands, library calls): a null object."""

    def request(self, signum: int | None = None) -> None:
        return None


NEVER: StopToken = _Never()


class _Unheard:
    """``sys.stdout`` or ``sys.stderr`` while a command runs. When its reader leaves (``| head``, ``2>&1 |
    head``, a ``| tee`` that Ctrl-C ended) its fd is pointed at /dev/null and the command goes on unheard:
    click would exit 1 at the next line (a sweep's running trials failed as interrupted)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding: the stream's own
        if name == "stream":  # an instance made without __init__ (a copy) has none: no endless recursion
            raise AttributeError(name)
        return getattr(self.stream, name)

    def write(self, text: str) -> int:
        return self._heard(self.stream.write, text)

    def flush(self) -> None:
        self._heard(self.stream.flush)

    def _heard(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except BrokenPipeError:  # again, into /dev/null: what the stream still buffers goes there too
            os.dup2(null := os.open(os.devnull, os.O_WRONLY), self.stream.fileno())
            os.close(null)
            return call(*args)


@contextmanager
def unheard() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` as :class:`_Unheard`: around every command (the CLI's ``main``:
    its error and interrupted lines come after the command) and a library's ``dispatch.run``."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (_Unheard(s) if s is not None else s for s in saved)  # None: fd 1 or 2 closed
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
