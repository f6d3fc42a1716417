from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from sweeper.core import FileCheckpointer, NullHook, predict, train
from sweeper.core.precision import resolve_precision
from sweeper.core.schedule import Rows, lr_factor
from sweeper.core.step import StackStep
from sweeper.data import Batch
from sweeper.data.scoring import own_scoring_panel
from sweeper.errors import ConfigError, Interrupted, NonFiniteLoss
from sweeper.models import build_model
from sweeper.quant import ic as M
from toy_panel import toy_config, toy_panel

RESULT_KEYS = {"val_ic", "val_rank_ic", "val_icir", "val_loss", "test_ic", "test_rank_ic", "test_icir",
               "best_epoch", "epochs_run", "batch_size", "micro_batch_size", "accum_steps", "precision",
               "samples_per_s", "peak_mem_mb", "duration_s", "eval_batch_size", "probe_peak_mem_mb",
               "final_scoring_s"}
EPOCH_KEYS = {"epoch", "train_loss", "val_loss", "val_ic", "val_rank_ic", "val_icir", "samples_per_s",
              "peak_mem_mb", "lr", "micro_batch_size", "accum_steps"}



@pytest.fixture(scope="module")
def panel():
    return toy_panel()


class Recorder(NullHook):
    def __init__(self, stop_at_epoch: int | None = None, stop_after_polls: int | None = None):
        self.epochs: list[int] = []
        self.metrics: list[dict] = []
        self.polls = 0
        self.stop_at_epoch, self.stop_after_polls = stop_at_epoch, stop_after_polls

    def on_epoch(self, epoch, rows):
        (metrics,) = rows  # one run: a stack of one
        self.epochs.append(epoch)
        self.metrics.append(metrics)
        return epoch == self.stop_at_epoch

    def should_stop(self):
        self.polls += 1
        return self.stop_after_polls is not None and self.polls > self.stop_after_polls


@pytest.mark.parametrize("model", [
    {"name": "transformer", "d_model": 16, "nhead": 2, "num_layers": 1, "dim_feedforward": 32, "dropout": 0.0},
    {"name": "transformer", "d_model": 16, "nhead": 2, "num_layers": 1, "dim_feedforward": 32,
     "positional": "sinusoidal", "pooling": "mean", "gradient_checkpointing": True},
    {"name": "lstm", "hidden_size": 16, "num_layers": 1},
    {"name": "gru", "hidden_size": 16, "num_layers": 1},
    {"name": "mlp", "hidden_size": 32, "dropout": 0.0},
    {"name": "custom_model:Tiny"},
])
def test_every_model_learns_the_toy_signal(panel, model):
    result = train(toy_config(model, epochs=4, lr=1e-2), panel)
    losses = [h["train_loss"] for h in result.history]
    assert losses[-1] < 0.7 * losses[0]
    assert result.metrics["val_ic"] > 0.4


def test_result_metrics_and_frames(panel):
    lines: list[str] = []
    result = train(toy_config(), panel, log=lines.append)
    m = result.metrics
    assert set(m) == RESULT_KEYS | {"oracle_val_ic", "oracle_test_ic"}
    assert (m["oracle_val_ic"], m["oracle_test_ic"]) == (0.91, 0.92)
    assert (m["batch_size"], m["micro_batch_size"], m["accum_steps"], m["precision"]) == (64, 64, 1, "fp32")
    assert m["eval_batch_size"] == 256 and math.isnan(m["probe_peak_mem_mb"])  # nothing is probed on the CPU
    assert 0 < m["final_scoring_s"] < m["duration_s"]  # the final scoring's own time is part of the run's
    assert m["epochs_run"] == 3 and len(result.history) == 3
    assert all(set(h) == EPOCH_KEYS for h in result.history)
    # the stored scores come from the best epoch's weights, through `predict`
    best = result.history[m["best_epoch"] - 1]
    assert best["val_ic"] == max(h["val_ic"] for h in result.history)
    assert m["val_ic"] == pytest.approx(best["val_ic"], abs=1e-6)
    assert m["val_loss"] == best["val_loss"]
    valid = result.predictions["valid"]
    assert list(valid.columns) == ["date", "asset", "pred", "label"]
    # valid dates 39..48, assets 1..31 after asset 0 delisted at date 30
    assert len(valid) == 10 * 31 and valid["asset"].iloc[0] == "A001"
    assert M.ic_report(valid)["ic"] == m["val_ic"]
    assert list(result.daily["valid"].columns) == ["date", "ic", "rank_ic"]
    assert len(result.daily["valid"]) == 10
    assert result.daily["test"]["ic"].mean() == pytest.approx(m["test_ic"])
    # test has 11 target dates, the last without a label: predicted too (as `sweeper predict` does), not scored
    test = result.predictions["test"]
    assert len(test) == 11 * 31 and test["label"].isna().sum() == 31
    assert M.ic_report(test)["ic"] == m["test_ic"] and len(result.daily["test"]) == 10
    assert lines[0].startswith("training mlp on cpu: 1143 samples, batch 64 (micro 64), fp32, 18 steps/epoch")
    assert lines[-1].startswith(f"done (epochs): best epoch {m['best_epoch']}")


