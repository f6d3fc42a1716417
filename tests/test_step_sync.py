"""The step with no host sync: the loop reads losses and non-finite flags back only every
SYNC_EVERY steps and at the end of an epoch; skipped steps take back their schedule steps
and keep the non-finite count going; the optimizer skips on a device flag."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import sweeper.core.loop as loop
from reference_models import make_optimizer
from sweeper.core import NullHook, train
from sweeper.core.optim import update_unless
from sweeper.core.progress import EpochSteps, Progress
from sweeper.core.schedule import lr_factor
from sweeper.errors import NonFiniteLoss
from toy_panel import toy_config, toy_panel

CORE = str(Path(loop.__file__).parent)
HOST_READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__")


class Polls(NullHook):
    """Counts polls (one before every step) and, at each, how many host reads the core made so far."""

    def __init__(self, reads: list[str]):
        self.reads, self.seen = reads, []

    def should_stop(self):
        self.seen.append(len(self.reads))
        return False


@pytest.fixture
def core_reads(monkeypatch):
    """Every host read of a tensor's value made directly by a module of sweeper/core."""
    reads: list[str] = []
    for name in HOST_READS:
        original = getattr(torch._C.TensorBase, name)

        def wrapper(self, *args, _original=original, _name=name):
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(CORE):
                reads.append(f"{Path(caller).name}:{_name}")
            return _original(self, *args)
        monkeypatch.setattr(torch.Tensor, name, wrapper)
    return reads


def test_the_loop_reads_the_device_only_at_sync_points(monkeypatch, core_reads):
    monkeypatch.setattr(loop, "SYNC_EVERY", 4)
    hook = Polls(core_reads)
    train(toy_config(epochs=2), toy_panel(), hook=hook)  # 18 steps per epoch
    assert len(hook.seen) == 2 * 18
    for epoch in range(2):
        polls = hook.seen[18 * epoch: 18 * (epoch + 1)]
        reads_per_step = [b - a for a, b in zip(polls, polls[1:])]  # step k runs between polls k and k + 1
        assert reads_per_step == [1 if k % 4 == 0 else 0 for k in range(1, 18)], reads_per_step
    # the reads between polls are the sync's single transfer of every pending loss and flag
    assert set(core_reads[hook.seen[0]:hook.seen[17]]) == {"progress.py:tolist"}


def test_nonfinite_patience_is_judged_at_the_next_sync(monkeypatch):
    model = {"name": "custom_model:ExplodeAfter", "nan_calls": list(range(1000))}
    for every, polls in ((32, 18), (4, 4), (1, 3)):  # 18 steps per epoch; NaN from the first step
        monkeypatch.setattr(loop, "SYNC_EVERY", every)
        hook = Polls([])
        with pytest.raises(NonFiniteLoss, match=r"non-finite for 3 consecutive steps \(epoch 1, train.lr=0.003\)"):
            train(toy_config(model, nonfinite_patience=3), toy_panel(), hook=hook)
        assert len(hook.seen) == polls, every  # detected up to SYNC_EVERY - 1 steps late, never early


def test_skipped_steps_do_not_advance_the_schedule(monkeypatch):
    monkeypatch.setattr(loop, "SYNC_EVERY", 4)
    # 5 NaN steps (calls 0, 1, 2 and 6, 9) of 18: 13 updates; warmup over 3 epochs x 18 steps
    cfg = toy_config({"name": "custom_model:ExplodeAfter", "nan_calls": [0, 1, 2, 6, 9]}, epochs=1,
                     schedule="cosine", warmup_frac=0.5, nonfinite_patience=4)
    result = train(cfg, toy_panel())
    assert result.history[0]["lr"] == pytest.approx(3e-3 * lr_factor("cosine", 0.5, 18)(13), rel=1e-12)


def test_a_skipped_step_keeps_the_nonfinite_count_going():
    progress = Progress(nonfinite_steps=2)
    steps = EpochSteps()
    for loss, skipped in ((1.0, 1.0), (float("nan"), 1.0), (3.0, 0.0), (5.0, 1.0)):
        steps.add(torch.tensor(loss), torch.tensor(skipped))
    assert steps.sync(progress, patience=10) == (3, False)
    assert progress.nonfinite_steps == 1 and (steps.updates, steps.loss_sum) == (1, 3.0)
    steps.add(torch.tensor(1.0), torch.tensor(1.0))
    steps.add(torch.tensor(1.0), torch.tensor(1.0))
    assert steps.sync(progress, patience=3) == (2, True)  # 1 + 2 consecutive
    assert progress.nonfinite_steps == 3


def _model_and_grads(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 1)
    model(torch.randn(8, 3)).pow(2).mean().backward()
    return model


