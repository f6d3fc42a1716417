"""StackedTransformer against K separate TransformerModels: same outputs, same gradients, the
same state dicts, and members that never mix (dropout included)."""
from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
import torch.nn.functional as F

from sweeper.models.stacked.transformer import StackedSelfAttention, StackedTransformer
from reference_models import TransformerModel

K, B, L, N_FEATURES = 3, 4, 10, 5
SHAPE = {"d_model": 16, "nhead": 2, "num_layers": 2, "dim_feedforward": 32}
TOL = {"rtol": 1e-5, "atol": 1e-6}
LAYOUTS = [("learned", "last"), ("sinusoidal", "mean"), ("learned", "mean"), ("sinusoidal", "last")]


def solos(positional: str, pooling: str, dropout: float = 0.0, **kw: object) -> list[TransformerModel]:
    """K one-member models, member s built under torch.manual_seed(s) as its own run would be."""
    out = []
    for s in range(K):
        torch.manual_seed(s)
        out.append(TransformerModel(N_FEATURES, L, **SHAPE, dropout=dropout, positional=positional,
                                    pooling=pooling, **kw))  # type: ignore[arg-type]
    return out


def stack_of(models: list[TransformerModel], positional: str, pooling: str,
             dropout: Sequence[float] = (0.0,), **kw: object) -> StackedTransformer:
    stack = StackedTransformer(len(models), N_FEATURES, L, **SHAPE, dropout=dropout,
                               positional=positional, pooling=pooling, **kw)  # type: ignore[arg-type]
    for k, m in enumerate(models):
        stack.load_member(k, m.state_dict())
    return stack


