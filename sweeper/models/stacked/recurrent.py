"""The built-in LSTM and GRU, written once with the member count K as a dimension: K >= 1
independent ``nn.LSTM``/``nn.GRU`` (batch-first, zero initial state) with a linear head, under the
one-member names (``rnn.weight_ih_l0`` ... ``head.bias``, K in front).

A stack of one is the one-member model: torch's own LSTM/GRU call, bit for bit. A stack of several
on the CPU runs each member through that kernel with its own weights, one layer at a time; on a GPU
the recurrence is written out, batched over members: per layer one batched matmul projects every
time step's input, then one per step applies the hidden weights. The gate order and equations are
torch's (LSTM i, f, g, o; GRU r, z, n with ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``), so a
member's output is its one-member model's, up to float rounding. Both run time-major, as the kernel
runs inside: the dropout between layers draws each member's noise on its ``[L, B, H]`` output
sequence, from its own generator, which on the CPU is the noise its lone run's kernel draws."""

import math
from collections.abc import Sequence

import torch
from torch import nn

from sweeper.models.stacked.base import MemberDropout, StackedLinear, StackedModule

GATES = {"lstm": 4, "gru": 3}
# where torch's fused LSTM/GRU kernel runs each member of a stack faster than the written-out
# recurrence runs them batched: on the CPU (a 4-member LSTM stack's forward and backward: 110 ms
# batched, 68 ms member by member through the kernel); on a GPU, where a small model's steps are
# launch-bound, the batched recurrence serves all members per launch
KERNEL_DEVICES = ("cpu",)


