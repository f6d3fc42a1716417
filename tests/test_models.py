from __future__ import annotations

import pytest
import torch

from sweeper.config import ModelConfig
from sweeper.errors import ConfigError
from sweeper.models import build_model, resolve_model_class
from sweeper.models.stacked.base import StackedLinear
from sweeper.models.stacked.transformer import StackedTransformer, sinusoidal_positions


@pytest.mark.parametrize("cfg", [
    dict(name="transformer", d_model=16, nhead=2, dim_feedforward=32),
    dict(name="transformer", d_model=16, nhead=4, positional="sinusoidal", pooling="mean"),
    dict(name="lstm", hidden_size=8, num_layers=2),
    dict(name="gru", hidden_size=8, num_layers=1),
    dict(name="mlp", hidden_size=8, num_layers=3),
])
def test_builtin_models_map_windows_to_one_prediction_per_row(cfg):
    torch.manual_seed(0)
    model = build_model(ModelConfig(**cfg), n_features=5, lookback=7)
    out = model(torch.randn(3, 7, 5))
    assert out.shape == (3,)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_model_hyperparameters_reach_the_modules():
    # a built-in model is its stack of one member: the sizes are the stack's, K = 1 in front
    lstm = build_model(ModelConfig(name="lstm", hidden_size=12, num_layers=3, dropout=0.2), 4, 6).stack
    assert (lstm.rnn.hidden_size, lstm.rnn.num_layers, lstm.rnn.dropout.rates) == (12, 3, [0.2])
    assert build_model(ModelConfig(name="gru"), 4, 6).stack.rnn.cell == "gru"
    tf = build_model(ModelConfig(name="transformer", d_model=24, nhead=3, num_layers=3, dim_feedforward=40),
                     4, 6).stack
    assert len(tf.encoder.layers) == 3
    assert tf.encoder.layers[0].linear1.weight.shape == (1, 40, 24)
    assert tf.encoder.layers[0].self_attn.nhead == 3
    mlp = build_model(ModelConfig(name="mlp", hidden_size=10, num_layers=2), 4, 6).stack
    assert [m.weight.shape[-1] for m in mlp.net if isinstance(m, StackedLinear)] == [24, 10, 10]


def test_sinusoidal_positions_follow_the_formula():
    table = sinusoidal_positions(5, 4)
    assert table[0].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert table[3, 2].item() == pytest.approx(torch.sin(torch.tensor(3 / 100.0)).item())
    assert table[3, 3].item() == pytest.approx(torch.cos(torch.tensor(3 / 100.0)).item())


def test_pooling_choice_changes_what_the_head_sees():
    torch.manual_seed(0)
    last = StackedTransformer(2, 3, 5, d_model=8, nhead=2, dropout=(0.0,), pooling="last").eval()
    mean = StackedTransformer(2, 3, 5, d_model=8, nhead=2, dropout=(0.0,), pooling="mean").eval()
    mean.load_state_dict(last.state_dict())
    x = torch.randn(2, 4, 5, 3)
    assert not torch.allclose(mean(x), last(x))
    h = last.project(x) + last.positions.unsqueeze(1)
    for layer in last.encoder.layers:
        h = layer(h)
    h = last.encoder.norm(h)
    torch.testing.assert_close(mean(x), mean.head(h.mean(dim=2)).squeeze(-1))
    torch.testing.assert_close(last(x), last.head(h[:, :, -1]).squeeze(-1))


def test_gradient_checkpointing_gives_the_same_outputs_and_gradients():
    torch.manual_seed(0)
    plain = build_model(ModelConfig(name="transformer", d_model=8, nhead=2, num_layers=2, dropout=0.0), 3, 6)
    ckpt = build_model(ModelConfig(name="transformer", d_model=8, nhead=2, num_layers=2, dropout=0.0,
                                   gradient_checkpointing=True), 3, 6)
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(5, 6, 3)
    out_plain, out_ckpt = plain(x), ckpt(x)
    torch.testing.assert_close(out_ckpt, out_plain)
    out_plain.square().sum().backward()
    out_ckpt.square().sum().backward()
    for a, b in zip(plain.parameters(), ckpt.parameters()):
        torch.testing.assert_close(b.grad, a.grad)


