"""train.eval_batch_size: auto on a CPU (issue 41: a trial's validation and final scoring): the rows per
evaluation forward are measured for the model, kept on the host per shape, and pinned into the trial's
config so that its files and ``sweeper predict`` evaluate as its training did."""
from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from sweeper.core import eval_batch as E
from sweeper.data import Batcher
from sweeper.validation.runner import Trainer, pin_eval_batch
from tests.toy_panel import toy_config, toy_panel


class Sleepy(nn.Module):
    """A model whose forward takes ``call_s`` plus ``row_s`` per row, ``slow`` times that per row above
    ``knee`` rows: the cost curve of a CPU forward whose activations leave the caches."""

    def __init__(self, call_s: float, row_s: float, knee: int, slow: float) -> None:
        super().__init__()
        self.call_s, self.row_s, self.knee, self.slow = call_s, row_s, knee, slow
        self.sizes: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = len(x)
        self.sizes.append(rows)
        time.sleep(self.call_s + rows * self.row_s * (self.slow if rows > self.knee else 1.0))
        return x[:, -1, 0]


def _batcher(T: int = 700, N: int = 32) -> Batcher:
    return Batcher(toy_panel(T=T, N=N), "train", "cpu")  # 450 train dates x 32 assets: 14,300 rows


def test_the_sizes_timed_are_those_below_the_split_and_the_one_forward_past_it():
    assert E.sizes_for(0) == [16384]
    assert E.sizes_for(200) == [16384]  # one forward whatever the size: nothing to measure
    assert E.sizes_for(960) == [256, 16384]
    assert E.sizes_for(5000) == [256, 1024, 4096, 16384]
    assert E.sizes_for(200_000) == [256, 1024, 4096, 16384]


def test_the_fastest_size_is_chosen_and_the_split_bounds_what_is_timed():
    batcher = _batcher()
    model = Sleepy(call_s=0.002, row_s=2e-6, knee=1024, slow=20)  # 1,024 rows a forward is fastest
    said: list[str] = []
    assert E.measure(model, batcher, rows=100_000, say=said.append) == 1024
    assert said[0].startswith("eval batch 1024: rows/s by eval batch 256: ")
    # a warm-up, then 2 rounds of 4,096 rows of each size below the split and one forward past it
    rows = min(16384, batcher.n_samples)
    per_round = [256] * 16 + [1024] * 4 + [4096] + [rows]
    assert model.sizes == [256] + per_round + per_round
    assert model.training  # left as it was


def test_a_near_tie_keeps_the_larger_size():
    model = Sleepy(call_s=0.0, row_s=2e-6, knee=10**9, slow=1)  # every size costs the same per row
    assert E.measure(model, _batcher(), rows=100_000) == 16384


def test_a_split_of_one_forward_is_not_measured():
    model = Sleepy(call_s=0.0, row_s=0.0, knee=1, slow=1)
    assert E.measure(model, _batcher(), rows=200) == 16384 and model.sizes == []


def _trainer(cfg, memory=None) -> Trainer:
    return Trainer(cfg, hook=None, started=time.monotonic(), device="cpu", log=lambda line: None,  # type: ignore[arg-type]
                   memory=memory)


def test_auto_is_pinned_on_a_cpu_and_the_host_keeps_it(tmp_path, monkeypatch):
    cfg = toy_config(eval_batch_size="auto")
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"cache_dir": str(tmp_path)})})
    panel = toy_panel(T=700)
    timed: list[int] = []
    real = E.measure
    monkeypatch.setattr(E, "measure", lambda *a, **k: timed.append(1) or real(*a, **k))
    pinned = pin_eval_batch(panel, _trainer(cfg))
    size = pinned.cfg.train.eval_batch_size
    assert size in E.CANDIDATES and timed == [1]
    assert pinned.cfg.train.model_dump(exclude={"eval_batch_size"}) == cfg.train.model_dump(
        exclude={"eval_batch_size"})
    kept = list((tmp_path / E.CACHE_DIR).glob("*.json"))
    assert len(kept) == 1
    # the next trial of the shape reads it, another dropout rate included (evaluation has none)
    other = cfg.model_copy(update={"model": cfg.model.model_copy(update={"dropout": 0.3})})
    assert pin_eval_batch(panel, _trainer(other)).cfg.train.eval_batch_size == size and timed == [1]
    # a model of another size is measured
    wider = cfg.model_copy(update={"model": cfg.model.model_copy(update={"hidden_size": 32})})
    pin_eval_batch(panel, _trainer(wider))
    assert timed == [1, 1]


def test_a_number_or_a_device_with_memory_to_probe_is_left_as_it_is(tmp_path):
    panel = toy_panel(T=700)
    fixed = _trainer(toy_config(eval_batch_size=512))
    assert pin_eval_batch(panel, fixed) is fixed

    class Probed:  # a GPU's memory (a fake one here): its probe sizes the evaluation batch
        def reader(self):
            return object()
    auto = toy_config(eval_batch_size="auto")
    trainer = _trainer(auto, memory=Probed())
    assert pin_eval_batch(panel, trainer) is trainer
    assert trainer.cfg.train.resolved_eval_batch_size == 16384


@pytest.mark.parametrize("value", [0, -1, "big"])
def test_a_bad_eval_batch_size_is_refused(value):
    from sweeper.errors import ConfigError

    with pytest.raises(ConfigError, match="eval_batch_size"):
        toy_config(eval_batch_size=value)


def test_the_measured_model_does_not_move_the_trials_random_stream(tmp_path):
    cfg = toy_config(eval_batch_size="auto")
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"cache_dir": str(tmp_path)})})
    torch.manual_seed(5)
    pin_eval_batch(toy_panel(T=700), _trainer(cfg))
    after = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(3))