class StackedRNN(nn.Module):
    """K independent ``nn.LSTM``/``nn.GRU`` under their parameter names: ``x[K, B, L, F]`` -> the top
    layer's last hidden state ``[K, B, H]``."""

    def __init__(self, members: int, input_size: int, hidden_size: int, num_layers: int, *,
                 cell: str, dropout: Sequence[float]) -> None:
        super().__init__()
        if cell not in GATES:
            raise ValueError(f"unknown cell {cell!r}: expected one of {sorted(GATES)}")
        self.cell, self.hidden_size, self.num_layers = cell, hidden_size, num_layers
        width = GATES[cell] * hidden_size
        # torch's init: every weight and bias uniform in +-1/sqrt(H), member by member alike
        bound = 1.0 / math.sqrt(hidden_size)
        for layer in range(num_layers):
            in_size = input_size if layer == 0 else hidden_size
            for name, shape in (("weight_ih", (width, in_size)), ("weight_hh", (width, hidden_size)),
                                ("bias_ih", (width,)), ("bias_hh", (width,))):
                param = nn.Parameter(torch.empty(members, *shape).uniform_(-bound, bound))
                self.register_parameter(f"{name}_l{layer}", param)
        # as nn.LSTM: dropout on each layer's output sequence except the top layer's
        self.dropout = MemberDropout(dropout, batch_dim=1)  # on [L, B, H] sequences

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:  # a stack of one: nn.LSTM's / nn.GRU's own call, every layer at once
            # (its inter-layer dropout inside the kernel, drawn from the global generator, as nn.LSTM's)
            params = [w[0] for layer in range(self.num_layers) for w in self._weights(layer)]
            p = self.dropout.rates[0] if self.num_layers > 1 else 0.0
            return self._kernel(x[0], params, self.num_layers, p)[:, -1].unsqueeze(0)
        one_layer = self._kernel_layer if x.device.type in KERNEL_DEVICES else self._layer
        # time-major, as the kernel runs a batch-first input ([K, L, B, F]: a time step's rows are
        # one contiguous block), so each member's output sequence [L, B, H] is laid out as the one
        # its lone run's kernel drops out between layers, and its dropout draws the same masks
        seq = x.transpose(1, 2)
        for layer in range(self.num_layers):
            seq = self.dropout(seq) if layer else seq
            seq = one_layer(seq, layer, last=layer == self.num_layers - 1)
        return seq

    def _weights(self, layer: int) -> list[torch.Tensor]:
        return [self.get_parameter(f"{name}_l{layer}") for name in ("weight_ih", "weight_hh", "bias_ih",
                                                                       "bias_hh")]

    def _kernel(self, seq: torch.Tensor, params: list[torch.Tensor], layers: int, p: float, *,
                batch_first: bool = True) -> torch.Tensor:
        """torch's own LSTM/GRU kernel over one member's ``seq[B, L, in]`` (``[L, B, in]`` if not
        ``batch_first``; zero initial state)."""
        zeros = seq.new_zeros(layers, seq.shape[0 if batch_first else 1], self.hidden_size)
        # (input, state, weights, has_biases, num_layers, dropout, train, bidirectional, batch_first)
        flags = (True, layers, p, self.training, False, batch_first)
        if self.cell == "lstm":
            return torch.lstm(seq, (zeros, zeros), params, *flags)[0]
        return torch.gru(seq, zeros, params, *flags)[0]

    def _kernel_layer(self, seq: torch.Tensor, layer: int, *, last: bool) -> torch.Tensor:
        """One layer over ``seq[K, L, B, in]``, member by member through torch's own kernel:
        ``[K, L, B, H]``, or the last step's ``[K, B, H]`` for the top layer."""
        weights = self._weights(layer)
        outs = [self._kernel(seq[k], [w[k] for w in weights], 1, 0.0, batch_first=False)
                for k in range(seq.shape[0])]
        return torch.stack([out[-1] if last else out for out in outs])

    def _layer(self, seq: torch.Tensor, layer: int, *, last: bool) -> torch.Tensor:
        """One layer over ``seq[K, L, B, in]``: the output sequence ``[K, L, B, H]``, or only the
        last step's ``[K, B, H]`` for the top layer (the head reads nothing else)."""
        k, steps, batch = seq.shape[:3]
        w_ih, w_hh, b_ih, b_hh = self._weights(layer)
        # the LSTM's biases sit outside the recurrence: fold both into the one big projection;
        # the GRU's b_hn is scaled by r, so its hidden bias stays with the per-step product
        proj_bias = b_ih + b_hh if self.cell == "lstm" else b_ih
        # bmm then add_ rather than baddbmm, here and per step: baddbmm copies its addend into
        # the output before the product, and that measured slower on CPU than adding after
        proj = torch.bmm(seq.reshape(k, steps * batch, -1), w_ih.transpose(1, 2)).add_(proj_bias.unsqueeze(1))
        # unbind, not proj[t]: a select's backward zero-fills all of proj at every step
        # (quadratic in L). No copy to [L, K, B, G*H] either: each step's [K, B, G*H] is K
        # contiguous blocks already, and its add_ reads strided rows as fast as contiguous
        xs = proj.view(k, steps, batch, -1).unbind(1)
        w_hh_t = w_hh.transpose(1, 2)
        outs = (self._lstm_steps(xs, w_hh_t, keep=not last) if self.cell == "lstm"
                else self._gru_steps(xs, w_hh_t, b_hh.unsqueeze(1), keep=not last))
        return outs[-1] if last else torch.stack(outs, dim=1)

    # The steps split the gates with split(), never by slicing: a slice's backward zero-fills
    # a whole gates-sized tensor per slice, where split's backward is one cat.

    def _lstm_steps(self, xs: Sequence[torch.Tensor], w_hh_t: torch.Tensor, *,
                    keep: bool) -> list[torch.Tensor]:
        """The LSTM recurrence over ``xs[t][K, B, 4H]`` (input projection plus both biases): every
        step's ``h`` if ``keep``, else the last step's."""
        outs: list[torch.Tensor] = []
        h = c = None
        for t, x_t in enumerate(xs):
            # the state starts at zero: step 0's hidden product is zero, so skip it
            gates = x_t if h is None else torch.bmm(h, w_hh_t).add_(x_t)
            i, f, g, o = gates.split(self.hidden_size, -1)
            i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
            c = i * g if c is None else torch.addcmul(i * g, f, c)
            h = o * torch.tanh(c)
            if keep or t == len(xs) - 1:
                outs.append(h)
        return outs

    def _gru_steps(self, xs: Sequence[torch.Tensor], w_hh_t: torch.Tensor, b_hh: torch.Tensor, *,
                   keep: bool) -> list[torch.Tensor]:
        """The GRU recurrence over ``xs[t][K, B, 3H]`` (input projection plus ``b_ih``), ``b_hh[K, 1,
        3H]`` added to the hidden product: every step's ``h`` if ``keep``, else the last step's."""
        hid = self.hidden_size
        outs: list[torch.Tensor] = []
        h = None
        for t, x_t in enumerate(xs):
            # a zero state's hidden product is just the bias
            hh = b_hh if h is None else torch.bmm(h, w_hh_t).add_(b_hh)
            x_rz, x_n = x_t.split([2 * hid, hid], -1)
            h_rz, h_n = hh.split([2 * hid, hid], -1)
            r, z = torch.sigmoid(x_rz + h_rz).chunk(2, -1)
            n = torch.tanh(torch.addcmul(x_n, r, h_n))
            # (1 - z) * n + z * h, with h = 0 at the first step
            h = n - z * n if h is None else torch.addcmul(n, z, h - n)
            if keep or t == len(xs) - 1:
                outs.append(h)
        return outs


class StackedRecurrent(StackedModule):
    """x[K, B, L, F] -> K stacked LSTMs/GRUs -> each member's last hidden output -> [K, B]."""

    def __init__(self, members: int, n_features: int, lookback: int, *, cell: str = "lstm",
                 hidden_size: int = 64, num_layers: int = 2, dropout: Sequence[float] = (0.1,)) -> None:
        super().__init__()
        self.members = members
        rates = list(dropout) * members if len(dropout) == 1 else list(dropout)
        if len(rates) != members:
            raise ValueError(f"{len(rates)} dropout rates for a stack of {members}")
        # no dropout on a single layer's output (nn.LSTM would only warn)
        rates = rates if num_layers > 1 else [0.0] * members
        self.rnn = StackedRNN(members, n_features, hidden_size, num_layers, cell=cell, dropout=rates)
        self.head = StackedLinear(members, hidden_size, 1)  # nn.Linear's init, drawn after the RNN's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)).squeeze(-1)