def test_predict_reproduces_the_stored_ic_exactly(panel):
    cfg = toy_config()
    result = train(cfg, panel)
    model = build_model(cfg.model, 3, 4)
    model.load_state_dict(result.best_state)
    frame = predict(model, panel, "valid", "cpu", cfg.train.eval_batch_size)
    pd.testing.assert_frame_equal(frame, result.predictions["valid"])
    assert M.ic_report(frame)["ic"] == result.metrics["val_ic"]
    # test is predicted on its present rows (the last date has no label yet), as `sweeper predict` does:
    # on the labelled rows alone the batches differ in height, which rounds otherwise on some CPUs
    # (AMD EPYC: 2e-10 apart)
    test = predict(model, own_scoring_panel(panel), "test", "cpu", cfg.train.eval_batch_size)
    pd.testing.assert_frame_equal(test, result.predictions["test"])
    assert M.ic_report(test)["ic"] == result.metrics["test_ic"]


def test_no_oracle_keys_without_an_oracle():
    result = train(toy_config(epochs=1), toy_panel(oracle=False))
    assert set(result.metrics) == RESULT_KEYS


def test_early_stopping_after_patience_epochs_without_improvement(panel):
    # Frozen's predictions cannot change, so epoch 1 stays the best
    result = train(toy_config({"name": "custom_model:Frozen"}, epochs=10, patience=2), panel)
    assert result.stop_reason == "early_stop"
    assert (result.metrics["epochs_run"], result.metrics["best_epoch"]) == (3, 1)
    assert not result.stopped_by_hook


def test_early_stopping_on_val_loss_keeps_the_lowest(panel):
    result = train(toy_config(epochs=3, early_stop_metric="val_loss"), panel)
    losses = [h["val_loss"] for h in result.history]
    assert result.metrics["best_epoch"] == 1 + losses.index(min(losses))


def test_the_hook_sees_every_epoch_and_can_stop_training(panel):
    hook = Recorder(stop_at_epoch=2)
    result = train(toy_config(epochs=5), panel, hook=hook)
    assert hook.epochs == [1, 2]
    assert result.stopped_by_hook and result.stop_reason == "pruned"
    assert result.metrics["epochs_run"] == 2
    assert hook.metrics[1]["epoch"] == 2 and hook.metrics[1]["accum_steps"] == 1
    assert hook.polls == 2 * 18  # polled before every step


def test_should_stop_raises_interrupted_after_the_last_epoch_checkpoint(panel, tmp_path):
    ckpt = FileCheckpointer(tmp_path / "ckpt.pt")
    hook = Recorder(stop_after_polls=18 + 5)  # 18 steps per epoch: stop inside epoch 2
    with pytest.raises(Interrupted, match="during epoch 2; the last checkpoint holds epoch 1"):
        train(toy_config(epochs=3), panel, hook=hook, checkpoint=ckpt)
    assert hook.epochs == [1]
    assert ckpt.load()["epoch"] == 1


def test_persistent_nan_loss_raises_after_patience(panel):
    with pytest.raises(NonFiniteLoss, match="non-finite for 3 consecutive steps"):
        train(toy_config({"name": "custom_model:ExplodeAfter", "nan_calls": list(range(1000))},
                         nonfinite_patience=3), panel)


def test_nan_steps_make_no_update(panel):
    cfg = toy_config({"name": "custom_model:ExplodeAfter", "nan_calls": list(range(18))}, epochs=1,
                     nonfinite_patience=100)
    result = train(cfg, panel)
    torch.manual_seed(cfg.train.seed)
    initial = build_model(cfg.model, 3, 4).state_dict()
    for key, value in initial.items():
        assert torch.equal(result.best_state[key], value)
    assert math.isnan(result.history[0]["train_loss"])


def test_a_single_nan_step_is_skipped_and_training_goes_on(panel):
    model = {"name": "custom_model:ExplodeAfter", "nan_calls": []}
    clean = train(toy_config(model, epochs=3, lr=1e-2), panel)
    hit = train(toy_config(model | {"nan_calls": [3]}, epochs=3, lr=1e-2, nonfinite_patience=2), panel)
    assert all(math.isfinite(h["train_loss"]) for h in hit.history)
    assert hit.metrics["val_ic"] > 0.4
    assert hit.metrics["val_ic"] == pytest.approx(clean.metrics["val_ic"], abs=0.05)
    # one update fewer: close to, but not the same as, the clean run
    assert not torch.equal(hit.best_state["linear.weight"], clean.best_state["linear.weight"])


def test_samples_per_epoch_caps_the_steps(panel):
    hook = Recorder()  # polled once per step
    train(toy_config(epochs=2, samples_per_epoch=100, batch_size=32), panel, hook=hook)
    assert hook.polls == 2 * 4


def test_time_budget_stops_after_the_first_step(panel):
    hook = Recorder()
    result = train(toy_config(epochs=5, max_minutes=1e-9), panel, hook=hook)
    assert result.stop_reason == "time"
    assert result.metrics["epochs_run"] == 1 and hook.polls == 1


