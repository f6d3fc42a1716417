from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from dataclasses import dataclass

import pytest

from conftest import real_env
from sweeper.config import DevicesConfig
from sweeper.devices import GPU, cpu_slots, environment_summary, list_gpus, plan_slots, probe, telemetry
from sweeper.devices import slots as devices
from sweeper.errors import DeviceError

UUID = "GPU-00000000-0000-4000-8000-00000000000{}"


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch):
    """``fakes(4, busy="1,3")`` sets the fake-GPU environment; 8 cores for predictable threads."""
    monkeypatch.setattr(devices, "cpu_count", lambda: 8)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("SWEEPER_FAKE_GPU_MEMORY_MB", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # a GPU runner's own

    def set_fakes(n: int, busy: str = "") -> None:
        monkeypatch.setenv("SWEEPER_FAKE_GPUS", str(n))
        monkeypatch.setenv("SWEEPER_FAKE_BUSY", busy)

    return set_fakes


# ------------------------------------------------------------------ fakes


def test_fake_gpus_are_listed(fakes) -> None:
    fakes(3, busy="2")
    gpus = list_gpus()
    assert [g.uuid for g in gpus] == [UUID.format(k) for k in range(3)]
    assert {g.name for g in gpus} == {"Fake GPU"} and all(g.total_mb == 81920 and g.bf16 for g in gpus)
    assert [g.util for g in gpus] == [0, 0, 100]
    assert gpus[2].processes and gpus[2].processes[0]["pid"] != os.getpid() and gpus[2].used_mb > 1024


def test_bad_fake_count_is_a_device_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWEEPER_FAKE_GPUS", "two")
    with pytest.raises(DeviceError, match="SWEEPER_FAKE_GPUS: expected a whole number >= 0, got 'two'"):
        list_gpus()


def test_slot_env_gives_each_slot_exactly_one_gpu_by_uuid(fakes) -> None:
    fakes(2)
    slots = plan_slots(DevicesConfig())
    assert [(s.id, s.kind, s.label, s.threads) for s in slots] == [(0, "gpu", "gpu0", 4), (1, "gpu", "gpu1", 4)]
    assert slots[1].env == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": UUID.format(1),
        "OMP_NUM_THREADS": "4",
        "MKL_NUM_THREADS": "4",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "SWEEPER_FAKE_GPU_SLOT": "1",
    }
    assert slots[0].gpu is not None and slots[0].gpu.index == 0


def test_user_allocator_setting_is_left_alone(fakes, monkeypatch: pytest.MonkeyPatch) -> None:
    fakes(1)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in plan_slots(DevicesConfig())[0].env


def test_trials_per_gpu(fakes) -> None:
    fakes(2)
    slots = plan_slots(DevicesConfig(trials_per_gpu=3))
    assert [s.label for s in slots] == ["gpu0#0", "gpu0#1", "gpu0#2", "gpu1#0", "gpu1#1", "gpu1#2"]
    assert [s.id for s in slots] == list(range(6))
    assert [s.env["CUDA_VISIBLE_DEVICES"][-1] for s in slots] == list("000111")
    assert {s.threads for s in slots} == {1}  # 8 cores // 6 slots


def test_trials_per_gpu_auto_plans_the_most_packing_may_run(fakes) -> None:
    fakes(2)
    slots = plan_slots(DevicesConfig(trials_per_gpu="auto"))  # 8 per GPU unless max_trials_per_gpu says
    assert [s.label for s in slots] == [f"gpu{g}#{k}" for g in range(2) for k in range(8)]
    assert {s.threads for s in slots} == {1} and [s.id for s in slots] == list(range(16))
    capped = plan_slots(DevicesConfig(trials_per_gpu="auto", max_trials_per_gpu=2))
    assert [s.label for s in capped] == ["gpu0#0", "gpu0#1", "gpu1#0", "gpu1#1"]
    assert {s.threads for s in capped} == {2}  # 8 cores // 4 slots