def test_custom_dotted_path_gets_features_lookback_and_extra_keys():
    model = build_model(ModelConfig(name="custom_model:Tiny", scale=2.5), n_features=4, lookback=9)
    assert type(model).__name__ == "Tiny"
    assert (model.scale, model.lookback, model.linear.in_features) == (2.5, 9, 4)
    assert resolve_model_class("custom_model:Tiny") is type(model)


def test_resolve_model_class_knows_the_builtins():
    assert resolve_model_class("transformer") is StackedTransformer


def test_import_error_names_the_key_and_the_cause():
    with pytest.raises(ConfigError) as err:
        build_model(ModelConfig(name="no_such_pkg_xyz.models:Net"), 4, 5)
    msg = str(err.value)
    assert "model.name 'no_such_pkg_xyz.models:Net'" in msg
    assert "ModuleNotFoundError: No module named 'no_such_pkg_xyz'" in msg


def test_missing_class_is_a_config_error():
    with pytest.raises(ConfigError, match="module 'custom_model' has no attribute 'Nope'"):
        resolve_model_class("custom_model:Nope")


def test_wrong_output_shape_is_caught_at_build_time():
    with pytest.raises(ConfigError, match=r"must return a tensor of shape \[B\]; got \(2, 1\)"):
        build_model(ModelConfig(name="custom_model:WrongShape"), 4, 5)


@pytest.mark.parametrize(("cast", "got"), [(False, "torch.float32, requires_grad=False"),
                                           (True, "torch.int64, requires_grad=False")])
def test_an_output_without_a_gradient_is_caught_by_the_model_check(cast, got):
    """validate passed it, then every trial crashed in backward ("does not require grad")."""
    from sweeper.models.check import Job, check_one

    job = Job("custom_model:Detached", {"name": "custom_model:Detached", "cast": cast})
    assert check_one(job, 4, 5) == (f"model.name 'custom_model:Detached': forward must return a float tensor that "
                                    f"carries a gradient; got {got}")
    # a model whose eval branch needs no gradient (its own no_grad, an EMA copy) trains, and passes
    assert check_one(Job("custom_model:EvalNoGrad", {"name": "custom_model:EvalNoGrad"}), 4, 5) is None
    # and one whose train() returns None (it called the returned value: 'NoneType' is not callable)
    assert check_one(Job("custom_model:TrainNoReturn", {"name": "custom_model:TrainNoReturn"}), 4, 5) is None


def test_a_model_with_nothing_to_train_is_caught_at_build_time():
    with pytest.raises(ConfigError, match=r"^model.name 'custom_model:NoWeights': the model has no trainable "
                                          r"parameters$"):
        build_model(ModelConfig(name="custom_model:NoWeights"), 4, 5)


def test_a_float64_model_is_caught_at_build_time():
    """It passed validate, then every trial crashed in the optimizer (its state is float32)."""
    with pytest.raises(ConfigError, match=r"^model.name 'custom_model:Double': its parameters must be float32 "
                                          r"\(train.precision .*\), not torch.float64$"):
        build_model(ModelConfig(name="custom_model:Double"), 4, 5)


def test_a_weight_decay_exemption_that_names_no_parameter_is_caught_at_build_time():
    with pytest.raises(ConfigError, match=r"^model.name 'custom_model:Typo': no_weight_decay\(\) names no "
                                          r"parameter \['linear.weigth'\]$"):
        build_model(ModelConfig(name="custom_model:Typo"), 4, 5)


def test_bad_constructor_kwargs_are_a_config_error():
    with pytest.raises(ConfigError, match="unexpected keyword argument 'widht'"):
        build_model(ModelConfig(name="custom_model:Tiny", widht=3), 4, 5)


