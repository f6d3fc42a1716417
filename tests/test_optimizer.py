"""The trial's optimizer: which parameters AdamW decays (weight matrices only, never biases,
norms or position tables), and that it is torch's AdamW to the bit without importing torch._dynamo."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from conftest import TINY, merge
from reference_models import TransformerModel, make_optimizer


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


# ------------------------------------------------------------ torch's AdamW, unguarded

STEPS, SKIP_AT, LR, WD, CLIP = 6, 3, 1e-2, 0.1, 0.5


def warmup(step: int) -> float:
    return min(1.0, (step + 1) / 4)


def _transformer():
    import torch

    torch.manual_seed(0)
    return TransformerModel(3, 5, d_model=8, nhead=2, num_layers=1, dim_feedforward=16, positional="learned")


class Fixed:
    """A Batcher's gather over 16 fixed windows (date 0, asset k: window k), whose labels the test
    may turn to NaN."""

    def __init__(self):
        import torch

        self.x, self.y = torch.randn(16, 5, 3), torch.randn(16)
        self.target = self.y
        self.index = torch.stack([torch.zeros(16, dtype=torch.long), torch.arange(16)], 1)
        self.n_samples = 16

    def reads_same(self, other) -> bool:
        return other is self

    def gather(self, rows):
        from sweeper.data import Batch

        k = rows[:, 1]
        return Batch(self.x[k], self.target[k], self.target[k], rows[:, 0], k)


def _stack_of_one(model):
    """The trial's step and optimizer around ``model`` (sweeper.core.loop.prepare, on the CPU; AdamW
    lr ``LR``, weight decay ``WD``, clipping at ``CLIP``), its schedule ``warmup``. Returns the StackStep."""
    import torch

    from sweeper.core import Member
    from sweeper.core.loop import stack_step
    from toy_panel import toy_config, toy_panel

    cfg = toy_config(lr=LR, weight_decay=WD, grad_clip=CLIP, precision="fp32", loss="mse")
    step = stack_step([Member(cfg, toy_panel(F=3, lookback=5))], torch.device("cpu"), [model])
    step.lanes[0].factor = warmup
    return step


def _ours():
    """The small transformer trained ``STEPS`` stacked steps as a trial trains it (a stack of one:
    the trial's StackStep and StackedAdamW), under the ``warmup`` schedule; a NaN loss at step
    ``SKIP_AT`` takes the fused kernel's device-side skip. Returns (model, its StackStep)."""
    import torch

    from sweeper.core.schedule import Rows

    model = _transformer()
    step = _stack_of_one(model)  # (building its lane seeds the global generator: reseeded below)
    torch.manual_seed(1)
    batcher = step.lanes[0].batcher = Fixed()
    torch.manual_seed(2)  # dropout's draws, as _theirs
    for k in range(STEPS):
        batcher.target = batcher.y * float("nan") if k == SKIP_AT else batcher.y
        step([Rows(batcher.index)], 16)
    return model, step


def _torchs(model):
    """torch.optim.AdamW itself, with make_optimizer's groups and kernel choice."""
    import torch

    ours = make_optimizer(model, LR, WD)
    groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in ours.param_groups]
    return torch.optim.AdamW(groups, lr=LR, fused=ours.defaults["fused"])


def _theirs():
    """The same training by torch alone: clip_grad_norm_, torch.optim.AdamW, LambdaLR, and the step
    skipped where the loss or the norm is not finite. Returns (model, optimizer, scheduler)."""
    import torch

    model = _transformer()
    optimizer = _torchs(model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup)
    torch.manual_seed(1)
    batcher = Fixed()
    torch.manual_seed(2)
    for k in range(STEPS):
        target = batcher.y * float("nan") if k == SKIP_AT else batcher.y
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(batcher.x).float(), target)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        if torch.isfinite(loss + norm):
            optimizer.step()
        scheduler.step()
    return model, optimizer, scheduler


def test_the_trial_optimizer_is_torchs_adamw_to_the_bit():
    import torch

    ours, step = _ours()
    theirs, theirs_opt, _ = _theirs()
    ours_opt = step.optimizer.torch_adamw  # a stack of one steps torch's AdamW on the model's own tensors
    assert isinstance(ours_opt, torch.optim.AdamW) and ours_opt.defaults["fused"] is True
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    mine, torchs = ours_opt.state_dict(), theirs_opt.state_dict()
    # the stack sets each step's lr by LambdaLR's rule itself; torch's LambdaLR also keeps its base
    for group in torchs["param_groups"]:
        assert group.pop("initial_lr") == LR
    assert mine["param_groups"] == torchs["param_groups"]
    assert mine["state"].keys() == torchs["state"].keys()
    for key, state in mine["state"].items():
        assert float(state["step"]) == 5.0  # 6 steps, the NaN one skipped on the device
        for field in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(state[field], torchs["state"][key][field]), (key, field)
    # and the flat buffers the checkpoint keeps are those moments
    flat = step.optimizer.state_dict()
    assert float(flat["steps"][0]) == 5.0
    for p, span in zip(step.flat.params, step.flat.spans):
        for field in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(flat[field][:, span].view(p.shape), ours_opt.state[p][field]), field


def test_the_trial_optimizer_state_loads_both_ways_with_torchs():
    """A checkpoint written by torch's AdamW (an older sweeper) resumes in ours, and back."""
    import copy

    import torch

    model, theirs_opt, _ = _theirs()
    params = list(model.parameters())
    assert len(theirs_opt.state) == len(params)  # every parameter has moments to carry over
    legacy = make_optimizer(model, LR, WD)
    legacy.load_state_dict(theirs_opt.state_dict())
    step = _stack_of_one(copy.deepcopy(model))  # the trial's: torch's AdamW over the flat buffers
    ours_opt = step.optimizer.torch_adamw
    ours_opt.load_state_dict(theirs_opt.state_dict())
    flat = step.optimizer.adopt_torch_state()  # as a lone run's checkpoint converts on load
    back = _torchs(model)
    back.load_state_dict(ours_opt.state_dict())
    for p, mine, span in zip(params, step.flat.params, step.flat.spans, strict=True):
        for loaded, q in ((legacy, p), (ours_opt, mine), (back, p)):
            for field in ("step", "exp_avg", "exp_avg_sq"):
                assert torch.equal(theirs_opt.state[p][field], loaded.state[q][field]), field
        for field in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(flat[field][:, span].view(p.shape), theirs_opt.state[p][field]), field
    for loaded in (legacy, ours_opt, back):
        assert [g["lr"] for g in loaded.param_groups] == [g["lr"] for g in theirs_opt.param_groups]


@pytest.mark.slow
def test_training_imports_no_torch_dynamo(tmp_path):
    """The worker fork server's preload, then ``sweeper train`` (a whole trial: optimizer,
    schedule, checkpoint state), never import torch._dynamo, which would cost every fork server
    seconds of preload."""
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(merge(TINY, {"train": {"epochs": 1}})))
    probe = ("import importlib, sys\nfrom sweeper.worker.forked import PRELOAD\n"
             "for name in PRELOAD:\n    importlib.import_module(name)\n"
             "print('preload dynamo', 'torch._dynamo' in sys.modules, file=sys.stderr)\n"
             "sys.argv = ['sweeper', 'train', 'study.yaml', '--json']\n"
             "try:\n    from sweeper.cli import main\n    main()\n"
             "finally:\n    print('dynamo', 'torch._dynamo' in sys.modules, file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert "preload dynamo False" in lines and lines[-1] == "dynamo False", done.stderr
    assert json.loads(done.stdout)["epochs_run"] == 1
