"""What a host keeps of its run-time measurements (the stack size, the CPU eval batch), so that a run of the
same shape on the same machine (``sweeper train`` again, a new study) does not pay for one twice: a folder per
kind under the panel cache's root, one JSON file per key. A key is what the measurement depends on plus the
machine that made it (the device and its name, the CPU's model, torch's threads and version); an entry that
cannot be read is measured again, one that cannot be written is only measured again."""

import contextlib
import hashlib
import json
import platform
from pathlib import Path
from typing import Any

import torch

from sweeper.atomic import write_text


def key(what: dict[str, Any], device: torch.device) -> str:
    """sha256 of ``what`` and the machine measuring on ``device``."""
    machine = {"device": str(device), "device_name": device_name(device), "threads": torch.get_num_threads(),
               "torch": torch.__version__}
    return hashlib.sha256(json.dumps({**what, **machine}, sort_keys=True, default=str).encode()).hexdigest()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def read(folder: Path, name: str) -> dict[str, Any] | None:
    """The entry kept under ``name``, or None (none, or unreadable)."""
    with contextlib.suppress(OSError, ValueError):
        return kept if isinstance(kept := json.loads((folder / f"{name}.json").read_text()), dict) else None
    return None


def keep(folder: Path, name: str, entry: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # (a DiskFull too)
        write_text(folder / f"{name}.json", json.dumps(entry))
