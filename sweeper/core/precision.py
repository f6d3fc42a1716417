"""``train.precision`` -> autocast dtype and gradient scaler. AMP is a lookup, not a framework."""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from sweeper.errors import ConfigError

DTYPES: dict[str, torch.dtype | None] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}


@dataclass(frozen=True)
class Precision:
    name: str                  # resolved: "bf16" | "fp16" | "fp32"
    device_type: str           # "cuda" | "cpu"

    @property
    def dtype(self) -> torch.dtype | None:
        return DTYPES[self.name]

    def autocast(self) -> AbstractContextManager:
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def scaler(self) -> torch.amp.GradScaler:
        # only fp16 has too little exponent range to need loss scaling
        return torch.amp.GradScaler("cuda", enabled=self.name == "fp16")


def resolve_precision(requested: str, device: torch.device) -> Precision:
    """auto: bf16 on CUDA where supported, else fp16; fp32 on CPU."""
    if requested == "auto":
        if device.type != "cuda":
            return Precision("fp32", device.type)
        return Precision("bf16" if torch.cuda.is_bf16_supported() else "fp16", "cuda")
    if requested == "fp16" and device.type != "cuda":
        raise ConfigError(f"train.precision: fp16 needs a CUDA device (training on {device.type}); "
                          "use bf16 or fp32")
    if requested not in DTYPES:
        raise ConfigError(f"train.precision: expected auto, bf16, fp16 or fp32, got {requested!r}")
    return Precision(requested, device.type)
