"""A trial's stored predictions (issue 41's fixed cost): a run trained alone whose final scoring
saw the same rows in the same batches as ``sweeper predict`` would is not scored again for that
split; its frame is the same bits."""
from __future__ import annotations

import pandas as pd
import pytest

import sweeper.core as core
from sweeper.core import train
from sweeper.validation.runner import model_frames
from tests.toy_panel import toy_config, toy_panel


@pytest.fixture(scope="module")
def trained():
    cfg, panel = toy_config(epochs=1), toy_panel()
    return cfg, panel, train(cfg, panel, device="cpu")


@pytest.mark.parametrize("alone,scored", [(True, ["test"]), (False, ["valid", "test"])])
def test_only_a_split_whose_rows_or_batches_differ_is_scored_again(trained, monkeypatch, alone, scored):
    cfg, panel, result = trained
    real, calls = core.predict, []

    def predict(model, panel, split, *args, **kwargs):
        calls.append(split)
        return real(model, panel, split, *args, **kwargs)
    monkeypatch.setattr(core, "predict", predict)
    frames = model_frames(cfg, result, panel, "cpu", alone)
    assert calls == scored  # test holds the last dates, whose labels are unknown: more rows than scored
    monkeypatch.setattr(core, "predict", real)
    for split, frame in model_frames(cfg, result, panel, "cpu").items():
        pd.testing.assert_frame_equal(frames[split], frame, check_exact=True)


def test_another_eval_batch_than_the_trials_scores_again(trained, monkeypatch):
    cfg, panel, result = trained
    other = type(result)(**{**result.__dict__, "metrics": {**result.metrics, "eval_batch_size": 7}})
    calls = []
    real = core.predict
    monkeypatch.setattr(core, "predict", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    model_frames(cfg, other, panel, "cpu", alone=True)
    assert calls == ["valid", "test"]
