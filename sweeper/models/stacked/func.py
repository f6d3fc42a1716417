"""Any model stacked through ``torch.func``: a user's ``module:Class`` as a stack of K members.

The members' weights are stacked as a built-in stack's are (``[K, ...]`` parameters, one flat update), under
the one-member names with ``.`` spelt ``__`` (an attribute name cannot hold a dot). The forward is
``torch.func.vmap`` of ``functional_call`` over the members where vmap can run the model (one batched kernel
per layer); where it cannot (an op without a batching rule, ``nn.LSTM`` among them, or data-dependent
control flow) each member's forward runs in turn with its own slice of the weights, so the stack still
trains as one and members still never mix. :func:`stack_mode` says which a model gets, and why.

A forward that draws random numbers in training (dropout) runs member after member: vmap can only draw from
the global generator, where each member must draw from its own (the one its lone run would have drawn from,
whatever shares its stack). Under vmap, randomness is an error. In turn, each member's forward sees its own
rows only (``rows``: where the members' batches differ in rows); a model whose rows see each other (batch
statistics) runs so there, where vmap's padding would reach them (``vmap_even_rows``)."""

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from sweeper.models.stacked.base import StackedModule

VMAP, ROWS, LOOP = "vmap", "vmap_even_rows", "loop"  # ROWS: vmap where the members' rows are even


def _key(name: str) -> str:
    return name.replace(".", "__")


class FuncStack(StackedModule):
    """K members of one module class: ``x[K, B, L, F]`` -> ``[K, B]``."""

    def __init__(self, members: Sequence[nn.Module], mode: str = VMAP) -> None:
        super().__init__()
        self.members, self.mode = len(members), mode
        params, buffers = stack_module_state(list(members))
        # a template on the meta device: functional_call reads its structure, never its tensors
        self._template = [copy.deepcopy(members[0]).to("meta")]
        self._names, self._buffer_names = list(params), list(buffers)
        # what a one-member state dict holds (a non-persistent buffer is rebuilt, not loaded)
        persistent = set(members[0].state_dict())
        self._state_names = [n for n in self._names + self._buffer_names if n in persistent]
        for name, value in params.items():
            self.register_parameter(_key(name), nn.Parameter(value.detach().clone()))
        for name, value in buffers.items():
            self.register_buffer(_key(name), value.detach().clone())
        named = getattr(members[0], "no_weight_decay", None)
        self._exempt = {_key(n) for n in named()} if named is not None else set()
        self.generators: list[torch.Generator] = []  # each member's own, once seeded

    def seed_members(self, seeds: Sequence[int], device: torch.device | str,
                     states: Sequence[torch.Tensor] | None = None) -> list[torch.Generator]:
        """Each member's own generator (:meth:`StackedModule.seed_members`), kept to swap in for
        the global one while the member's forward runs."""
        self.generators = super().seed_members(seeds, device, states)
        return self.generators

    def no_weight_decay(self) -> set[str]:
        return self._exempt

    def stacked_state(self) -> dict[str, torch.Tensor]:
        own = self.state_dict()
        return {name: own[_key(name)] for name in self._state_names}

    def _tensors(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        own, bufs = dict(self.named_parameters()), dict(self.named_buffers())
        return ({n: own[_key(n)] for n in self._names}, {n: bufs[_key(n)] for n in self._buffer_names})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        template = self._template[0]
        template.train(self.training)
        params, buffers = self._tensors()
        rows = self.rows if self.training else None  # told for training steps (StackStep), not evaluations
        if self.mode == VMAP or (self.mode == ROWS and rows is None):
            def one(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], xk: torch.Tensor) -> torch.Tensor:
                return functional_call(template, (p, b), (xk,))
            # a forward may write its input (x += b): give it rows of its own, not one expanded for all
            return vmap(one, randomness="error")(params, buffers, x.contiguous())
        outs: list[torch.Tensor | None] = []
        for k, size in enumerate(rows or [x.shape[1]] * self.members):
            # its own rows only, as its lone run (dropout's draws, batch statistics); none: no forward
            with self._own_generator(k):
                own = ({n: p[k] for n, p in params.items()}, {n: b[k] for n, b in buffers.items()})
                outs.append(functional_call(template, own, (x[k, :size].clone(),)) if size else None)
        like = next(o for o in outs if o is not None)
        return torch.stack([like.new_zeros(x.shape[1]) if o is None else F.pad(o, (0, x.shape[1] - len(o)))
                            for o in outs])

    @contextmanager
    def _own_generator(self, k: int) -> Iterator[None]:
        """Member ``k``'s forward draws from its own generator: swapped in for the global one of
        its device, and back out with what the forward drew."""
        if not self.generators or not self.training:
            yield
            return
        g = self.generators[k]
        cuda = g.device.type == "cuda"
        saved = torch.cuda.get_rng_state(g.device) if cuda else torch.get_rng_state()
        (torch.cuda.set_rng_state(g.get_state(), g.device) if cuda else torch.set_rng_state(g.get_state()))
        try:
            yield
        finally:
            g.set_state(torch.cuda.get_rng_state(g.device) if cuda else torch.get_rng_state())
            torch.cuda.set_rng_state(saved, g.device) if cuda else torch.set_rng_state(saved)


def stack_mode(members: Sequence[nn.Module], lookback: int, n_features: int) -> tuple[str, str]:
    """(``vmap``, ``vmap_even_rows`` or ``loop``, why): vmap when a stack of two runs a forward and a
    backward under it in train mode, else each member's forward in turn (the reason names what vmap
    refused); where a row's output under vmap depends on the others, in turn where the rows differ."""
    probe = FuncStack([copy.deepcopy(m).cpu() for m in members[:2]] if len(members) >= 2
                      else [copy.deepcopy(members[0]).cpu()] * 2, VMAP)
    try:
        probe.train()(torch.zeros(2, 2, lookback, n_features)).sum().backward()
        x = torch.randn(2, 3, lookback, n_features, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():  # its third row moves its first two's outputs: padding would move them too
            mixes = not torch.allclose(probe(x)[:, :2], probe(x[:, :2]), rtol=1e-4, atol=1e-6)
    except Exception as exc:  # noqa: BLE001 - whatever vmap refuses, the members run in turn
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        if "randomness" in first:  # vmap draws from one generator, each member needs its own
            return LOOP, "its forward draws random numbers (dropout), each member from its own generator"
        return LOOP, f"torch.func.vmap cannot run it ({type(exc).__name__}: {first[:160]})"
    if mixes:
        return ROWS, ("a row's output depends on the batch's other rows (batch statistics), so where the "
                      "members' rows differ each member's forward runs on its own rows in turn")
    return VMAP, "torch.func.vmap runs it"