# ---------------------------------------------------------------- model shapes of a search space

def _space_config(space, model=None):
    from sweeper.config import validate_config

    raw = {"data": {"synthetic": {"assets": 20, "dates": 200, "features": 3}}, "search_space": space}
    if model:
        raw["model"] = model
    return validate_config(raw, "s.yaml")


def test_shape_combinations_follow_conditions_and_skip_fractions():
    from sweeper.models.shapes import shape_combinations

    cfg = _space_config({
        "model.name": {"type": "categorical", "choices": ["transformer", "lstm"]},
        "model.d_model": {"type": "categorical", "choices": [16, 32], "when": {"model.name": "transformer"}},
        "model.hidden_size": {"type": "categorical", "choices": [8, 16], "when": {"model.name": ["lstm", "gru"]}},
        "model.dropout": {"type": "categorical", "choices": [0.1, 0.2]},
        "train.batch_size": {"type": "categorical", "choices": [64, 128]},
    })
    assert shape_combinations(cfg) == [
        {"model.name": "transformer", "model.d_model": 16}, {"model.name": "transformer", "model.d_model": 32},
        {"model.name": "lstm", "model.hidden_size": 8}, {"model.name": "lstm", "model.hidden_size": 16},
    ]
    # a condition on a key outside the space reads the study file's value (model.name: transformer)
    only = _space_config({"model.hidden_size": {"type": "categorical", "choices": [8, 16],
                                                "when": {"model.name": "lstm"}}})
    assert shape_combinations(only) == [{}]


def test_more_than_64_shapes_are_not_each_built():
    from sweeper.models.shapes import check_study_models, shape_combinations

    space = {"model.num_layers": {"type": "categorical", "choices": list(range(1, 14))},
             "model.hidden_size": {"type": "categorical", "choices": [4, 8, 12, 16, 20]}}
    cfg = _space_config(space, {"name": "mlp", "hidden_size": 4})
    assert shape_combinations(cfg) is None
    assert shape_combinations(cfg, limit=65) is not None
    assert check_study_models(cfg, 3, 5) == [
        "note: search_space: more than 64 combinations of model choices; they are not each built in advance"]


@pytest.mark.slow
def test_a_sampled_model_name_that_does_not_import_is_an_error():
    from sweeper.models.shapes import check_study_models

    cfg = _space_config({"model.name": {"type": "categorical", "choices": ["mlp", "no_such_mod_xyz:Net"]}},
                        {"name": "mlp"})
    with pytest.raises(ConfigError, match=r"^model.name 'no_such_mod_xyz:Net': cannot import module 'no_such_mod_xyz'"):
        check_study_models(cfg, 3, 5)



@pytest.mark.slow
def test_built_in_shapes_checked_in_a_child_answer_as_they_do_in_process():
    """``sweeper run`` (a fork server at hand) sends the built-in models to the checking child too,
    so that its driver imports no torch: one request, the study's own model first, then each shape."""
    import json

    from sweeper.models.check import python_child
    from sweeper.models.shapes import check_study_models

    cfg = _space_config({"model.hidden_size": {"type": "categorical", "choices": [4, 8]}},
                        {"name": "lstm", "hidden_size": 16})
    asked = []

    def child(request: str, timeout: float) -> tuple[str, int | None]:
        asked.append(json.loads(request))
        return python_child(request, timeout)

    assert check_study_models(cfg, 3, 5, child) == []
    assert asked == []  # by default the built-in models are built in this process: no child at all
    assert check_study_models(cfg, 3, 5, child, builtins_in_child=True) == []
    (request,) = asked
    assert [(j["name"], j["model"]["hidden_size"], j["fatal"]) for j in request["jobs"]] == [
        ("lstm", 16, True), ("lstm", 4, False), ("lstm", 8, False)]
    assert (request["n_features"], request["lookback"]) == (3, 5)
