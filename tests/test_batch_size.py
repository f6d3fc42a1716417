from __future__ import annotations

import weakref

import pytest
import torch

import sweeper.core.batch_size as bs
from sweeper.core.batch_size import find_micro_batch, is_oom
from sweeper.errors import OutOfMemory


class FakeDevice:
    """A device whose step at batch b needs base + per_row * b bytes; beyond ``free`` it OOMs."""

    def __init__(self, free=100_000_000, base=1_000_000, per_row=30_000, oom_above=None):
        self.free, self.base, self.per_row = free, base, per_row
        self.oom_above = oom_above  # rows above which the step OOMs regardless of bytes
        self.peak = 0
        self.calls: list[int] = []

    def free_bytes(self) -> int:
        return self.free

    def reset_peak(self) -> None:
        self.peak = 0

    def peak_bytes(self) -> int:
        return self.peak

    def step(self, b: int) -> None:
        self.calls.append(b)
        need = self.base + self.per_row * b
        if need > self.free or (self.oom_above is not None and b > self.oom_above):
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {need} bytes")
        self.peak = max(self.peak, need)


def probe(dev: FakeDevice, **kw):
    args = dict(start=64, cap=1 << 20, margin=0.1, steps=2) | kw
    return find_micro_batch(dev.step, dev, **args)


def test_doubles_then_bisects_to_the_largest_size_within_the_margin():
    # budget 0.9 * 1e8 = 9e7 -> b <= (9e7 - 1e6) / 3e4 = 2966.7
    dev = FakeDevice()
    r = probe(dev)
    assert r.tried == [64, 128, 256, 512, 1024, 2048, 4096,
                       3072, 2560, 2816, 2944, 3008, 2976, 2960, 2968, 2964, 2966, 2967]
    assert r.micro_batch == 2966
    assert r.budget_bytes == 90_000_000 and r.free_bytes == 100_000_000
    assert r.peak_bytes[2966] == 1_000_000 + 30_000 * 2966
    # every fitting size ran `steps` steps; an OOM ends a size after its first step
    assert dev.calls[:4] == [64, 64, 128, 128]


def test_a_size_that_fits_only_without_the_margin_is_rejected():
    # 3000 rows need 9.1e7 bytes: no OOM under 1e8, but above the 9e7 budget
    dev = FakeDevice()
    r = probe(dev, start=3000, cap=3000)
    assert r.fits[3000] is False and 3000 in r.peak_bytes
    assert r.micro_batch == 2966
    assert probe(FakeDevice(), start=3000, cap=3000, margin=0.0).micro_batch == 3000


def test_cap_stops_the_doubling():
    r = probe(FakeDevice(), start=64, cap=300)
    assert r.tried == [64, 128, 256, 300]
    assert r.micro_batch == 300


def test_start_above_cap_starts_at_the_cap():
    r = probe(FakeDevice(), start=5000, cap=1000)
    assert r.tried == [1000]
    assert r.micro_batch == 1000


def test_first_size_out_of_memory_bisects_downwards():
    dev = FakeDevice(oom_above=9)
    r = probe(dev, start=64)
    assert r.tried == [64, 32, 16, 8, 12, 10, 9]
    assert r.micro_batch == 9


def test_nothing_fits_above_the_minimum():
    with pytest.raises(OutOfMemory, match=r"no micro-batch of at least 8 rows fits in memory \(tried \[64, 35, 21, 14, 10, 8\]"):
        probe(FakeDevice(oom_above=7), start=64, minimum=8)


def test_other_errors_propagate_from_the_probe():
    def step(b):
        raise ValueError("shape mismatch")
    with pytest.raises(ValueError, match="shape mismatch"):
        find_micro_batch(step, FakeDevice(), start=4, cap=8, margin=0.1, steps=1)


@pytest.mark.parametrize("exc, expected", [
    (torch.OutOfMemoryError("x"), True),
    (torch.cuda.OutOfMemoryError("CUDA out of memory"), True),
    (RuntimeError("CUDA error: out of memory"), True),
    (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), True),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried"), True),
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
    (ValueError("out of memory"), False),
    (MemoryError(), False),
])
def test_is_oom(exc, expected):
    assert is_oom(exc) is expected


def test_memory_is_released_after_the_exception_frames_are_gone(monkeypatch):
    alive_at_release: list[bool] = []
    refs: list[weakref.ref] = []

    def step(b):
        activations = torch.empty(b, 4)  # what a real step's frame would pin
        refs.append(weakref.ref(activations))
        if b > 4:
            raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(bs, "release_memory", lambda: alive_at_release.append(refs[-1]() is not None))
    r = find_micro_batch(step, FakeDevice(), start=8, cap=8, margin=0.0, steps=1)
    assert r.micro_batch == 4
    assert alive_at_release == [False, False, False]  # sizes 8, 6, 5 failed


def test_probing_with_real_training_steps_leaves_no_trace():
    from sweeper.config import ModelConfig
    from sweeper.data import Batcher
    from sweeper.models import build_model
    from sweeper.core.precision import resolve_precision
    from sweeper.core.probe import preserved, probe_step
    from sweeper.core.progress import cpu_copy
    from sweeper.core.schedule import make_optimizer
    from toy_panel import toy_panel

    torch.manual_seed(0)
    model = build_model(ModelConfig(name="mlp", hidden_size=8, dropout=0.5), 3, 4)
    optimizer = make_optimizer(model, 1e-2, 0.01)
    before, rng = cpu_copy(model.state_dict()), torch.get_rng_state()
    step = probe_step(model, optimizer, resolve_precision("fp32", torch.device("cpu")),
                      Batcher(toy_panel(), "train", "cpu"), "mse", seed=0)
    dev = FakeDevice(free=1_000_000, base=0, per_row=1_000)  # budget 900 kB: 900 rows
    changed = []

    def try_step(size):
        dev.step(size)  # OOM above 1000 rows, before the real step runs
        step(size)
        changed.append(not torch.equal(model.state_dict()["net.1.weight"], before["net.1.weight"]))

    with preserved(model, optimizer):
        r = find_micro_batch(try_step, dev, start=256, cap=1143, margin=0.1, steps=2)
    assert r.micro_batch == 900
    assert len(changed) > 10 and all(changed)  # the probe really trained ...
    for key, value in before.items():          # ... and left nothing behind
        assert torch.equal(model.state_dict()[key], value)
    assert len(optimizer.state) == 0
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in model.parameters())
