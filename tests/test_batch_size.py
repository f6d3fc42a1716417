from __future__ import annotations

import weakref

import pytest
import torch

import sweeper.core.batch_search as bs
from sweeper.core.batch_search import find_micro_batch, is_oom
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


def _stack_step(cfg, panel, solo=None):
    """The stack of one that ``train`` sets up for ``cfg`` on ``panel`` (sweeper.core.loop.stack_step,
    on the CPU), its one-member model ``solo`` where given; returns its StackStep."""
    from sweeper.core import Member
    from sweeper.core.loop import stack_step

    return stack_step([Member(cfg, panel)], torch.device("cpu"), None if solo is None else [solo])


def _optimizer_state(step) -> dict[str, torch.Tensor]:
    """The stack's optimizer state (its step counts and moments), copied."""
    return {k: v.clone() for k, v in step.optimizer.state_dict().items()}


def test_probing_with_real_training_steps_leaves_no_trace():
    from sweeper.core.step import _probe
    from toy_panel import toy_config, toy_panel

    cfg = toy_config({"name": "mlp", "hidden_size": 8, "dropout": 0.5}, lr=1e-2, weight_decay=0.01)
    step = _stack_step(cfg, toy_panel())
    (lane,) = step.lanes
    torch.manual_seed(0)
    before, rng = step.stack.member_state(0), torch.get_rng_state()
    values, moments = step.flat.values.clone(), _optimizer_state(step)
    assert float(moments["steps"][0]) == 0 and not moments["exp_avg"].any()
    probe = _probe(step, seed=0)  # the plan's own probe: a real stacked step on random rows
    dev = FakeDevice(free=1_000_000, base=0, per_row=1_000)  # budget 900 kB: 900 rows
    changed = []

    def try_step(size):
        dev.step(size)  # OOM above 1000 rows, before the real step runs
        probe(size)
        changed.append(not torch.equal(step.stack.member_state(0)["net.1.weight"], before["net.1.weight"]))

    with step.preserved():
        r = find_micro_batch(try_step, dev, start=256, cap=1143, margin=0.1, steps=2)
    assert r.micro_batch == 900
    assert len(changed) > 10 and all(changed)  # the probe really trained ...
    for key, value in before.items():          # ... and left nothing behind
        assert torch.equal(step.stack.member_state(0)[key], value)
    assert torch.equal(step.flat.values, values)
    after = _optimizer_state(step)             # no optimizer state: no step counted, no moments
    assert all(torch.equal(after[k], moments[k]) for k in moments)
    assert all(float(s["step"]) == 0 for s in step.optimizer.torch_adamw.state.values())
    assert (float(step.scaler.scale_[0]), float(step.scaler.good[0])) == (1.0, 0.0)
    assert (lane.position, lane.seen, lane.steps.unread) == (0, 0, 0)
    assert torch.equal(torch.get_rng_state(), rng)
    assert not step.flat.grads.any() and all(not p.grad.any() for p in step.flat.params)


# ---------------------------------------------------------------- CudaMemory, against a stand-in allocator


class FakeCuda:
    """torch.cuda's memory calls over a ledger: what the caching allocator has allocated and its
    peak, the driver's free bytes (nothing cached: reserved == allocated)."""

    def __init__(self, total: int, allocated: int = 0) -> None:
        self.total, self.allocated, self.peak, self.fraction = total, allocated, allocated, 1.0

    def current_device(self):
        return 0

    def mem_get_info(self, device):
        return self.total - self.allocated, self.total

    def memory_allocated(self, device):
        return self.allocated

    def memory_reserved(self, device):
        return self.allocated

    def get_per_process_memory_fraction(self, device):
        return self.fraction

    def synchronize(self, device):
        return None

    def reset_peak_memory_stats(self, device):
        self.peak = self.allocated

    def max_memory_allocated(self, device):
        return self.peak

    def alloc(self, n: int) -> None:
        if self.allocated + n > self.total:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {n} bytes")
        self.allocated += n
        self.peak = max(self.peak, self.allocated)


def adamw_like_step(cuda: FakeCuda, per_row: int, state: int):
    """A step whose activations (per_row x rows) die with it, and whose first update leaves
    optimizer state behind for good, as AdamW's moments do."""
    made = []

    def step(rows: int) -> None:
        cuda.alloc(per_row * rows)
        try:
            if not made:
                cuda.alloc(state)
                made.append(state)
        finally:
            cuda.allocated -= per_row * rows
    return step


