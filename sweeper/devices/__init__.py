"""Devices: the GPUs NVML reports (:mod:`~sweeper.devices.nvml`) and the worker slots
planned on them (:mod:`~sweeper.devices.slots`). No CUDA context, ever."""
from __future__ import annotations

from sweeper.devices.nvml import GPU, NvmlProbe, environment_summary, list_gpus, probe, telemetry
from sweeper.devices.slots import Slot, cpu_count, cpu_slots, gpu_slots, plan_slots

__all__ = ["GPU", "NvmlProbe", "Slot", "cpu_count", "cpu_slots", "environment_summary", "gpu_slots", "list_gpus",
           "plan_slots", "probe", "telemetry"]
