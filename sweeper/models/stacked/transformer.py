"""The built-in transformer, written once with the member count K as a dimension: K >= 1 pre-norm
encoders under ``nn.TransformerEncoder``'s names (``encoder.layers.N.self_attn.in_proj_weight`` ...,
K in front): a linear projection plus positions, the encoder, pooling, a linear head. Evaluated and
pooled at its last position, its top layer computes that position alone (``last_position``).

A stack of one is the one-member model: torch's own ``nn.TransformerEncoderLayer`` (its kernels, its eval fast
path) on the member's weights, drawn in its order. In a stack of several every linear is one batched matmul,
layer norms normalise without affine and then apply each member's scale and shift, and attention is one
``scaled_dot_product_attention`` over ``K * B`` sequences. Dropout sits where ``nn.TransformerEncoderLayer``
puts it, with each member's own rate and generator, and draws each member's masks as its lone run's layer
draws them, in its order: the attention weights ``[B, nhead, L, L]`` (SDPA's math path, which torch takes when
it drops out), ``dropout1`` on the attention's output (time-major underneath, as ``nn.MultiheadAttention``
leaves it), the feed-forward's ``dropout``, then ``dropout2``."""

import math
from collections.abc import Callable, Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from torch.utils.checkpoint import checkpoint

from sweeper.models.stacked.base import MemberDropout, StackedLinear, StackedModule, stacked_affine

# nn.TransformerEncoderLayer's and nn.LayerNorm's default epsilon
LAYER_NORM_EPS = 1e-5


def sinusoidal_positions(length: int, d_model: int) -> torch.Tensor:
    """The fixed sine/cosine table of "Attention is all you need", [length, d_model]."""
    pos = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(length, d_model)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: d_model // 2])
    return table


