"""A member of a built-in stack of several draws exactly the dropout masks its lone run draws
(issue 40): stacked with members of other dropout rates (one without), learning rates, weight
decays and seeds, each member's weights after five optimizer steps of the loop's own stacked step
are its lone run's (the stack of one, torch's own kernels and ``F.dropout`` from the global
generator) to float rounding."""
from __future__ import annotations

import pytest
import torch
from tests.toy_panel import toy_config, toy_panel

import sweeper.models.stacked.recurrent as recurrent
from sweeper.core.lanes import Member
from sweeper.core.loop import stack_step
from sweeper.core.schedule import Rows

MODELS = {"mlp": {"hidden_size": 16, "num_layers": 2},
          "lstm": {"hidden_size": 8, "num_layers": 3}, "gru": {"hidden_size": 8, "num_layers": 3},
          "transformer": {"d_model": 8, "nhead": 2, "num_layers": 2, "dim_feedforward": 16}}
# (dropout, lr, weight decay, seed) of each member: one draws no mask at all
RUNS = [(0.3, 3e-3, 0.0, 0), (0.0, 1e-2, 0.1, 1), (0.1, 1e-3, 0.01, 7), (0.5, 5e-3, 0.3, 42)]
STEPS, BATCH = 5, 32


def _trained(members: list[Member], uneven: bool = False) -> list[dict[str, torch.Tensor]]:
    """Each member's weights after STEPS steps of the loop's stacked step (its lanes, its stack
    seeded as the loop seeds it, its AdamW), on the same rows of its own panel whatever its stack.
    ``uneven``: each member's batches are its own size (an IC loss's whole dates, a shorter fold's
    last batch), so a stack pads the shorter members' to the longest's."""
    step = stack_step(members, torch.device("cpu"))
    step.forward.train()
    for s in range(STEPS):
        rows: list[Rows | None] = []
        for member, lane in zip(members, step.lanes):
            g = torch.Generator().manual_seed(1000 * s + member.cfg.train.seed)
            size = BATCH - 3 * ((member.cfg.train.seed + s) % 4) if uneven else BATCH
            rows.append(Rows(lane.batcher.index[torch.randperm(lane.batcher.n_samples, generator=g)[:size]]))
        step(rows, BATCH)
    return [step.stack.member_state(k) for k in range(len(members))]


@pytest.mark.parametrize(("name", "variant"), [
    ("mlp", {}), ("lstm", {}), ("gru", {}),
    # members whose batches differ in size: a shorter member draws masks for its own rows only (it drew
    # for the padded rows too, which moved its generator on, and its scores with the stack's size)
    ("mlp", {"uneven": True}), ("lstm", {"uneven": True}), ("transformer", {"uneven": True}),
    # the recurrence a GPU runs, here on the CPU: its masks are the kernel's too
    ("lstm", {"written_out": True}), ("gru", {"written_out": True}),
    ("transformer", {}), ("transformer", {"gradient_checkpointing": True}),
])
def test_a_stack_member_draws_its_lone_runs_dropout_masks(name, variant, monkeypatch):
    variant = dict(variant)
    if variant.pop("written_out", False):
        monkeypatch.setattr(recurrent, "KERNEL_DEVICES", ())
    uneven = variant.pop("uneven", False)
    panel = toy_panel()
    members = [Member(toy_config(model={"name": name, "dropout": p, **MODELS[name], **variant}, lr=lr,
                                 weight_decay=wd, seed=seed), panel) for p, lr, wd, seed in RUNS]
    stacked = _trained(members, uneven)
    for k, member in enumerate(members):
        for key, want in _trained([member], uneven)[0].items():
            got = stacked[k][key]
            if key.endswith("self_attn.in_proj_bias"):
                # the key bias shifts every score of a query alike, which softmax cancels: its
                # gradient is round-off, which Adam scales up to +-lr in either run
                d = want.shape[0] // 3
                got, want = torch.cat([got[:d], got[2 * d:]]), torch.cat([want[:d], want[2 * d:]])
            # relative, and absolute for weights near zero (whose own relative error means nothing)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6,
                                       msg=lambda m, k=k, key=key: f"member {k} {key}: {m}")
