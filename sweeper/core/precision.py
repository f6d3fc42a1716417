"""``train.precision`` -> autocast dtype. AMP is a lookup, not a framework."""

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from sweeper.devices import fake
from sweeper.errors import fp16_needs_cuda

DTYPES: dict[str, torch.dtype | None] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}
NATIVE_BF16_MAJOR = 8  # compute capability 8.0 (Ampere) and later have bf16 tensor cores


@dataclass(frozen=True)
class Precision:
    name: str                  # resolved: "bf16" | "fp16" | "fp32"
    device_type: str           # "cuda" | "cpu"

    @property
    def dtype(self) -> torch.dtype | None:
        return DTYPES[self.name]

    def autocast(self) -> AbstractContextManager:
        return nullcontext() if self.dtype is None else torch.autocast(self.device_type, dtype=self.dtype)


def native_bf16(device: torch.device) -> bool:
    """True where bf16 runs on the hardware. ``is_bf16_supported()`` alone also says yes
    where bf16 is emulated (V100, T4), which is slower than fp16 with a scaler."""
    with torch.cuda.device(device):
        try:
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:  # torch before 2.3 has no including_emulation (nor counted emulation)
            return torch.cuda.get_device_capability(device)[0] >= NATIVE_BF16_MAJOR


def measured_on(requested: str, device: torch.device) -> bool:
    """Whether ``auto`` is measured on ``device`` (fp32 against bf16, :func:`sweeper.core.stack_size.\
measure_precision`): a CPU with native bf16 (AVX512-BF16, AMX), where bf16 can be much faster or much
    slower by model (Xeon with AMX: LSTM 1.9x faster, transformer 5x slower); oneDNN's probe (none public)."""
    if requested != "auto" or device.type != "cpu":
        return False
    forced = fake.cpu_bf16()
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()) if forced is None else forced


def resolve_precision(requested: str, device: torch.device) -> Precision:
    """auto: bf16 on CUDA where it is native, else fp16 (with a GradScaler); fp32 on the CPU (where
    :func:`measured_on`, the measurement pins ``train.precision`` before training)."""
    if requested == "auto":
        if device.type != "cuda":
            return Precision("fp32", device.type)
        return Precision("bf16" if native_bf16(device) else "fp16", "cuda")
    if requested == "fp16" and device.type != "cuda":
        raise fp16_needs_cuda("train.precision", device.type)
    return Precision(requested, device.type)
