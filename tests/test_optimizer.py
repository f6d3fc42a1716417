"""The trial's optimizer: which parameters AdamW decays (weight matrices only, never biases,
norms or position tables), and that it is torch's AdamW to the bit without importing torch._dynamo."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from conftest import TINY, merge
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


# ------------------------------------------------------------ torch's AdamW, unguarded

def _trained(optimizer_of, steps: int = 6, skip_at: int = 3):
    """A small transformer trained ``steps`` steps by :func:`train_step` with the optimizer
    ``optimizer_of(model)`` builds, under a LambdaLR warm-up; a NaN loss at step ``skip_at``
    takes the fused kernel's device-side skip. Returns (model, optimizer, scheduler)."""
    import torch

    from sweeper.core.loss import resolve_loss
    from sweeper.core.precision import resolve_precision
    from sweeper.core.schedule import Rows
    from sweeper.core.step import train_step
    from sweeper.data import Batch

    torch.manual_seed(0)
    model = TransformerModel(3, 5, d_model=8, nhead=2, num_layers=1, dim_feedforward=16, positional="learned")
    optimizer = optimizer_of(model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 4))
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    params = [p for p in model.parameters() if p.requires_grad]
    x, y = torch.randn(16, 5, 3), torch.randn(16)
    for step in range(steps):
        target = y * float("nan") if step == skip_at else y

        def gather(rows, target=target):
            return Batch(x[rows[:, 1]], target[rows[:, 1]], target[rows[:, 1]], rows[:, 0], rows[:, 1])

        rows = Rows(torch.stack([torch.zeros(16, dtype=torch.long), torch.arange(16)], 1))
        train_step(model, params, optimizer, scaler, resolve_precision("fp32", torch.device("cpu")), gather,
                   rows, 16, resolve_loss("mse"), grad_clip=0.5)
        scheduler.step()
    return model, optimizer, scheduler


def _torchs(model):
    """torch.optim.AdamW itself, with make_optimizer's groups and kernel choice."""
    import torch

    ours = make_optimizer(model, 1e-2, 0.1)
    groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in ours.param_groups]
    return torch.optim.AdamW(groups, lr=1e-2, fused=ours.defaults["fused"])


def test_the_trial_optimizer_is_torchs_adamw_to_the_bit():
    import torch

    ours, ours_opt, _ = _trained(lambda m: make_optimizer(m, 1e-2, 0.1))
    theirs, theirs_opt, _ = _trained(_torchs)
    assert isinstance(ours_opt, torch.optim.AdamW) and ours_opt.defaults["fused"] is True
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert torch.equal(a, b), name
    mine, torchs = ours_opt.state_dict(), theirs_opt.state_dict()
    assert mine["param_groups"] == torchs["param_groups"]
    assert mine["state"].keys() == torchs["state"].keys()
    for key, state in mine["state"].items():
        assert float(state["step"]) == 5.0  # 6 steps, the NaN one skipped on the device
        for field in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(state[field], torchs["state"][key][field]), (key, field)


def test_the_trial_optimizer_state_loads_both_ways_with_torchs():
    """A checkpoint written by torch's AdamW (an older sweeper) resumes in ours, and back."""
    import torch

    model, theirs_opt, _ = _trained(_torchs)
    ours_opt = make_optimizer(model, 1e-2, 0.1)
    ours_opt.load_state_dict(theirs_opt.state_dict())
    back = _torchs(model)
    back.load_state_dict(ours_opt.state_dict())
    params = list(model.parameters())
    assert len(theirs_opt.state) == len(params)  # every parameter has moments to carry over
    for p in params:
        for loaded in (ours_opt, back):
            for field in ("step", "exp_avg", "exp_avg_sq"):
                assert torch.equal(theirs_opt.state[p][field], loaded.state[p][field]), field
    for loaded in (ours_opt, back):
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
