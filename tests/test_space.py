from __future__ import annotations

import optuna

from sweeper import config as C
from sweeper.study.space import ordered, suggest

RAW = {
    "data": {"synthetic": {"assets": 20, "dates": 200, "features": 4}},
    "search_space": {
        "model.d_model": {"type": "categorical", "choices": [16, 32], "when": {"model.name": "transformer"}},
        "model.hidden_size": {"type": "int", "low": 8, "high": 64, "step": 8, "when": {"model.name": ["lstm", "gru"]}},
        "model.name": {"type": "categorical", "choices": ["transformer", "lstm"]},
        "train.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
    },
}


def test_conditions_come_after_what_they_depend_on():
    cfg = C.validate_config(RAW, "s.yaml")
    order = ordered(cfg.search_space)
    assert order.index("model.name") < order.index("model.d_model")
    assert order.index("model.name") < order.index("model.hidden_size")


def test_only_active_params_are_suggested():
    cfg = C.validate_config(RAW, "s.yaml")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(12):
        trial = study.ask()
        params = suggest(trial, cfg)
        assert trial.params == params
        if params["model.name"] == "transformer":
            assert set(params) == {"model.name", "model.d_model", "train.lr"}
        else:
            assert set(params) == {"model.name", "model.hidden_size", "train.lr"}
            assert params["model.hidden_size"] % 8 == 0
        assert 1e-4 <= params["train.lr"] <= 1e-2
        resolved = C.with_overrides(cfg, params, "trial")
        assert resolved.model.name == params["model.name"]
        seen.add(params["model.name"])
        study.tell(trial, 0.0)
    assert seen == {"transformer", "lstm"}


def test_condition_on_a_default():
    raw = {**RAW, "search_space": {"model.d_model": RAW["search_space"]["model.d_model"]}}
    cfg = C.validate_config(raw, "s.yaml")  # model.name defaults to transformer
    trial = optuna.create_study().ask()
    assert set(suggest(trial, cfg)) == {"model.d_model"}
    lstm = C.with_overrides(cfg, {"model.name": "lstm"}, "x")
    assert suggest(optuna.create_study().ask(), lstm) == {}


def test_enqueued_params_are_reused():
    cfg = C.validate_config(RAW, "s.yaml")
    study = optuna.create_study()
    fixed = {"model.name": "lstm", "model.hidden_size": 24, "train.lr": 0.002}
    study.enqueue_trial(fixed)
    assert suggest(study.ask(), cfg) == fixed
