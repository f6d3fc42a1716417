"""Devices: the GPUs this process sees (:mod:`~sweeper.devices.gpus`, read through
:mod:`~sweeper.devices.nvml`, or the fakes of :mod:`~sweeper.devices.fake`), the worker slots
planned on them (:mod:`~sweeper.devices.slots`), and the arithmetic of packing trials by their
memory (:mod:`~sweeper.devices.room`). No CUDA context, ever."""

from sweeper.devices.gpus import environment_summary, list_gpus, probe, telemetry
from sweeper.devices.nvml import GPU, NvmlProbe
from sweeper.devices.slots import Slot, cpu_count, cpu_slots, gpu_slots, plan_slots

__all__ = ["GPU", "NvmlProbe", "Slot", "cpu_count", "cpu_slots", "environment_summary", "gpu_slots",
           "list_gpus", "plan_slots", "probe", "telemetry"]