def _member_view(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-member ``[K, D]`` tensor shaped ``[K, 1, ..., 1, D]`` to broadcast against ``like``."""
    return t.view(t.shape[0], *([1] * (like.dim() - 2)), t.shape[-1])


class StackedLayerNorm(nn.Module):
    """K independent ``nn.LayerNorm(d)``: ``weight[K, d]``, ``bias[K, d]``."""

    def __init__(self, members: int, d: int, eps: float = LAYER_NORM_EPS) -> None:
        super().__init__()
        self.eps = eps
        self.weight, self.bias = nn.Parameter(torch.ones(members, d)), nn.Parameter(torch.zeros(members, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:  # a stack of one: nn.LayerNorm's own call
            return F.layer_norm(x[0], x.shape[-1:], self.weight[0], self.bias[0], self.eps).unsqueeze(0)
        # the normalisation itself has no parameters, so one call serves every member
        h = F.layer_norm(x, x.shape[-1:], eps=self.eps)
        return torch.addcmul(_member_view(self.bias, x), h, _member_view(self.weight, x))


class StackedSelfAttention(nn.Module):
    """K independent ``nn.MultiheadAttention(d, nhead, batch_first=True)`` used as self-attention,
    with the same parameter names (``in_proj_weight[K, 3d, d]``, ``in_proj_bias``, ``out_proj``)."""

    def __init__(self, members: int, d_model: int, nhead: int, rates: Sequence[float]) -> None:
        super().__init__()
        if d_model % nhead:
            raise ValueError(f"d_model {d_model} is not a multiple of nhead {nhead}")
        self.nhead = nhead
        self.in_proj_weight = nn.Parameter(torch.empty(members, 3 * d_model, d_model))
        self.in_proj_bias = nn.Parameter(torch.zeros(members, 3 * d_model))
        self.out_proj = StackedLinear(members, d_model, d_model, init=False)
        self.dropout = MemberDropout(rates)  # on the attention weights, as nn.MultiheadAttention

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, b, length, d = x.shape
        head_dim = d // self.nhead
        # StackedLinear's arithmetic: the in-projection keeps nn.MultiheadAttention's flat names
        qkv = stacked_affine(x, self.in_proj_weight, self.in_proj_bias)
        # the 3d outputs are [q | k | v], each split into nhead contiguous heads, as in MHA
        q, key, v = qkv.view(k, b, length, 3, self.nhead, head_dim).permute(3, 0, 1, 4, 2, 5).unbind(0)
        if self.training and self.dropout.any:  # dropout1 too (one rate per member for the layer)
            out = self._attend_with_dropout(q, key, v)
            # laid out as nn.MultiheadAttention lays out its output, time-major [L, B, d] seen
            # batch-first, so that dropout1 fills each member's noise in its lone run's order
            return self.out_proj(out.permute(0, 3, 1, 2, 4).reshape(k, length, b, d)).transpose(1, 2)
        shape = (k * b, self.nhead, length, head_dim)
        out = F.scaled_dot_product_attention(q.reshape(shape), key.reshape(shape), v.reshape(shape))
        # batch-first: SDPA's output is laid out [B, L, nhead, hd] underneath, so this is a view
        out = out.view(k, b, self.nhead, length, head_dim).transpose(2, 3)
        return self.out_proj(out.reshape(k, b, length, d))

    def last_query(self, x: torch.Tensor) -> torch.Tensor:
        """The last position's query alone over every key, ``[K, B, 1, d]`` (an evaluation: no dropout):
        q projected for that position only, k and v for all (docs/performance.md: a forward's time)."""
        k, b, length, d = x.shape
        head_dim, w, bias = d // self.nhead, self.in_proj_weight, self.in_proj_bias
        q = stacked_affine(x[:, :, -1:], w[:, :d], bias[:, :d]).view(k * b, 1, self.nhead, head_dim)
        kv = stacked_affine(x, w[:, d:], bias[:, d:]).view(k, b, length, 2, self.nhead, head_dim)
        key, v = (t.reshape(k * b, self.nhead, length, head_dim) for t in kv.permute(3, 0, 1, 4, 2, 5))
        out = F.scaled_dot_product_attention(q.transpose(1, 2), key, v)
        return self.out_proj(out.view(k, b, self.nhead, 1, head_dim).transpose(2, 3).reshape(k, b, 1, d))

    def _attend_with_dropout(self, q: torch.Tensor, key: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Attention spelled out, ``[K, B, H, L, hd]`` in and out: SDPA takes one dropout rate and the
        global generator, the members need their own. Its math path's arithmetic (the one a lone run
        takes with dropout: q and k each scaled by the root of the scale), and its dropout on the
        weights ``[B, H, L, L]`` of each member."""
        scale = math.sqrt(1.0 / math.sqrt(q.shape[-1]))
        scores = torch.matmul(q * scale, key.transpose(-2, -1) * scale)
        return torch.matmul(self.dropout(torch.softmax(scores, dim=-1)), v)


class StackedEncoderLayer(nn.Module):
    """K independent pre-norm ``nn.TransformerEncoderLayer(..., activation="gelu",
    batch_first=True, norm_first=True)``, submodule for submodule."""

    def __init__(self, members: int, d_model: int, nhead: int, dim_feedforward: int,
                 rates: Sequence[float]) -> None:
        super().__init__()
        self.self_attn = StackedSelfAttention(members, d_model, nhead, rates)
        self.linear1 = StackedLinear(members, d_model, dim_feedforward, init=False)
        self.dropout = MemberDropout(rates)
        self.linear2 = StackedLinear(members, dim_feedforward, d_model, init=False)
        self.norm1 = StackedLayerNorm(members, d_model)
        self.norm2 = StackedLayerNorm(members, d_model)
        self.dropout1, self.dropout2 = MemberDropout(rates), MemberDropout(rates)
        # a stack of one's torch layer: a meta-device template outside the module tree (it holds no tensor)
        self._torch = [nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, rates[0],
                                                  activation="gelu", batch_first=True, norm_first=True,
                                                  device="meta")]

    def init_member(self, k: int) -> None:
        """Member ``k``'s weights drawn as ``nn.TransformerEncoderLayer`` draws them."""
        attn = self.self_attn
        attn.out_proj.init_member(k)
        with torch.no_grad():
            nn.init.xavier_uniform_(attn.in_proj_weight[k])
            attn.in_proj_bias[k].zero_()
            assert attn.out_proj.bias is not None
            attn.out_proj.bias[k].zero_()
        self.linear1.init_member(k)
        self.linear2.init_member(k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            template = self._torch[0]
            template.train(self.training)
            weights = {name: p[0] for name, p in self.named_parameters()}
            return functional_call(template, weights, (x[0],)).unsqueeze(0)
        x = x + self.dropout1(self.self_attn(self.norm1(x)))
        return x + self.dropout2(self.linear2(self.dropout(F.gelu(self.linear1(self.norm2(x))))))

    def last_position(self, x: torch.Tensor) -> torch.Tensor:
        """The layer's output at the last position alone, ``[K, B, 1, d]``, in eval mode: all that
        pooling at the last position reads of the top layer (one query's attention over every key,
        one position's feed-forward). Within float rounding of the whole layer's (torch's fused
        kernel at K = 1 rounds otherwise), in a fraction of its time on a CPU (docs/performance.md)."""
        x = x[:, :, -1:] + self.self_attn.last_query(self.norm1(x))
        return x + self.linear2(F.gelu(self.linear1(self.norm2(x))))


class StackedEncoder(nn.Module):
    """``nn.TransformerEncoder``'s layout (``layers``, ``norm``) so the state dict names match."""

    def __init__(self, layers: list[StackedEncoderLayer], norm: StackedLayerNorm) -> None:
        super().__init__()
        self.layers, self.norm = nn.ModuleList(layers), norm


def _replaying(layer: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``layer`` wrapped so that checkpoint's recomputation draws the same dropout masks.

    checkpoint restores the global generators for the recomputation, not the members' own
    ones: without this the recomputed masks differ from the forward's (wrong gradients) and
    every member generator advances twice per step (masks that depend on checkpointing)."""
    # the distinct per-member dropout generators inside the layer (none until seeded)
    generators = list({id(g): g for m in layer.modules() if isinstance(m, MemberDropout) and m.any
                       and m.generators is not None for g in m.generators}.values())
    before, calls = [g.get_state() for g in generators], 0

    def run(h: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        calls += 1
        if calls == 1 or not generators:
            return layer(h)
        after = [g.get_state() for g in generators]
        for g, state in zip(generators, before):
            g.set_state(state)
        try:
            return layer(h)
        finally:  # also when checkpoint stops the recomputation early
            for g, state in zip(generators, after):
                g.set_state(state)

    return run


class StackedTransformer(StackedModule):
    """x[K, B, L, F] -> linear projection + positions -> pre-norm encoder -> pooled -> [K, B]."""

    positions: torch.Tensor

    def __init__(self, members: int, n_features: int, lookback: int, *, d_model: int = 64,
                 nhead: int = 4, num_layers: int = 2, dim_feedforward: int = 128,
                 dropout: Sequence[float] = (0.1,), positional: str = "learned",
                 pooling: str = "last", gradient_checkpointing: bool = False) -> None:
        super().__init__()
        if len(dropout) not in (1, members):
            raise ValueError(f"{len(dropout)} dropout rates for a stack of {members}")
        self.members = members
        rates = list(dropout) * members if len(dropout) == 1 else list(dropout)
        self.project = StackedLinear(members, n_features, d_model, init=False)
        self.learned_positions = positional == "learned"
        if self.learned_positions:
            self.positions = nn.Parameter(torch.empty(members, lookback, d_model))
        else:
            # fixed and equal for every member: one table, broadcast over K
            self.register_buffer("positions", sinusoidal_positions(lookback, d_model), persistent=False)
        layers = [StackedEncoderLayer(members, d_model, nhead, dim_feedforward, rates)
                  for _ in range(num_layers)]
        self.encoder = StackedEncoder(layers, StackedLayerNorm(members, d_model))
        self.pooling, self.gradient_checkpointing = pooling, gradient_checkpointing
        self.head = StackedLinear(members, d_model, 1, init=False)
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        """Each member's weights drawn in the one-member model's order (a stack of one starts, draw for
        draw, where a lone run started): the projection, the position table, the encoder layer
        (nn.TransformerEncoder deep-copies one layer into every layer), the head."""
        first = cast(StackedEncoderLayer, self.encoder.layers[0])
        with torch.no_grad():
            for k in range(self.members):
                self.project.init_member(k)
                if self.learned_positions:
                    self.positions[k] = torch.randn(self.positions.shape[1:]) * 0.02
                first.init_member(k)
                for layer in self.encoder.layers[1:]:
                    for mine, theirs in zip(layer.parameters(), first.parameters()):
                        mine[k] = theirs[k]
                self.head.init_member(k)

    def no_weight_decay(self) -> set[str]:
        """The one-member model's exemption: the learned position table, when there is one."""
        return {"positions"} if self.learned_positions else set()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[0] != self.members:
            raise ValueError(f"expected x[{self.members}, B, L, F], got {list(x.shape)}")
        length = x.shape[2]
        positions = self.positions[:, -length:].unsqueeze(1) if self.learned_positions \
            else self.positions[-length:]
        h = self.project(x) + positions
        checkpointing = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        top = len(self.encoder.layers) - 1 if self.pooling == "last" and not self.training else None
        for i, layer in enumerate(self.encoder.layers):
            if checkpointing:  # trade one extra forward per layer for not storing its activations
                h = checkpoint(_replaying(layer), h, use_reentrant=False)
            else:  # an evaluation pooled at the last position reads nothing else of the top layer
                h = cast(StackedEncoderLayer, layer).last_position(h) if i == top else layer(h)
        h = self.encoder.norm(h)
        return self.head(h[:, :, -1] if self.pooling == "last" else h.mean(dim=2)).squeeze(-1)
