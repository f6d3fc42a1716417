"""Which parameters AdamW decays: weight matrices only, never biases, norms or position tables."""
from __future__ import annotations

from sweeper.core.schedule import make_optimizer
from sweeper.models.transformer import TransformerModel


def _decayed_names(model, optimizer):
    names = {id(p): n for n, p in model.named_parameters()}
    return {group["weight_decay"]: sorted(names[id(p)] for p in group["params"]) for group in optimizer.param_groups}


def test_learned_position_table_is_not_decayed():
    model = TransformerModel(3, 5, d_model=8, nhead=2, num_layers=1, dim_feedforward=16, positional="learned")
    groups = _decayed_names(model, make_optimizer(model, 1e-3, 0.01))
    assert "positions" in groups[0.0]
    assert "positions" not in groups[0.01]
    assert all(name.endswith("weight") for name in groups[0.01])
    assert "project.weight" in groups[0.01] and "head.weight" in groups[0.01]
    assert {"project.bias", "head.bias", "encoder.norm.weight"} <= set(groups[0.0])


def test_sinusoidal_table_is_a_buffer_not_a_parameter():
    model = TransformerModel(3, 5, d_model=8, nhead=2, num_layers=1, dim_feedforward=16, positional="sinusoidal")
    assert model.no_weight_decay() == set()
    groups = _decayed_names(model, make_optimizer(model, 1e-3, 0.01))
    assert "positions" not in groups[0.0] + groups[0.01]