def test_optimizer_state_made_by_the_first_size_is_charged_to_every_later_size():
    # 100 MB, 10 % margin: 90 MB for state (30 MB) + 30 kB per row -> 2000 rows; without the
    # state charged after the first size, 3000 rows would pass
    cuda = FakeCuda(total=100_000_000)
    mem = bs.CudaMemory(torch.device("cuda", 0), cuda=cuda)
    r = find_micro_batch(adamw_like_step(cuda, 30_000, 30_000_000), mem, start=64, cap=1 << 20, margin=0.1, steps=2)
    assert r.tried == [64, 128, 256, 512, 1024, 2048, 1536, 1792, 1920, 1984, 2016, 2000, 2008, 2004, 2002, 2001]
    assert r.micro_batch == 2000 and r.peak_bytes[2000] == 90_000_000 and mem.base_bytes == 0


def test_a_memory_limit_bounds_the_probe_and_counts_what_is_allocated():
    MiB = 2**20
    # 1000 MiB GPU, 10 MiB of weights already allocated; the trial is allotted 100 MiB in all:
    # 90 MiB free for it, 81 MiB after the margin, for 4 MiB of state + 40 KiB per row -> 1971 rows
    cuda = FakeCuda(total=1000 * MiB, allocated=10 * MiB)
    mem = bs.CudaMemory(torch.device("cuda", 0), limit_mb=100, cuda=cuda)
    r = find_micro_batch(adamw_like_step(cuda, 40 * 1024, 4 * MiB), mem, start=1024, cap=4096, margin=0.1, steps=2)
    assert (r.free_bytes, mem.base_bytes) == (90 * MiB, 10 * MiB)
    assert r.tried == [1024, 2048, 1536, 1792, 1920, 1984, 1952, 1968, 1976, 1972, 1970, 1971]
    assert r.micro_batch == 1971
    unlimited = FakeCuda(total=1000 * MiB, allocated=10 * MiB)
    r = find_micro_batch(adamw_like_step(unlimited, 40 * 1024, 4 * MiB), bs.CudaMemory(torch.device("cuda", 0),
                         cuda=unlimited), start=1024, cap=4096, margin=0.1, steps=2)
    assert r.tried == [1024, 2048, 4096] and r.micro_batch == 4096


def test_available_bytes():
    # driver free + our cached-but-unused blocks
    assert bs.available_bytes(free=500, total=1000, reserved=300, allocated=200, fraction=1.0, limit=None) == 600
    # a per-process fraction binds first: 0.5 x 1000 - 200 allocated
    assert bs.available_bytes(free=500, total=1000, reserved=300, allocated=200, fraction=0.5, limit=None) == 300
    # a trial's allotment covers what it has allocated already
    assert bs.available_bytes(free=500, total=1000, reserved=300, allocated=200, fraction=1.0, limit=450) == 250
    assert bs.available_bytes(free=500, total=1000, reserved=300, allocated=200, fraction=1.0, limit=100) == 0


# ---------------------------------------------------------------- the IC loss's floor, and shrinking


def test_halving_stops_at_the_minimum():
    from sweeper.core.batch_plan import shrink_micro

    sizes, micro = [], 100
    with pytest.raises(OutOfMemory, match="out of memory at micro-batch 12; halving it would go below "
                                          r"train.min_micro_batch=8"):
        while True:
            micro = shrink_micro(micro, 8, 1000)
            sizes.append(micro)
    assert sizes == [50, 25, 12]


def test_an_ic_micro_batch_shrinks_to_one_date_and_then_says_why_it_cannot():
    from sweeper.core.batch_plan import shrink_micro

    sizes, micro = [], 1024
    with pytest.raises(OutOfMemory, match="out of memory at micro-batch 300; it cannot shrink: the IC loss keeps "
                                          "each date's rows in one micro-batch and the largest date of the "
                                          r"training split has 300 rows \(train.loss: mse can split a date"):
        while True:
            micro = shrink_micro(micro, 8, 4096, date_rows=300)
            sizes.append(micro)
    assert sizes == [512, 300]


# ---------------------------------------------------------------- the whole plan: training, then evaluation


