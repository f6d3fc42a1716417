"""A trial's end scores no split twice where the bits would be the same (issue 41's fixed cost):
the stored predictions of a run trained alone whose final scoring saw the same rows in the same
batches as ``sweeper predict`` would (test's present rows, unknown labels included), and a stack of
one's final valid scores."""
from __future__ import annotations

import pandas as pd
import pytest

import sweeper.core as core
from sweeper.core import train
from sweeper.data.scoring import own_scoring_panel
from sweeper.models import build_model
from sweeper.validation.runner import model_frames
from tests.toy_panel import toy_config, toy_panel


@pytest.fixture(scope="module")
def trained():
    cfg, panel = toy_config(epochs=1), toy_panel()
    return cfg, panel, train(cfg, panel, device="cpu")


@pytest.mark.parametrize("alone,scored", [(True, []), (False, ["valid", "test"])])
def test_only_a_split_whose_rows_or_batches_differ_is_scored_again(trained, monkeypatch, alone, scored):
    cfg, panel, result = trained
    real, calls = core.predict, []

    def predict(model, panel, split, *args, **kwargs):
        calls.append(split)
        return real(model, panel, split, *args, **kwargs)
    monkeypatch.setattr(core, "predict", predict)
    frames = model_frames(cfg, result, panel, "cpu", alone)
    # the final scoring predicted test on its present rows (its last dates' labels are unknown), as
    # predict does: a run alone needs no second pass over either split
    assert calls == scored
    assert frames["test"]["label"].isna().sum() > 0
    # every frame, reused or not, is what predict computes from the best weights on the scoring panel
    model = build_model(cfg.model, len(panel.features), cfg.data.lookback)
    model.load_state_dict(result.best_state)
    for split, frame in frames.items():
        again = real(model, own_scoring_panel(panel), split, "cpu", cfg.train.eval_batch_size)
        pd.testing.assert_frame_equal(frame, again, check_exact=True)


def test_another_eval_batch_than_the_trials_scores_again(trained, monkeypatch):
    cfg, panel, result = trained
    other = type(result)(**{**result.__dict__, "metrics": {**result.metrics, "eval_batch_size": 7}})
    calls = []
    real = core.predict
    monkeypatch.setattr(core, "predict", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    model_frames(cfg, other, panel, "cpu", alone=True)
    assert calls == ["valid", "test"]


@pytest.mark.parametrize(("members", "model"), [
    (1, "mlp"), (2, "mlp"), (3, "lstm"), (3, "gru"), (2, "transformer")])
def test_a_stack_scores_valid_with_its_best_epochs_own_predictions(monkeypatch, members, model):
    """Each member's best epoch's validation ran the final scoring's forward on the same rows in the same
    batches, and its slice of a stacked forward reads its own weights alone: the final scoring takes
    those predictions (valid is not predicted again), and they are what its best weights predict, to
    the bit, in the stack (the golden records hold the bits too) and, for a stack of one, alone."""
    import numpy as np
    import torch

    import sweeper.core.evaluate as evaluate
    from sweeper.core import Member, train_stack
    from sweeper.data import Batcher
    from sweeper.models import build_model
    from sweeper.models.stacked.build import build_stack
    from sweeper.validation.grid import seeded

    real, calls = evaluate.stacked_predict_rows, []

    def spy(stack, batchers, *args, **kwargs):
        calls.append(batchers[0].split)
        return real(stack, batchers, *args, **kwargs)
    monkeypatch.setattr(evaluate, "stacked_predict_rows", spy)
    sizes = {"d_model": 8, "nhead": 2} if model == "transformer" else {"hidden_size": 8}
    cfg, panel = toy_config({"name": model, "dropout": 0.1, **sizes}, epochs=3, patience=1), toy_panel()
    results = train_stack([Member(seeded(cfg, s), panel) for s in range(members)], device="cpu")
    assert calls == ["test"]
    models = []
    for result in results:
        models.append(build_model(cfg.model, len(panel.features), cfg.data.lookback))
        models[-1].load_state_dict(result.best_state)
    stack = build_stack([cfg.model] * members, len(panel.features), cfg.data.lookback, models)
    batch = int(results[0].metrics["eval_batch_size"]) // members  # the stacked evaluation's rows
    again = real(stack, [Batcher(panel, "valid", torch.device("cpu"))] * members, batch)
    for result, rows in zip(results, again):
        assert np.array_equal(result.predictions["valid"]["pred"].to_numpy(), rows.numpy())
    if members == 1:  # what predict computes from the best weights, to the bit
        from sweeper.core import predict

        (result,) = results
        again_alone = predict(models[0], panel, "valid", "cpu", int(result.metrics["eval_batch_size"]))
        pd.testing.assert_frame_equal(result.predictions["valid"], again_alone, check_exact=True)


def test_the_stored_test_ic_is_exactly_the_ic_of_the_test_predictions(trained):
    """The final scoring predicts test on every present row, as ``sweeper predict`` does, and scores the
    labelled ones: the trial's test IC is its predictions file's to the bit (it differed in the last
    bits when the labelled rows were predicted in batches of their own)."""
    from sweeper.quant.ic import ic_report

    cfg, panel, result = trained
    frame = result.predictions["test"]
    labelled = panel.sample_index("test")
    assert len(frame) > len(labelled) and frame["label"].notna().sum() == len(labelled)
    assert result.metrics["test_ic"] == ic_report(frame)["ic"]
    assert result.metrics["test_icir"] == ic_report(frame)["icir"]