def test_fake_gpu_memory(fakes, monkeypatch: pytest.MonkeyPatch) -> None:
    fakes(2, busy="1")
    monkeypatch.setenv("SWEEPER_FAKE_GPU_MEMORY_MB", "4000")
    assert [(g.total_mb, g.used_mb, g.free_mb) for g in list_gpus()] == [(4000, 0, 4000), (4000, 4000, 0)]
    monkeypatch.setenv("SWEEPER_FAKE_GPU_MEMORY_MB", "4 GB")
    with pytest.raises(DeviceError, match="SWEEPER_FAKE_GPU_MEMORY_MB: expected a whole number >= 0, got '4 GB'"):
        list_gpus()


def test_select_by_index_and_uuid(fakes) -> None:
    fakes(4)
    slots = plan_slots(DevicesConfig(gpus=[3, UUID.format(1), "2"]))
    assert [s.gpu.index for s in slots] == [3, 1, 2]
    # UUID without the GPU- prefix, any case; the same GPU twice is one GPU
    bare = UUID.format(1).removeprefix("GPU-").upper()
    assert [s.gpu.index for s in plan_slots(DevicesConfig(gpus=[1, bare]))] == [1]


def test_unknown_index_names_it_and_lists_available(fakes) -> None:
    fakes(2)
    with pytest.raises(DeviceError) as err:
        plan_slots(DevicesConfig(gpus=[0, 5]))
    message = str(err.value)
    assert message.startswith("devices.gpus: no GPU with index 5; available: ")
    assert f"0: Fake GPU {UUID.format(0)}" in message and f"1: Fake GPU {UUID.format(1)}" in message


def test_unknown_uuid_names_it(fakes) -> None:
    fakes(1)
    with pytest.raises(DeviceError, match=r"no GPU with UUID 'GPU-dead-beef'; available: 0: Fake GPU"):
        plan_slots(DevicesConfig(gpus=["GPU-dead-beef"]))


def test_requested_gpu_without_any_gpu(fakes) -> None:
    fakes(0)
    with pytest.raises(DeviceError, match="no GPU with index 0; no GPU was found; use devices.gpus: auto or none"):
        plan_slots(DevicesConfig(gpus=[0]))


def test_skip_busy(fakes) -> None:
    fakes(4, busy="1,3")
    assert [s.gpu.index for s in plan_slots(DevicesConfig(skip_busy=True))] == [0, 2]
    assert [s.gpu.index for s in plan_slots(DevicesConfig(skip_busy=False))] == [0, 1, 2, 3]
    assert [s.gpu.index for s in plan_slots(DevicesConfig(gpus=[3, 2], skip_busy=True))] == [2]


def test_skip_busy_by_memory_alone(fakes, monkeypatch: pytest.MonkeyPatch) -> None:
    fakes(2)
    gpus = list_gpus()
    gpus[0].used_mb = 2000  # e.g. a process in another container that NVML can't list
    monkeypatch.setattr(devices, "probe", lambda: devices.NvmlProbe(gpus, fake=True))
    assert [s.gpu.index for s in plan_slots(DevicesConfig(skip_busy=True))] == [1]
    assert [s.gpu.index for s in plan_slots(DevicesConfig(skip_busy=True, busy_memory_mb=4000))] == [0, 1]


def test_skip_busy_with_nothing_left_explains(fakes) -> None:
    fakes(2, busy="0,1")
    with pytest.raises(DeviceError) as err:
        plan_slots(DevicesConfig(skip_busy=True))
    assert str(err.value) == (
        "devices.skip_busy: every requested GPU is busy: GPU 0 (1 process(es)), GPU 1 (1 process(es)); "
        "wait for them to free up, raise devices.busy_memory_mb (now 1024), or set devices.skip_busy: false"
    )


