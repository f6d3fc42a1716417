"""Each built-in model is written once, with the member count K as a dimension (issue 39): its
stack of one is the one-member model the lone loop trained, bit for bit on the CPU: the same
initial weights drawn from the same seed, the same outputs in train mode (dropout drawn from the
same generator) and in eval mode (torch's fast paths included), the same gradients. The
reference is the lone models as they were (tests/reference_models.py).

One exception, on purpose (issue 41: a trial's final scoring): a transformer pooled at its last
position evaluates its top layer at that position alone, within float rounding of the whole
layer's output (torch's fused kernel rounds otherwise), in about half its time on a CPU."""
from __future__ import annotations

import pytest
import torch

import reference_models as R
from sweeper.config import ModelConfig
from sweeper.models import build_model
from sweeper.models.stacked.base import OneMember

F, L = 3, 6
CASES = {
    "mlp": {"name": "mlp", "hidden_size": 16, "num_layers": 2, "dropout": 0.3},
    "lstm-1": {"name": "lstm", "hidden_size": 8, "num_layers": 1, "dropout": 0.3},
    "lstm-2": {"name": "lstm", "hidden_size": 8, "num_layers": 2, "dropout": 0.3},
    "gru-2": {"name": "gru", "hidden_size": 8, "num_layers": 2, "dropout": 0.3},
    "transformer": {"name": "transformer", "d_model": 16, "nhead": 2, "num_layers": 2, "dim_feedforward": 32,
                    "dropout": 0.2},
    "transformer-sin-mean-ckpt": {"name": "transformer", "d_model": 16, "nhead": 2, "num_layers": 2,
                                  "dim_feedforward": 32, "dropout": 0.1, "positional": "sinusoidal",
                                  "pooling": "mean", "gradient_checkpointing": True},
}


def _reference(m: ModelConfig) -> torch.nn.Module:
    if m.name == "mlp":
        return R.MLPModel(F, L, hidden_size=m.hidden_size, num_layers=m.num_layers, dropout=m.dropout)
    if m.name in ("lstm", "gru"):
        return R.RecurrentModel(F, L, cell=m.name, hidden_size=m.hidden_size, num_layers=m.num_layers,
                                dropout=m.dropout)
    return R.TransformerModel(F, L, d_model=m.d_model, nhead=m.nhead, num_layers=m.num_layers,
                              dim_feedforward=m.dim_feedforward, dropout=m.dropout, positional=m.positional,
                              pooling=m.pooling, gradient_checkpointing=m.gradient_checkpointing)


def _pair(case: str) -> tuple[torch.nn.Module, OneMember]:
    cfg = ModelConfig.model_validate(CASES[case])
    torch.manual_seed(0)
    reference = _reference(cfg)
    torch.manual_seed(0)
    ours = build_model(cfg, F, L)
    assert isinstance(ours, OneMember)
    return reference, ours


@pytest.mark.parametrize("case", CASES)
def test_a_stack_of_one_is_the_lone_model_to_the_bit(case):
    reference, ours = _pair(case)
    want, got = reference.state_dict(), ours.state_dict()
    assert list(got) == list(want)  # the one-member names, in order: weights.pt is unchanged
    assert all(torch.equal(got[name], value) for name, value in want.items())
    x = torch.randn(16, L, F, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(3)
    out_want = reference(x)
    torch.manual_seed(3)
    out_got = ours(x)
    assert torch.equal(out_got, out_want)  # train mode: dropout draws the same masks
    out_want.square().mean().backward()
    out_got.square().mean().backward()
    grads = {name: p.grad[0] for name, p in ours.stack.named_parameters()}
    for name, p in reference.named_parameters():
        assert torch.equal(grads[name], p.grad), name
    reference.eval()
    ours.eval()
    with torch.no_grad():  # eval mode: the transformer's fast path, as nn.TransformerEncoderLayer's
        _same_in_eval(case, ours(x), reference(x))


def _same_in_eval(case: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if CASES[case]["name"] == "transformer" and CASES[case].get("pooling", "last") == "last":
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # its last position alone
    else:
        assert torch.equal(got, want)


@pytest.mark.parametrize("case", ["mlp", "lstm-2", "transformer"])
def test_weights_saved_by_the_lone_model_load_into_its_stack_of_one(case):
    reference, ours = _pair(case)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(1.0)
    ours.load_state_dict(reference.state_dict())
    reference.eval()
    ours.eval()
    x = torch.randn(8, L, F, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _same_in_eval(case, ours(x), reference(x))
    with pytest.raises(KeyError, match="member state does not match"):
        ours.load_state_dict({"nonsense": torch.zeros(1)})
