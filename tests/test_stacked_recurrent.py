"""The stacked LSTM/GRU against K one-member RecurrentModels (the lone models as they were,
tests/reference_models.py): outputs, gradients, member state round trips, and members that never
mix through dropout; both recurrences of a stack of several (torch's kernel per member, the CPU's;
batched, a GPU's)."""
from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import sweeper.models.stacked.recurrent as recurrent
from reference_models import RecurrentModel
from sweeper.models.stacked.recurrent import StackedRecurrent

K, B, L, N_FEATURES, HIDDEN = 3, 5, 7, 4, 6
TOL = {"rtol": 1e-5, "atol": 1e-6}
SHAPES = [(cell, layers) for cell in ("lstm", "gru") for layers in (1, 2)]
PATHS = [(cell, layers, per_member) for cell, layers in SHAPES for per_member in (True, False)]


def solos(cell: str, layers: int) -> list[RecurrentModel]:
    """K one-member models, member k built under seed k (as K separate runs would be)."""
    models = []
    for seed in range(K):
        torch.manual_seed(seed)
        models.append(RecurrentModel(N_FEATURES, L, cell=cell, hidden_size=HIDDEN, num_layers=layers,
                                     dropout=0.0))
    return models


def stack_of(models: list[RecurrentModel], cell: str, layers: int) -> StackedRecurrent:
    stack = StackedRecurrent(len(models), N_FEATURES, L, cell=cell, hidden_size=HIDDEN,
                             num_layers=layers, dropout=(0.0,))
    for k, model in enumerate(models):
        stack.load_member(k, model.state_dict())
    return stack


def batch(seed: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(K, B, L, N_FEATURES, generator=gen), torch.randn(K, B, generator=gen)


@pytest.mark.parametrize(("cell", "layers"), SHAPES)
def test_names_and_shapes_mirror_the_solo(cell: str, layers: int) -> None:
    solo = solos(cell, layers)[0].state_dict()
    stack = StackedRecurrent(K, N_FEATURES, L, cell=cell, hidden_size=HIDDEN, num_layers=layers)
    stacked = stack.state_dict()
    assert list(stacked) == list(solo)
    for name, t in solo.items():
        assert stacked[name].shape == (K, *t.shape), name


@pytest.mark.parametrize(("cell", "layers", "per_member"), PATHS)
def test_forward_matches_solos(cell: str, layers: int, per_member: bool, monkeypatch) -> None:
    monkeypatch.setattr(recurrent, "KERNEL_DEVICES", ("cpu",) if per_member else ())
    models = solos(cell, layers)
    stack = stack_of(models, cell, layers)
    x, _ = batch()
    out = stack(x)
    assert out.shape == (K, B)
    expected = torch.stack([m(x[k]) for k, m in enumerate(models)])
    torch.testing.assert_close(out, expected, **TOL)


@pytest.mark.parametrize(("cell", "layers", "per_member"), PATHS)
def test_gradients_match_solos(cell: str, layers: int, per_member: bool, monkeypatch) -> None:
    monkeypatch.setattr(recurrent, "KERNEL_DEVICES", ("cpu",) if per_member else ())
    models = solos(cell, layers)
    stack = stack_of(models, cell, layers)
    x, y = batch()
    pred = stack(x)
    torch.stack([F.mse_loss(pred[k], y[k]) for k in range(K)]).sum().backward()
    grads = dict(stack.named_parameters())
    for k, model in enumerate(models):
        F.mse_loss(model(x[k]), y[k]).backward()
        for name, param in model.named_parameters():
            assert param.grad is not None and grads[name].grad is not None, name
            torch.testing.assert_close(grads[name].grad[k], param.grad, **TOL, msg=f"{name}[{k}]")


@pytest.mark.parametrize(("cell", "layers"), SHAPES)
def test_member_state_round_trips(cell: str, layers: int) -> None:
    stack = stack_of(solos(cell, layers), cell, layers)
    x, _ = batch()
    out = stack(x)
    for k in range(K):
        fresh = RecurrentModel(N_FEATURES, L, cell=cell, hidden_size=HIDDEN, num_layers=layers, dropout=0.0)
        fresh.load_state_dict(stack.member_state(k), strict=True)
        torch.testing.assert_close(fresh(x[k]), out[k], **TOL)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_dropout_members_never_mix(cell: str) -> None:
    x, _ = batch()

    def run(rate1: float) -> torch.Tensor:
        torch.manual_seed(0)
        stack = StackedRecurrent(2, N_FEATURES, L, cell=cell, hidden_size=HIDDEN, num_layers=2,
                                 dropout=(0.5, rate1)).train()
        stack.seed_members([11, 12], "cpu")
        return stack(x[:2])

    base = run(0.5)
    for rate1 in (0.0, 0.9):
        out = run(rate1)
        torch.testing.assert_close(out[0], base[0], rtol=0, atol=0)
        assert not torch.allclose(out[1], base[1])  # member 1 did see its new rate
    # and the dropout is live: member 0 differs from its own eval-mode output
    torch.manual_seed(0)
    plain = StackedRecurrent(2, N_FEATURES, L, cell=cell, hidden_size=HIDDEN, num_layers=2,
                             dropout=(0.5, 0.5)).eval()
    assert not torch.allclose(plain(x[:2])[0], base[0])


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="dropout rates"):
        StackedRecurrent(3, N_FEATURES, L, dropout=(0.1, 0.2))
    with pytest.raises(ValueError, match="unknown cell"):
        StackedRecurrent(3, N_FEATURES, L, cell="rnn")
