"""The stop token: one sweep's request to stop, handed to everything that waits (the driver's
loop, the claim lock, the store's outage policy, a worker's waits), so that Ctrl-C and SIGTERM
work at any moment, not only between trials.

In a driver the token is also the SIGINT/SIGTERM handler: during set-up a signal ends the command at once;
once the dispatch loop runs, the first signal asks for a drain (running trials stop at their next step) and
the second for a kill. In a worker the driver's ``stop`` command or the end of its stdin requests the stop.
"""
from __future__ import annotations

import os
import signal
import time
from types import FrameType

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
        """Raise StopRequested when a stop was requested."""
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