def test_ic_loss_on_cross_sections_learns(panel):
    result = train(toy_config(loss="ic", epochs=4, lr=1e-2), panel)
    assert result.history[-1]["val_loss"] < -0.4  # val_loss is the negative IC of the normalised label
    assert result.metrics["val_ic"] > 0.4


def test_bf16_autocast_on_cpu(panel):
    result = train(toy_config(precision="bf16", epochs=2, lr=1e-2), panel)
    assert result.metrics["precision"] == "bf16"
    assert result.metrics["val_ic"] > 0.3


def test_precision_resolution_on_cpu():
    assert resolve_precision("auto", torch.device("cpu")).name == "fp32"
    with pytest.raises(ConfigError, match="train.precision: fp16 needs a CUDA device"):
        resolve_precision("fp16", torch.device("cpu"))


def _stack_step(cfg, panel, solo) -> StackStep:
    """The stack of one that ``train`` sets up for ``cfg`` (sweeper.core.loop.stack_step, on the CPU)
    around the one-member model ``solo``."""
    from sweeper.core import Member
    from sweeper.core.loop import stack_step

    return stack_step([Member(cfg, panel)], torch.device("cpu"), [solo])


@pytest.mark.parametrize("loss_name", ["mse", "ic"])
@pytest.mark.parametrize("with_counts", [False, True])
def test_micro_batches_accumulate_to_the_full_batch_gradient(loss_name, with_counts, panel):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 1), torch.nn.Flatten(0))
    step = _stack_step(toy_config(loss=loss_name, precision="fp32"), panel, model)
    x, y = torch.randn(13, 4, 3), torch.randn(13)
    t = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 4, 4, 4])  # date 3 has one row: ic_loss skips it
    # a cross-sectional batch comes grouped by date with its counts; a random one shuffled, without
    idx = torch.stack([t, torch.arange(13)], 1)
    rows = Rows(idx, [3, 2, 4, 1, 3]) if with_counts else Rows(idx[torch.randperm(13)])
    gathered: list[int] = []

    class Gather:
        """The member's batcher: counts the rows of each gather."""

        index = idx

        def reads_same(self, other):
            return other is self

        def gather(self, part):
            gathered.append(len(part))
            return Batch(x[part[:, 1]], y[part[:, 1]], y[part[:, 1]], part[:, 0], part[:, 1])

    step.lanes[0].batcher = Gather()
    grads = []
    for micro in (13, 5, 4, 1):
        step.flat.zero_grad()
        (loss,) = step._accumulate([rows], micro)  # the stack's forward and backward of each micro-batch
        grads.append((loss, [p.grad.clone() for p in step.flat.params]))
    full_loss, full_grads = grads[0]
    for loss, g in grads[1:]:
        torch.testing.assert_close(loss, full_loss)
        for a, b in zip(g, full_grads):
            torch.testing.assert_close(a, b)
    # one gather per micro-batch: rows for MSE; for the IC loss whole dates (rows 3, 2, 4, 1, 3), and
    # at micro 1 the one-row date, which ic_loss ignores, is not gathered at all
    expected = {"mse": [13, 5, 5, 3, 4, 4, 4, 1] + [1] * 13,
                "ic": [13, 3 + 2, 4 + 1, 3, 3, 2, 4, 1 + 3, 3, 2, 4, 3]}[loss_name]
    assert gathered == expected


def test_lr_schedules():
    constant = lr_factor("constant", 0.1, 100)
    assert [constant(s) for s in (0, 4, 9, 10, 99)] == [0.1, 0.5, 1.0, 1.0, 1.0]
    cosine = lr_factor("cosine", 0.0, 100)
    assert cosine(0) == 1.0 and cosine(50) == pytest.approx(0.5) and cosine(100) == pytest.approx(0.0)
    onecycle = lr_factor("onecycle", 0.0, 100)  # 30 warmup steps
    assert onecycle(0) == pytest.approx(1 / 25) and onecycle(30) == 1.0 and onecycle(100) == pytest.approx(0.0)


def test_checkpoint_from_another_config_is_refused(panel, tmp_path):
    ckpt = FileCheckpointer(tmp_path / "c.pt")
    train(toy_config(epochs=1), panel, checkpoint=ckpt)
    with pytest.raises(ConfigError, match="train.lr was 0.003, now 0.01"):
        train(toy_config(epochs=1, lr=0.01), panel, checkpoint=ckpt)


def test_evaluation_halves_its_batch_on_oom(panel):
    from sweeper.core import predict_rows
    from sweeper.data import Batcher

    class OomOnBigEval(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.sizes: list[int] = []

        def forward(self, x):
            self.sizes.append(x.shape[0])
            if x.shape[0] > 100:
                raise torch.OutOfMemoryError("CUDA out of memory")
            return x[:, -1, 0]

    model = OomOnBigEval()
    pred = predict_rows(model, Batcher(panel, "valid", "cpu"), 256)
    assert model.sizes[:2] == [256, 128] and max(model.sizes[2:]) == 64
    assert len(pred) == 310 and model.training