@pytest.mark.parametrize("fused", [True, False])
def test_the_optimizer_skips_on_the_device_flag(fused):
    model = _model_and_grads()
    optimizer = make_optimizer(model, 1e-2, 0.01)
    if not fused:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    assert bool(optimizer.defaults.get("fused")) is fused
    before = [p.detach().clone() for p in model.parameters()]
    update_unless(optimizer, torch.tensor(1.0))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(int(s["step"]) == 0 for s in optimizer.state.values())  # the step count did not move either
    update_unless(optimizer, torch.tensor(0.0))
    assert not any(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(int(s["step"]) == 1 for s in optimizer.state.values())
    assert not hasattr(optimizer, "found_inf")


def test_a_state_from_an_unfused_optimizer_skips_on_the_host():
    # a checkpoint written before AdamW was fused brings fused=None in its param groups
    model = _model_and_grads()
    old = torch.optim.AdamW([{"params": [model.weight], "weight_decay": 0.01},
                             {"params": [model.bias], "weight_decay": 0.0}], lr=1e-2, fused=False)
    old.step()
    optimizer = make_optimizer(model, 1e-2, 0.01)
    optimizer.load_state_dict(old.state_dict())
    before = [p.detach().clone() for p in model.parameters()]
    update_unless(optimizer, torch.tensor(1.0))  # the foreach kernel would refuse a found_inf
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    update_unless(optimizer, torch.tensor(0.0))
    assert all(int(s["step"]) == 2 for s in optimizer.state.values())


class LastRow(torch.nn.Module):
    """A linear model of a window's last row, its input times ``gain``."""

    def __init__(self, features: int, gain: float = 1.0) -> None:
        super().__init__()
        self.linear, self.gain = torch.nn.Linear(features, 1), gain

    def forward(self, x):
        return self.linear(x[:, -1] * self.gain).squeeze(-1)


def _stack_step(cfg, panel, solo, fp16: bool, members: int = 1):
    """The stack that ``train`` sets up (sweeper.core.loop.stack_step, on the CPU) for ``members`` runs
    of ``cfg``, a stack of one around the one-member model ``solo`` where given, its losses scaled
    per member when ``fp16`` (the fp16 path's scaler on the CPU, where autocast has no fp16: the
    precision stays fp32). Returns its StackStep."""
    from sweeper.core import Member
    from sweeper.core.loop import stack_step
    from sweeper.core.optim import MemberScaler

    device = torch.device("cpu")
    step = stack_step([Member(cfg, panel)] * members, device, None if solo is None else [solo])
    step.scaler = MemberScaler(members, device, fp16)  # the fp16 path's scaler, autocast staying fp32
    return step


def _first_rows(step, n: int):
    from sweeper.core.schedule import Rows

    return [Rows(lane.batcher.index[:n]) for lane in step.lanes]


def test_an_fp16_overflow_is_skipped_and_lowers_the_scale():
    # the fp16 path on the CPU: a member's loss scale that overflows its gradients to inf
    torch.manual_seed(0)
    cfg = toy_config(lr=1e-2, weight_decay=0.0, grad_clip=1.0)
    step = _stack_step(cfg, toy_panel(), LastRow(3, gain=1e4), fp16=True)
    step.scaler.scale_.fill_(2.0**127)
    before = [p.detach().clone() for p in step.flat.params]
    moments = {k: v.clone() for k, v in step.optimizer.state_dict().items()}
    step(_first_rows(step, 8), 8)  # finite, but its gradients x 2^127 are not
    (lane,) = step.lanes
    loss, skipped = lane.steps.pending  # the step's loss and skip flag, left on the device
    assert torch.isfinite(loss)
    assert skipped.dtype == torch.float32 and float(skipped) == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, step.flat.params))
    after = step.optimizer.state_dict()  # no step counted, no moments moved
    assert all(torch.equal(after[k], moments[k]) for k in moments)
    assert float(step.scaler.scale_[0]) == 2.0**126


def test_an_fp16_overflow_lowers_only_that_members_scale():
    # a stack of two: member 0's scale overflows its gradients, member 1's does not
    import dataclasses

    panel = toy_panel()
    loud = dataclasses.replace(panel, X=panel.X * 1e4, _cache={})
    step = _stack_step(toy_config(lr=1e-2, weight_decay=0.0, grad_clip=1.0), loud, None, fp16=True, members=2)
    step.scaler.scale_.copy_(torch.tensor([2.0**127, 2.0**16]))
    before = step.flat.values.clone()
    step(_first_rows(step, 8), 8)
    skipped = [float(lane.steps.pending[1]) for lane in step.lanes]
    assert skipped == [1.0, 0.0]
    assert all(torch.isfinite(lane.steps.pending[0]) for lane in step.lanes)
    assert torch.equal(step.flat.values[0], before[0]) and not torch.equal(step.flat.values[1], before[1])
    assert step.optimizer.state_dict()["steps"].tolist() == [0.0, 1.0]
    assert step.scaler.scale_.tolist() == [2.0**126, 2.0**16]


def test_an_oom_in_the_update_can_be_redone_from_scratch(monkeypatch):
    # fp16's scaler (scale 4): the redone step unscales its own gradients once, not the first try's twice
    def fresh():
        torch.manual_seed(0)
        step = _stack_step(toy_config(lr=1e-2, weight_decay=0.0, grad_clip=None), toy_panel(), LastRow(3),
                           fp16=True)
        step.scaler.scale_.fill_(4.0)
        return step

    reference = fresh()
    reference(_first_rows(reference, 16), 16)  # the same step, never interrupted
    step = fresh()
    single = step.optimizer.torch_adamw
    real_step = type(single).step
    calls = []

    def failing_twice(self, *args, **kwargs):
        calls.append(1)
        if len(calls) <= 2:
            raise torch.OutOfMemoryError("CUDA out of memory (fake)")
        return real_step(self, *args, **kwargs)
    monkeypatch.setattr(type(single), "step", failing_twice)
    said: list[str] = []
    with pytest.raises(torch.OutOfMemoryError):  # the step itself lets the OOM through ...
        step(_first_rows(step, 16), 16)
    # ... and the loop redoes it (here at the same micro-batch): zeroed gradients, the whole step
    # again, and again after a second OOM
    assert step.until_it_fits(_first_rows(step, 16), 16, lambda micro: micro, said.append) == 16
    assert said == ["out of memory: micro-batch now 16"]
    (lane,) = step.lanes
    loss, skipped = lane.steps.pending  # the successful try's, once
    assert float(skipped) == 0.0 and len(calls) == 3
    assert all(torch.equal(a, b) for a, b in zip(step.flat.params, reference.flat.params))
    assert torch.equal(loss, reference.lanes[0].steps.pending[0])
    assert (float(step.scaler.scale_[0]), float(step.scaler.good[0])) == (4.0, 1.0)