def test_none_gives_cpu_slots_even_with_gpus(fakes) -> None:
    fakes(2)
    slots = plan_slots(DevicesConfig(gpus="none"))
    assert [(s.kind, s.label, s.threads, s.gpu) for s in slots] == [("cpu", f"cpu{k}", 1, None) for k in range(8)]
    assert slots[0].env == {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@pytest.mark.parametrize(
    "cores,workers,expected",
    [(8, "auto", (8, 1)), (2, "auto", (2, 1)), (1, "auto", (1, 1)), (32, "auto", (8, 4)), (16, 3, (3, 5)), (2, 4, (4, 1)), (2, 2, (2, 1))],
)
def test_cpu_slot_thread_split(monkeypatch: pytest.MonkeyPatch, cores: int, workers, expected) -> None:
    monkeypatch.setattr(devices, "cpu_count", lambda: cores)
    slots = cpu_slots(workers)
    assert (len(slots), slots[0].threads) == expected
    assert all(s.env["OMP_NUM_THREADS"] == str(expected[1]) for s in slots)


def test_telemetry_rows(fakes) -> None:
    fakes(2, busy="1")
    rows = telemetry()
    assert [(r["index"], r["uuid"], r["util"], r["mem_used_mb"], r["mem_total_mb"], r["n_procs"]) for r in rows] == [
        (0, UUID.format(0), 0, 0, 81920, 0),
        (1, UUID.format(1), 100, 30000, 81920, 1),
    ]
    assert rows[0]["time"] == rows[1]["time"] > 1.7e9
    fakes(0)
    assert telemetry() == []


def test_environment_summary_is_json_safe(fakes) -> None:
    import torch

    fakes(1)
    summary = json.loads(json.dumps(environment_summary()))
    assert summary["torch"] == torch.__version__ and summary["torch_cuda"] == torch.version.cuda
    assert summary["gpus"] == [{"index": 0, "name": "Fake GPU", "uuid": UUID.format(0), "total_mb": 81920}]


# ------------------------------------------------------------------ NVML path, with a stand-in library


@dataclass
class _Mem:
    total: int
    free: int
    used: int


class FakeNvml(types.ModuleType):
    """Just enough of pynvml to drive the real reading code; counts init/shutdown."""

    class NVMLError(Exception):
        pass

    class NVMLError_NoPermission(NVMLError):
        pass

    nvmlMemory_v2 = 0x2000028

    def __init__(self, fail_init: bool = False, fail_count: bool = False, forbidden: tuple[int, ...] = ()) -> None:
        super().__init__("pynvml")
        self.fail_init, self.fail_count, self.forbidden = fail_init, fail_count, forbidden
        self.inits = self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise self.NVMLError("Driver Not Loaded")
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        if self.fail_count:
            raise self.NVMLError("Unknown Error")
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetMemoryInfo(self, h: int, version: int | None = None) -> _Mem:
        gib = 1 << 30
        return _Mem(total=80 * gib, free=70 * gib, used=10 * gib) if version else _Mem(80 * gib, 69 * gib, 11 * gib)

    def nvmlDeviceGetUUID(self, h: int) -> bytes | str:
        if h in self.forbidden:
            raise self.NVMLError_NoPermission("Insufficient Permissions")
        return b"GPU-aaaa" if h == 0 else "GPU-bbbb"  # old bindings return bytes

    def nvmlDeviceGetName(self, h: int) -> str:
        return ["NVIDIA H100 80GB HBM3", "Tesla V100"][h]

    def nvmlDeviceGetUtilizationRates(self, h: int):
        if h == 1:
            raise self.NVMLError("Not Supported")
        return types.SimpleNamespace(gpu=37)

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return [(9, 0), (7, 0)][h]

    def nvmlDeviceGetComputeRunningProcesses(self, h: int):
        if h == 1:
            return []
        return [types.SimpleNamespace(pid=4321, usedGpuMemory=512 << 20), types.SimpleNamespace(pid=99, usedGpuMemory=None)]


def test_nvml_path_reads_every_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWEEPER_FAKE_GPUS", raising=False)
    nvml = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    found = probe()
    assert (nvml.inits, nvml.shutdowns) == (1, 1)
    assert found.driver == "550.54.15" and found.error is None
    assert found.gpus == [
        GPU(0, "GPU-aaaa", "NVIDIA H100 80GB HBM3", 81920, 71680, 10240, 37,
            [{"pid": 4321, "used_mb": 512}, {"pid": 99, "used_mb": None}], True, (9, 0)),
        GPU(1, "GPU-bbbb", "Tesla V100", 81920, 71680, 10240, None, [], False, (7, 0)),
    ]
    slot = plan_slots(DevicesConfig(gpus=["GPU-bbbb"]))[0]
    assert slot.env["CUDA_VISIBLE_DEVICES"] == "GPU-bbbb" and "SWEEPER_FAKE_GPU_SLOT" not in slot.env


def test_nvml_without_driver_means_cpu_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWEEPER_FAKE_GPUS", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(fail_init=True))
    assert list_gpus() == []
    assert "Driver Not Loaded" in probe().error
    assert {s.kind for s in plan_slots(DevicesConfig())} == {"cpu"}
    with pytest.raises(DeviceError, match=r"no GPU with index 1; no GPU was found \(NVML unavailable \(Driver Not Loaded\)"):
        plan_slots(DevicesConfig(gpus=[1]))


def test_nvml_failure_mid_read_still_shuts_down(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWEEPER_FAKE_GPUS", raising=False)
    nvml = FakeNvml(fail_count=True)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    found = probe()
    assert found.gpus == [] and "Unknown Error" in found.error
    assert (nvml.inits, nvml.shutdowns) == (1, 1)


def test_gpus_this_process_may_not_open_are_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    # Slurm's ConstrainDevices: NVML counts every GPU of the node but refuses the other jobs'
    monkeypatch.delenv("SWEEPER_FAKE_GPUS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(forbidden=(0,)))
    found = probe()
    assert [g.uuid for g in found.gpus] == ["GPU-bbbb"] and found.error is None
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in plan_slots(DevicesConfig())] == ["GPU-bbbb"]


# ------------------------------------------------------------------ no CUDA context


@pytest.mark.slow
def test_reading_gpus_creates_no_cuda_context() -> None:
    code = (
        "import torch, sweeper.devices as d\n"
        "from sweeper.config import DevicesConfig\n"
        "d.list_gpus(); d.telemetry(); d.environment_summary(); d.plan_slots(DevicesConfig())\n"
        "print(torch.cuda.is_initialized())\n"
    )
    env = real_env()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("visible, expected", [
    ("1,3", [1, 3]),                       # Slurm's allocation by index
    ("3,1", [3, 1]),                       # in CUDA's order, not NVML's
    (UUID.format(2), [2]),              # by UUID
    ("2,9,0", [2]),                        # like CUDA, the list ends at the first miss
    ("", []),                              # no GPU for this job: CPU slots
    ("-1", []),                            # the common way to hide them all
])
def test_auto_keeps_to_the_drivers_cuda_visible_devices(fakes, monkeypatch: pytest.MonkeyPatch, visible, expected):
    fakes(4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    slots = plan_slots(DevicesConfig(gpus="auto"))
    if not expected:
        assert {s.kind for s in slots} == {"cpu"}
        return
    uuids = [g.uuid for g in list_gpus()]
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in slots] == [uuids[i] for i in expected]


@pytest.mark.parametrize("visible, gpus, message", [
    # a typo or a stale variable ran the whole sweep on CPU slots without a word
    ("9", "auto", "CUDA_VISIBLE_DEVICES=9 names none of the 4 GPUs found (indices 0-3, or UUIDs); fix or unset "
                  "it, or use devices.gpus: none"),
    # a list was read as NVML's indices past the allocation: workers on another job's GPUs
    ("2,3", [0, 3], "devices.gpus: GPU 0 is outside CUDA_VISIBLE_DEVICES=2,3 (GPUs 2, 3 by NVML's index); "
                    "name one of those, or use devices.gpus: auto"),
    (None, [], "devices.gpus: an empty list names no GPU; list GPUs, or use auto or none"),  # no slot: a hang
])
def test_gpus_that_no_slot_or_another_jobs_gpus_are_refused(fakes, monkeypatch: pytest.MonkeyPatch, visible,
                                                            gpus, message):
    fakes(4)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    with pytest.raises(DeviceError) as exc:
        plan_slots(DevicesConfig(gpus=gpus))
    assert str(exc.value) == message
    if visible == "2,3":  # within it, a list still picks by NVML's index; a UUID names its GPU in any order
        assert [s.label for s in plan_slots(DevicesConfig(gpus=[3]))] == ["gpu3"]
        assert [s.label for s in plan_slots(DevicesConfig(gpus=[list_gpus()[0].uuid]))] == ["gpu0"]
    assert [s.kind for s in plan_slots(DevicesConfig(gpus="none"))] == ["cpu"] * len(cpu_slots("auto"))


def test_auto_without_cuda_visible_devices_takes_every_gpu(fakes, monkeypatch: pytest.MonkeyPatch):
    fakes(3)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert len(plan_slots(DevicesConfig(gpus="auto"))) == 3
