"""Who runs a trial: host, driver process and run, and whether that driver is still alive."""
from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Identity:
    """Who runs a trial: the host id, the driver's pid, a per-run driver id, and the process table that pid
    belongs to (boot id and pid namespace), so that only a driver that can see a pid ever judges it dead."""

    host: str
    pid: int
    driver_id: str
    pid_ns: str = ""

    @classmethod
    def current(cls) -> Identity:
        # two pods on one node share the boot id but not the pid namespace; two
        # machines given the same SWEEPER_HOST_ID share neither
        try:
            boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
            pid_ns = f"{boot}:{os.readlink('/proc/self/ns/pid')}"
        except OSError:
            pid_ns = ""
        return cls(host=host_id(), pid=os.getpid(), driver_id=uuid.uuid4().hex[:12], pid_ns=pid_ns)

    def attrs(self) -> dict[str, Any]:  # host last: each is its own write, and a host names a whole identity
        return {"driver_pid": self.pid, "driver_id": self.driver_id, "pid_ns": self.pid_ns, "host": self.host}

    def sees_dead(self, host: Any, pid: Any, pid_ns: Any) -> bool:
        """Whether process ``pid`` on ``host`` is certainly gone: judged only in its own process table."""
        return host == self.host and pid_ns == self.pid_ns and pid is not None and not pid_alive(int(pid))


def host_id() -> str:
    """This host's id: ``SWEEPER_HOST_ID`` (two pods, or a host renamed), else its name. The one
    home of the rule: the driver's identity and the store's connection name both use it."""
    return os.environ.get("SWEEPER_HOST_ID") or socket.gethostname()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True
