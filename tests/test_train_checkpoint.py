"""Checkpoints: atomic files, weights_only loading, and resume == straight run."""
from __future__ import annotations

import pytest
import torch

from sweeper.core import FileCheckpointer, NullHook, checkpoint_epoch, copy_checkpoint, train
from sweeper.core.checkpoint import checkpoint_meta, config_mismatch
from sweeper.errors import Interrupted
from toy_panel import toy_config, toy_panel

TIMING = {"samples_per_s", "peak_mem_mb", "duration_s", "final_scoring_s"}



class StopAfter(NullHook):
    def __init__(self, polls: int | None = None):
        self.polls, self.limit, self.epochs = 0, polls, []

    def on_epoch(self, epoch, metrics):
        self.epochs.append(epoch)
        return False

    def should_stop(self):
        self.polls += 1
        return self.limit is not None and self.polls > self.limit


def untimed(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in TIMING}


def test_two_epochs_then_resume_equals_four_straight(tmp_path):
    panel = toy_panel()
    # dropout and a warmup + cosine schedule: RNG and scheduler state must both come back
    cfg = toy_config({"name": "transformer", "d_model": 16, "nhead": 2, "num_layers": 1,
                      "dim_feedforward": 32, "dropout": 0.2},
                     epochs=4, schedule="cosine", warmup_frac=0.1, lr=3e-3)
    straight = train(cfg, panel)

    ckpt = FileCheckpointer(tmp_path / "trial" / "ckpt.pt")
    with pytest.raises(Interrupted):
        train(cfg, panel, hook=StopAfter(polls=2 * 18), checkpoint=ckpt)  # stops as epoch 3 begins
    assert ckpt.load()["epoch"] == 2
    hook = StopAfter()
    resumed = train(cfg, panel, hook=hook, checkpoint=ckpt)

    assert hook.epochs == [3, 4]  # epochs already done are not reported again
    assert hook.polls == 2 * 18
    for key, value in straight.best_state.items():
        assert torch.equal(resumed.best_state[key], value), key
    assert untimed(resumed.metrics) == untimed(straight.metrics)
    assert [untimed(h) for h in resumed.history] == [untimed(h) for h in straight.history]
    assert ckpt.load()["epoch"] == 4


def test_a_finished_early_stopped_run_resumes_to_the_same_result(tmp_path):
    panel = toy_panel()
    cfg = toy_config({"name": "custom_model:Frozen"}, epochs=10, patience=2)
    ckpt = FileCheckpointer(tmp_path / "ckpt.pt")
    first = train(cfg, panel, checkpoint=ckpt)
    hook = StopAfter()
    again = train(cfg, panel, hook=hook, checkpoint=ckpt)
    assert hook.epochs == [] and hook.polls == 0
    assert again.stop_reason == "early_stop"
    assert untimed(again.metrics) == untimed(first.metrics)


def test_checkpoint_state_is_plain_and_loads_weights_only(tmp_path):
    ckpt = FileCheckpointer(tmp_path / "ckpt.pt")
    train(toy_config(epochs=1), toy_panel(), checkpoint=ckpt)
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    # the one format of every stack (a run is a stack of one): the stack's weights and optimizer,
    # each member's own generators, schedule position and progress
    assert set(state) == {"epoch", "kind", "values", "optimizer", "scaler", "rng", "members", "batch_size",
                          "micro_batch_size", "eval_batch_size", "config"}
    (member,) = state["members"]
    assert set(member) == {"batches", "dropout", "position", "stopped", "reason", "best", "best_epoch",
                           "best_state", "best_metrics", "bad_epochs", "nonfinite_steps", "history"}
    assert set(state["optimizer"]) == {"lr", "weight_decay", "steps", "exp_avg", "exp_avg_sq"}
    assert set(state["rng"]) == {"torch", "cuda", "numpy", "python", "batches"}
    assert state["config"]["train"]["epochs"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temp file left behind


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path):
    ckpt = FileCheckpointer(tmp_path / "ckpt.pt")
    ckpt.save({"epoch": 1})
    with pytest.raises(Exception):
        ckpt.save({"epoch": 2, "bad": lambda: None})  # not picklable
    assert ckpt.load() == {"epoch": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]
    assert FileCheckpointer(tmp_path / "missing.pt").load() is None


def test_the_checkpoint_names_its_own_epoch_and_config(tmp_path):
    path = tmp_path / "ckpt.pt"
    assert checkpoint_epoch(path) is None and checkpoint_meta(path) is None
    cfg = toy_config(epochs=2)
    train(cfg, toy_panel(), checkpoint=FileCheckpointer(path))
    assert checkpoint_epoch(path) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # one file, no sidecar to disagree with it
    meta = checkpoint_meta(path)
    assert config_mismatch(meta["config"], cfg) is None
    assert config_mismatch(meta["config"], toy_config(epochs=3)) == (
        "the checkpoint was written by a different run: train.epochs was 2, now 3")
    copy_checkpoint(path, tmp_path / "retry" / "ckpt.pt")
    assert checkpoint_epoch(tmp_path / "retry" / "ckpt.pt") == 2
    assert [p.name for p in (tmp_path / "retry").iterdir()] == ["ckpt.pt"]
    (tmp_path / "torn.pt").write_bytes(path.read_bytes()[:100])
    assert checkpoint_epoch(tmp_path / "torn.pt") is None  # unreadable: nothing to resume from
