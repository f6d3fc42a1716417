"""Out-of-memory during training, injected on the CPU by a model that refuses large batches."""
from __future__ import annotations

import pytest
import torch

from sweeper.core import train
from sweeper.core.schedule import AdamW
from sweeper.errors import OutOfMemory
from toy_panel import toy_config, toy_panel


def oom_log() -> list[int]:
    import custom_model  # the module train() imports by its dotted name
    return custom_model.OomAbove.log


def test_oom_halves_the_micro_batch_and_redoes_the_same_step():
    panel = toy_panel()
    oom_log().clear()
    result = train(toy_config({"name": "custom_model:OomAbove", "limit": 16}, epochs=2, min_micro_batch=8),
                   panel)
    log = list(oom_log())
    assert log[:6] == [64, 32, 16, 16, 16, 16]
    assert log.count(64) == 1 and log.count(32) == 1
    # after the two failures every one of the 2 x 1143 samples went through exactly once:
    # the failed step was redone, not skipped
    assert sum(log[2:]) == 2 * 1143 and max(log[2:]) == 16
    m = result.metrics
    assert (m["batch_size"], m["micro_batch_size"], m["accum_steps"]) == (64, 16, 4)
    assert [h["micro_batch_size"] for h in result.history] == [16, 16]

    # same optimisation as the un-split batch (Tiny has OomAbove's layers and initialisation)
    whole = train(toy_config({"name": "custom_model:Tiny"}, epochs=2), panel)
    assert whole.metrics["micro_batch_size"] == 64
    for key, value in whole.best_state.items():
        torch.testing.assert_close(result.best_state[key], value, atol=1e-6, rtol=1e-5)
    assert m["val_ic"] == pytest.approx(whole.metrics["val_ic"], abs=1e-5)


def test_oom_below_the_minimum_micro_batch_fails_the_trial():
    oom_log().clear()
    with pytest.raises(OutOfMemory, match="out of memory at micro-batch 8; halving it would go below "
                                          "train.min_micro_batch=8"):
        train(toy_config({"name": "custom_model:OomAbove", "limit": 4}, min_micro_batch=8), toy_panel())
    assert oom_log() == [64, 32, 16, 8]


def test_oom_in_the_batch_gather_halves_the_micro_batch(monkeypatch):
    from sweeper.data.batches import Batcher

    gathered: list[int] = []
    real_gather = Batcher.gather

    def gather(self, idx):
        if self.split != "train":  # the evaluation's gathers (the stack's go through gather too)
            return real_gather(self, idx)
        gathered.append(len(idx))
        if len(idx) > 16:
            raise torch.OutOfMemoryError(f"CUDA out of memory (fake gather of {len(idx)} rows)")
        return real_gather(self, idx)
    monkeypatch.setattr(Batcher, "gather", gather)
    panel = toy_panel()
    result = train(toy_config({"name": "custom_model:Tiny"}, epochs=2, min_micro_batch=8), panel)
    assert gathered[:6] == [64, 32, 16, 16, 16, 16]
    assert sum(gathered[2:]) == 2 * 1143 and max(gathered[2:]) == 16  # each micro-batch gathers its own rows
    assert (result.metrics["micro_batch_size"], result.metrics["accum_steps"]) == (16, 4)
    monkeypatch.setattr(Batcher, "gather", real_gather)
    whole = train(toy_config({"name": "custom_model:Tiny"}, epochs=2), panel)
    for key, value in whole.best_state.items():
        torch.testing.assert_close(result.best_state[key], value, atol=1e-6, rtol=1e-5)


def test_oom_in_the_optimizer_update_redoes_the_step_in_halves(monkeypatch):
    # AdamW allocates its moments in its first update: the place a step runs out of memory after
    # backward (the trial's AdamW, torch's class without its compile guards)
    real_step = AdamW.step
    updates: list[int] = []

    def step(self, *args, **kwargs):
        updates.append(len(updates))
        if len(updates) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory (fake, allocating AdamW's state)")
        return real_step(self, *args, **kwargs)
    monkeypatch.setattr(AdamW, "step", step)
    oom_log().clear()
    panel = toy_panel()
    result = train(toy_config({"name": "custom_model:OomAbove", "limit": 1000}, epochs=2), panel)
    log = list(oom_log())
    assert log[:5] == [64, 32, 32, 32, 32] and sum(log[1:]) == 2 * 1143
    assert len(updates) == 1 + 2 * 18  # the failed update, then one per step
    assert result.metrics["micro_batch_size"] == 32
    monkeypatch.setattr(AdamW, "step", real_step)
    whole = train(toy_config({"name": "custom_model:Tiny"}, epochs=2), panel)
    for key, value in whole.best_state.items():  # the failed update left the optimizer as it found it
        torch.testing.assert_close(result.best_state[key], value, atol=1e-6, rtol=1e-5)


def test_an_ic_micro_batch_cannot_split_a_date_and_says_so():
    oom_log().clear()
    # cross-sectional batches of 2 dates (32 rows each until asset 0 delists): the micro-batch halves
    # to one date, and one date is still too large
    with pytest.raises(OutOfMemory, match="out of memory at micro-batch 32; it cannot shrink: the IC loss keeps "
                                          "each date's rows in one micro-batch and the largest date of the "
                                          "training split has 32 rows"):
        train(toy_config({"name": "custom_model:OomAbove", "limit": 16}, loss="ic", min_micro_batch=8), toy_panel())
    assert oom_log() == [64, 32]