def batch(seed: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(K, B, L, N_FEATURES, generator=g), torch.randn(K, B, generator=g)


@pytest.mark.parametrize(("positional", "pooling"), LAYOUTS)
def test_forward_matches_solos(positional: str, pooling: str) -> None:
    models = solos(positional, pooling)
    stack = stack_of(models, positional, pooling)
    x, _ = batch()
    for train in (True, False):
        stack.train(train)
        for m in models:
            m.train(train)
        want = torch.stack([m(x[k]) for k, m in enumerate(models)])
        torch.testing.assert_close(stack(x), want, **TOL)
    with torch.no_grad():  # eval without autograd: the solo encoder takes torch's fast path
        want = torch.stack([m(x[k]) for k, m in enumerate(models)])
        torch.testing.assert_close(stack(x), want, **TOL)


@pytest.mark.parametrize("members", [1, K])
def test_an_evaluation_pooled_last_computes_the_top_layers_last_position_alone(members: int) -> None:
    """The whole top layer, then its last position, against that position alone (issue 41)."""
    stack = stack_of(solos("learned", "last")[:members], "learned", "last").eval()
    x = batch()[0][:members]
    with torch.no_grad():
        h = stack.project(x) + stack.positions.unsqueeze(1)
        for layer in stack.encoder.layers:
            h = layer(h)
        whole = stack.head(stack.encoder.norm(h)[:, :, -1]).squeeze(-1)
        top = stack.encoder.layers[-1]
        assert top.last_position(torch.randn(members, B, L, 16)).shape == (members, B, 1, 16)
        torch.testing.assert_close(stack(x), whole, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("positional", "pooling"), LAYOUTS[:2])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_gradients_match_solos(positional: str, pooling: str, checkpointing: bool) -> None:
    models = solos(positional, pooling, gradient_checkpointing=checkpointing)
    stack = stack_of(models, positional, pooling, gradient_checkpointing=checkpointing)
    x, y = batch()
    pred = stack(x)
    sum(F.mse_loss(pred[k], y[k]) for k in range(K)).backward()  # type: ignore[union-attr]
    for k, m in enumerate(models):
        F.mse_loss(m(x[k]), y[k]).backward()
        solo_grads = dict(m.named_parameters())
        for name, p in stack.named_parameters():
            assert p.grad is not None and solo_grads[name].grad is not None, name
            torch.testing.assert_close(p.grad[k], solo_grads[name].grad, **TOL, msg=name)


@pytest.mark.parametrize(("positional", "pooling"), LAYOUTS[:2])
def test_member_state_loads_strictly_into_a_solo(positional: str, pooling: str) -> None:
    models = solos(positional, pooling)
    stack = stack_of(models, positional, pooling).eval()
    x, _ = batch()
    out = stack(x)
    for k in range(K):
        torch.manual_seed(1000 + k)  # different weights, so the load has to do the work
        fresh = TransformerModel(N_FEATURES, L, **SHAPE, dropout=0.0, positional=positional,
                                 pooling=pooling).eval()  # type: ignore[arg-type]
        state = stack.member_state(k)
        assert {n: t.shape for n, t in state.items()} == {n: t.shape for n, t in fresh.state_dict().items()}
        fresh.load_state_dict(state, strict=True)
        torch.testing.assert_close(fresh(x[k]), out[k], **TOL)
    assert stack.no_weight_decay() == models[0].no_weight_decay()


def seeded(rates: Sequence[float], positional: str = "learned", members: int = K,
           **kw: object) -> StackedTransformer:
    """A stack with fixed weights (those of `solos`), member k's dropout seeded with 10 + k."""
    stack = stack_of(solos(positional, "last")[:members], positional, "last", dropout=rates, **kw)
    stack.seed_members([10 + k for k in range(members)], "cpu")
    return stack.train()


def test_dropout_members_never_mix() -> None:
    x, _ = batch()
    out = seeded([0.3, 0.3, 0.3])(x)
    other = seeded([0.3, 0.6, 0.3])(x)
    torch.testing.assert_close(other[0], out[0], rtol=0, atol=0)
    torch.testing.assert_close(other[2], out[2], rtol=0, atol=0)
    assert not torch.allclose(other[1], out[1])
    # a member's masks do not depend on how many members share its stack either
    alone = seeded([0.3, 0.3], members=2)(x[:2])
    torch.testing.assert_close(alone, out[:2], rtol=0, atol=0)
    assert not torch.allclose(out, seeded([0.0])(x))  # the dropout did something


def test_dropout_rate_zero_member_matches_its_solo() -> None:
    """A member at rate 0 in a stack whose other members drop: the stack takes the explicit
    attention path (attention-weight dropout), which must still be member 0's plain attention."""
    x, _ = batch()
    out = seeded([0.0, 0.3, 0.5])(x)
    solo = solos("learned", "last")[0].train()
    torch.testing.assert_close(out[0], solo(x[0]), **TOL)


def test_checkpointing_replays_member_dropout() -> None:
    """checkpoint restores only the global RNG: the recomputation must see the member masks of
    the forward, and leave the member generators where a plain step leaves them."""
    x, y = batch()
    runs = []
    for checkpointing in (False, True):
        stack = seeded([0.3, 0.2, 0.4], gradient_checkpointing=checkpointing)
        F.mse_loss(stack(x), y).backward()
        generators = next(m.generators for m in stack.modules() if getattr(m, "generators", None))
        runs.append((stack, [g.get_state() for g in generators]))
    (plain, plain_states), (ckpt, ckpt_states) = runs
    for (name, p), q in zip(plain.named_parameters(), ckpt.parameters()):
        assert p.grad is not None and q.grad is not None
        torch.testing.assert_close(q.grad, p.grad, **TOL, msg=name)
    assert all(torch.equal(a, b) for a, b in zip(plain_states, ckpt_states))


def test_attention_paths_agree() -> None:
    """The explicit softmax path (taken whenever some member drops) against SDPA, at rate 0."""
    torch.manual_seed(0)
    attn = StackedSelfAttention(K, 16, 2, [0.0] * K)
    torch.nn.init.normal_(attn.in_proj_weight, std=0.3)
    torch.nn.init.normal_(attn.out_proj.weight, std=0.3)
    x = torch.randn(K, B, L, 16)
    sdpa = attn(x)
    attn.dropout.any = True  # force the explicit path; the masks keep everything at p = 0
    torch.testing.assert_close(attn(x), sdpa, **TOL)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="dropout rates"):
        StackedTransformer(3, N_FEATURES, L, dropout=(0.1, 0.2))
    stack = StackedTransformer(2, N_FEATURES, L, **SHAPE)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="expected x"):
        stack(torch.randn(3, B, L, N_FEATURES))
    # built on its own (no load_member) it is initialised, not torch.empty garbage
    assert all(torch.isfinite(p).all() for p in stack.parameters())
    assert torch.isfinite(stack(torch.randn(2, B, L, N_FEATURES))).all()
