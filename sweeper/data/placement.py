"""Where the panel lives while a trial trains: on the device, or pinned on the host.

The rule is a pure function of byte counts so it is testable without a GPU;
only ``free_device_bytes`` touches CUDA, and only for a CUDA device."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported by the package's __init__, which the driver reads without torch
    import torch

ON_DEVICE = "device"
PINNED_HOST = "pinned_host"
HOST = "host"


def placement(panel_bytes: int, free_bytes: int | None, share: float) -> str:
    """``"device"`` when the panel fits in ``share`` of the free device memory,
    ``"pinned_host"`` when it does not, ``"host"`` when there is no device (None)."""
    return HOST if free_bytes is None else ON_DEVICE if panel_bytes <= share * free_bytes else PINNED_HOST


def free_device_bytes(device: torch.device) -> int | None:
    """Free memory of a CUDA device; None for any other device (no query made)."""
    if device.type != "cuda":
        return None
    import torch

    return int(torch.cuda.mem_get_info(device)[0])  # (free, total)