class Ledger:
    """A MemoryReader whose memory is spent by LedgerModel: rows x bytes per row, plus AdamW's
    state once the optimizer has made it; above ``free`` it is out of memory."""

    base_bytes = 7 * 2**20

    def __init__(self, free: int, per_train_row: int, per_eval_row: int, state: int) -> None:
        self.free, self.per_train_row, self.per_eval_row, self.state = free, per_train_row, per_eval_row, state
        self.optimizer = None
        self.peak, self.sizes = 0, []

    def free_bytes(self) -> int:
        return self.free

    def reset_peak(self) -> None:
        self.peak = 0

    def peak_bytes(self) -> int:
        return self.peak

    def spend(self, rows: int, training: bool) -> None:
        self.sizes.append(("train" if training else "eval", rows))
        need = rows * (self.per_train_row if training else self.per_eval_row)
        need += self.state if self.optimizer is not None and _updated(self.optimizer) else 0
        if need > self.free:
            raise torch.OutOfMemoryError("CUDA out of memory (ledger)")
        self.peak = max(self.peak, need)


def _updated(optimizer) -> bool:
    """Whether the stack's AdamW has made an update, and so its state (step counts, moments)."""
    return bool(optimizer.state_dict()["steps"].any())


class LedgerModel(torch.nn.Module):
    def __init__(self, ledger: Ledger, features: int) -> None:
        super().__init__()
        self.ledger, self.linear = ledger, torch.nn.Linear(features, 1)

    def forward(self, x):
        self.ledger.spend(len(x), self.training)
        return self.linear(x[:, -1]).squeeze(-1)


def _plan(ledger: Ledger, **train):
    from sweeper.core.lanes import lane_batch_size
    from sweeper.core.step import plan_stack
    from toy_panel import toy_config, toy_panel

    panel, cfg = toy_panel(), toy_config(**train)
    step = _stack_step(cfg, panel, solo=LedgerModel(ledger, 3))
    ledger.optimizer = step.optimizer
    lanes, tc = step.lanes, cfg.train
    date_rows = max(lane.runs.largest if lane.runs is not None and step.criterion.whole_dates else 1
                    for lane in lanes)
    return plan_stack(step, tc, lane_batch_size(tc, lanes), ledger, date_rows)


def test_the_plan_fits_the_evaluation_batch_too_and_reports_the_peak():
    # training: 1000 B/row + 5000 B of state: 64 rows peak at 69 kB; evaluation: 500 B/row + state,
    # so the 256-row eval batch (133 kB) runs out of 100 kB and 170 rows (90 kB) is the most within 90 %
    ledger = Ledger(free=100_000, per_train_row=1000, per_eval_row=500, state=5000)
    plan = _plan(ledger, batch_size=64, eval_batch_size=256, probe_steps=2)
    assert (plan.batch_size, plan.micro_batch, plan.eval_batch_size) == (64, 64, 170)
    assert ledger.sizes[:2] == [("train", 64), ("train", 64)]  # the state exists from the second step on
    assert [rows for kind, rows in ledger.sizes if kind == "eval"] == [256, 128, 192, 160, 176, 168, 172, 170, 171]
    assert plan.peak_mem_mb == (Ledger.base_bytes + 90_000) / 2**20
    assert "probed micro-batch 64 (tried [64]) and eval batch 170" in plan.note
    assert not _updated(ledger.optimizer)  # probing left no state behind
    assert not ledger.optimizer.state_dict()["exp_avg"].any()


def test_an_ic_plan_starts_at_one_whole_date():
    # batch 16 rows, but a cross-sectional IC batch holds whole dates of up to 32 rows
    ledger = Ledger(free=10_000_000, per_train_row=1000, per_eval_row=10, state=0)
    plan = _plan(ledger, loss="ic", batch_size=16, probe_steps=1)
    assert (plan.micro_batch, [rows for kind, rows in ledger.sizes if kind == "train"]) == (32, [32])
    with pytest.raises(OutOfMemory, match=r"no micro-batch of at least 32 rows fits in memory \(tried \[32\]; "
                                          r"budget 0 MiB\); the IC loss keeps each date's rows in one micro-batch "
                                          r"and the largest date has 32 rows"):
        _plan(Ledger(free=31_000, per_train_row=1000, per_eval_row=10, state=0), loss="ic", batch_size=16)
