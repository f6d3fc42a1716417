"""The memory a trial is measured by (sweeper.core.device), a worker's trial device
(sweeper.devices.fake.trial_device) and the fake GPU's trial memory,
through the real training core: the peaks a trial on a fake GPU reports, and its OOM."""
from __future__ import annotations

import math

import pytest
import torch

from sweeper.core import NullHook, train
from sweeper.core.device import CudaTrialMemory, HostMemory, trial_memory
from sweeper.devices.fake import FakeSlot, FakeTrialMemory, RealDevice, trial_device
from sweeper.errors import OutOfMemory
from toy_panel import toy_config, toy_panel


class Recorder(NullHook):
    """An epoch hook that keeps what train() tells it, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, float]] = []

    def on_epoch(self, epoch: int, rows: list) -> bool:
        self.events.append(("epoch", rows[0]["peak_mem_mb"]))
        return False

    def on_probe(self, peak_mb: float) -> None:
        self.events.append(("probe", peak_mb))


@pytest.fixture
def fake_slot(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SWEEPER_FAKE_GPU_SLOT", "1")
    monkeypatch.delenv("SWEEPER_FAKE_TRIAL_MEMORY_MB", raising=False)


def test_a_fake_slot_trains_on_the_cpu(fake_slot, monkeypatch: pytest.MonkeyPatch) -> None:
    device = trial_device()
    assert isinstance(device, FakeSlot) and device.torch_device == "cpu"
    assert isinstance(device.memory(1500.0), HostMemory)  # no fake trial memory: the CPU's own
    monkeypatch.setenv("SWEEPER_FAKE_TRIAL_MEMORY_MB", "1200")
    assert device.memory(1500.0) == FakeTrialMemory(1200.0, 1500.0)


def test_a_real_slot_trains_where_torch_sees_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWEEPER_FAKE_GPU_SLOT", raising=False)
    monkeypatch.setenv("SWEEPER_FAKE_TRIAL_MEMORY_MB", "1200")  # only a fake GPU's slot reads it
    device = trial_device()
    assert device == RealDevice("cuda" if torch.cuda.is_available() else "cpu")
    assert isinstance(RealDevice("cpu").memory(1500.0), HostMemory)
    assert RealDevice("cuda").memory(1500.0) == CudaTrialMemory(torch.device("cuda"), 1500.0)
    assert trial_memory(torch.device("cuda", 0)) == CudaTrialMemory(torch.device("cuda", 0), None)


def test_a_fake_trial_reports_its_peak_before_the_first_epoch_and_every_epoch() -> None:
    hook = Recorder()
    result = train(toy_config(epochs=2), toy_panel(), device="cpu", hook=hook,
                   memory=FakeTrialMemory(1200.0, 1500.0))
    assert hook.events == [("probe", 1200.0), ("epoch", 1200.0), ("epoch", 1200.0)]
    assert result.metrics["peak_mem_mb"] == 1200.0
    assert math.isnan(result.metrics["probe_peak_mem_mb"])  # nothing was probed: it trains on the CPU
    assert result.metrics["micro_batch_size"] == result.metrics["batch_size"] == 64


def test_a_fake_trial_allotted_less_than_it_needs_runs_out_of_memory_at_its_start() -> None:
    hook = Recorder()
    with pytest.raises(OutOfMemory, match=r"^fake GPU: the trial needs 1200 MB and was allotted 1000 MB "
                                          r"\(SWEEPER_FAKE_TRIAL_MEMORY_MB\)$"):
        train(toy_config(epochs=2), toy_panel(), device="cpu", hook=hook,
              memory=FakeTrialMemory(1200.0, 1000.0))
    assert hook.events == []
    # no margin: a trial allotted exactly its need fits, and one never allotted anything too
    for allotted in (1200.0, None):
        assert FakeTrialMemory(1200.0, allotted).start_peak_mb(math.nan) == 1200.0


def test_the_cpu_default_probes_nothing_and_reports_the_resident_peak() -> None:
    hook = Recorder()
    result = train(toy_config(epochs=1), toy_panel(), device="cpu", hook=hook)
    assert [kind for kind, _ in hook.events] == ["epoch"]  # no probe, so no peak before the epoch
    assert result.metrics["peak_mem_mb"] > 10  # MB resident: a Python process with torch


def test_cuda_memory_reads_the_allocators_peak_and_probes_within_the_allotment(monkeypatch) -> None:
    calls: list[tuple[str, torch.device]] = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: calls.append(("reset", device)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 1536 * 2**20)
    memory = trial_memory(torch.device("cuda", 0), 2000.0)
    memory.reset_peak()
    assert memory.peak_mb() == 1536.0 and calls == [("reset", torch.device("cuda", 0))]
    assert memory.start_peak_mb(700.0) == 700.0 and math.isnan(memory.start_peak_mb(math.nan))
    reader = memory.reader()
    assert reader.device == torch.device("cuda", 0) and reader.limit_bytes == 2000 * 2**20
