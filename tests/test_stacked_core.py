"""Stacked training (issue 29): a stack of K members is K separate runs, to 1e-5.

Equivalence is tested where it is exact: the same seeds, data and batch order as the lone runs
(dropout 0, so no mask is drawn), one optimizer step and whole short runs."""
from __future__ import annotations

import math

import pytest
import torch
from tests.toy_panel import toy_config, toy_panel

from reference_models import MLPModel, make_optimizer
from sweeper.core import Member, train, train_stack
from sweeper.core.optim import FlatStack, MemberScaler, StackedAdamW
from sweeper.models.stacked.mlp import StackedMLP
from sweeper.validation.grid import seeded


def _solos(k: int, **kw) -> list[MLPModel]:
    out = []
    for seed in range(k):
        torch.manual_seed(seed)
        out.append(MLPModel(3, 4, hidden_size=16, num_layers=2, dropout=0.0, **kw))
    return out


def _stack(solos: list[MLPModel]) -> StackedMLP:
    stack = StackedMLP(len(solos), 3, 4, hidden_size=16, num_layers=2, dropout=[0.0])
    for k, solo in enumerate(solos):
        stack.load_member(k, solo.state_dict())
    return stack


def _close(stack, solos, rtol=1e-5):
    for k, solo in enumerate(solos):
        mine = stack.member_state(k)
        for name, value in solo.state_dict().items():
            torch.testing.assert_close(mine[name], value, rtol=rtol, atol=1e-7, msg=f"member {k} {name}")


def _one_step(solos, stack, x, y, *, lr, wd, clip):
    flat = FlatStack(stack)
    opt = StackedAdamW(flat, lr, wd, clip)
    flat.zero_grad()
    ((stack(x) - y) ** 2).mean(1).sum().backward()
    opt.step(torch.ones(len(solos)))
    for k, solo in enumerate(solos):
        o = make_optimizer(solo, lr[k], wd[k])
        ((solo(x[k]) - y[k]) ** 2).mean().backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(list(solo.parameters()), clip)
        o.step()
    return opt


def test_one_step_equals_separate_runs_with_member_hyperparameters():
    solos = _solos(4)
    stack = _stack(solos)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 32, 4, 3, generator=g), torch.randn(4, 32, generator=g)
    lr, wd = [1e-3, 3e-3, 1e-2, 3e-4], [0.0, 0.01, 0.1, 0.5]
    _one_step(solos, stack, x, y, lr=lr, wd=wd, clip=0.5)
    _close(stack, solos)


def test_clipping_is_per_member_an_exploding_member_moves_no_other():
    solos = _solos(3)
    reference = _solos(3)  # what members 0 and 2 become when member 1's gradient is ordinary
    stack, ref_stack = _stack(solos), _stack(reference)
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(3, 32, 4, 3, generator=g), torch.randn(3, 32, generator=g)
    wild = y.clone()
    wild[1] *= 1e6  # member 1's gradient explodes
    _one_step(solos, stack, x, wild, lr=[1e-2] * 3, wd=[0.01] * 3, clip=1.0)
    _one_step(reference, ref_stack, x, y, lr=[1e-2] * 3, wd=[0.01] * 3, clip=1.0)
    for k in (0, 2):
        for name, value in ref_stack.member_state(k).items():
            torch.testing.assert_close(stack.member_state(k)[name], value, rtol=1e-6, atol=0)
    _close(stack, solos)  # and the exploded member itself was clipped exactly as its lone run


def test_a_masked_member_changes_nothing_and_a_nonfinite_one_skips_alone():
    solos = _solos(3)
    stack = _stack(solos)
    before = [stack.member_state(k) for k in range(3)]
    flat = FlatStack(stack)
    opt = StackedAdamW(flat, [1e-2] * 3, [0.1] * 3, 1.0)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(3, 16, 4, 3, generator=g), torch.randn(3, 16, generator=g)
    y[2, 0] = math.nan  # member 2's loss and gradient are NaN
    flat.zero_grad()
    ((stack(x) - y) ** 2).mean(1).sum().backward()
    _, skipped = opt.step(torch.tensor([1.0, 0.0, 1.0]))  # member 1 masked (stopped)
    assert skipped.tolist() == [0.0, 0.0, 1.0]
    assert opt.steps.tolist() == [1.0, 0.0, 0.0]
    after = [stack.member_state(k) for k in range(3)]
    assert any(not torch.equal(before[0][n], after[0][n]) for n in before[0])
    for k in (1, 2):
        for n in before[k]:
            assert torch.equal(before[k][n], after[k][n]), (k, n)
    assert torch.isfinite(flat.values).all() and torch.isfinite(opt.exp_avg).all()


def test_fp16_scales_are_per_member():
    scaler = MemberScaler(3, "cpu", enabled=True)
    scaler.update(torch.tensor([0.0, 1.0, 0.0]))
    assert scaler.scale_.tolist() == [2.0 ** 16, 2.0 ** 15, 2.0 ** 16]


@pytest.mark.parametrize("order,loss", [("random", "mse"), ("cross_section", "ic")])
def test_a_stack_trains_each_member_as_its_lone_run(order, loss):
    """Whole runs: three seeds of one config, stacked, against the three lone ``train`` runs:
    the same best epochs, weights and scores (fp32, dropout 0)."""
    panel = toy_panel()
    cfg = toy_config(epochs=3, batch_order=order, loss=loss, schedule="cosine", warmup_frac=0.2,
                     grad_clip=0.5, patience=2)
    cfgs = [seeded(cfg, s) for s in range(3)]
    alone = [train(c, panel, device="cpu") for c in cfgs]
    stacked = train_stack([Member(c, panel) for c in cfgs], device="cpu")
    for a, s in zip(alone, stacked):
        assert s.metrics["best_epoch"] == a.metrics["best_epoch"]
        assert s.metrics["epochs_run"] == a.metrics["epochs_run"]
        for name, value in a.best_state.items():
            if loss == "ic" and name == "net.7.bias":
                # the IC loss does not see a shift of every prediction: this bias's gradient is
                # round-off, which Adam scales up to a full step in either run alike
                continue
            torch.testing.assert_close(s.best_state[name], value, rtol=1e-4, atol=1e-6)
        for key in ("val_ic", "test_ic", "val_rank_ic"):
            assert s.metrics[key] == pytest.approx(a.metrics[key], rel=1e-4, abs=1e-6), key
        assert [h["train_loss"] for h in s.history] == pytest.approx([h["train_loss"] for h in a.history],
                                                                     rel=1e-4)


class _Recorder:
    """A hook that keeps what a stacked trial reports: one value per epoch, at offset + epoch."""

    def __init__(self):
        self.reported, self.rows, self.offset, self.runs = [], [], 0, []

    def begin(self, runs, offset):
        self.runs, self.offset = [(c["fold"] - 1, c["repeat"] - 1) for c in runs], offset

    def on_epoch(self, epoch, metrics):
        live = [m["val_ic"] for m in metrics if m is not None]
        self.rows.append([(run, m["epoch"]) for run, m in zip(self.runs, metrics) if m is not None])
        self.reported.append((self.offset + epoch, sum(live) / len(live)))
        return False

    def should_stop(self):
        return False

    def tick(self):
        return None

    def on_probe(self, peak_mb):
        return None

    def members_to_stop(self):
        return ()

    def member_failed(self, k, why):
        return None


def test_a_walk_forward_trial_stacks_its_folds_and_seeds_and_scores_as_one_by_one(study_file, tmp_path):
    """3 folds x 2 seeds (train windows of different lengths) in stacks of 4 and 2, against the
    same trial with ``train.max_stack: 1``: every run's scores alike; the pruner hears one value
    per epoch per stack, the mean over its members."""
    import time

    from sweeper.config import load_config
    from sweeper.data.load import load_panel
    from sweeper.validation.grid import RunGrid
    from sweeper.validation.runner import Trainer, train_runs

    # no samples_per_epoch: the folds' train windows differ, so their epochs have different step
    # counts and the shorter folds' members are masked for the steps they do not have
    path = study_file({"validation": {"scheme": "walk_forward", "folds": 3, "repeats": 2},
                       "train": {"max_stack": 4, "epochs": 2, "samples_per_epoch": None, "batch_size": 512}})
    cfg = load_config(path)
    assert RunGrid.of(cfg).stacks() == [[(0, 0), (0, 1), (1, 0), (1, 1)], [(2, 0), (2, 1)]]
    panel = load_panel(cfg.data)
    hook = _Recorder()
    stacked = train_runs(panel, Trainer(cfg, hook, time.monotonic()))
    lone_cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"max_stack": 1})})
    lone = train_runs(panel, Trainer(lone_cfg, NullHookish(), time.monotonic()))
    assert [(r.fold, r.repeat, r.seed) for r in stacked.runs] == [(r.fold, r.repeat, r.seed) for r in lone.runs]
    for s, a in zip(stacked.runs, lone.runs):
        for key in ("val_ic", "val_rank_ic", "best_epoch"):
            assert s.metrics[key] == pytest.approx(a.metrics[key], rel=1e-4, abs=1e-6), key
    assert stacked.model is not None and stacked.model.metrics["test_ic"] == pytest.approx(
        lone.model.metrics["test_ic"], rel=1e-4)
    assert [step for step, _ in hook.reported] == [1, 2, 3, 4]  # stack 2 reports after stack 1's epochs
    assert hook.rows[0] == [((0, 0), 1), ((0, 1), 1), ((1, 0), 1), ((1, 1), 1)]


class NullHookish(_Recorder):
    """Every run, stacked or not, begins as a stack and reports its epochs as a stack's."""


def test_the_worker_hook_reports_the_mean_over_a_stacks_members_and_writes_each_members_row(tmp_path,
                                                                                          capsys):
    import csv

    import optuna

    from sweeper.interrupt import StopToken
    from sweeper.worker.hook import OptunaHook

    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    hook = OptunaHook(trial, "val_ic", 0, tmp_path / "metrics.csv", StopToken())
    hook.begin([{"fold": 1, "repeat": 1}, {"fold": 1, "repeat": 2}, {"fold": 2, "repeat": 1}], offset=10)
    assert not hook.on_epoch(1, [{"val_ic": 0.1}, {"val_ic": 0.2}, {"val_ic": 0.6}])
    assert not hook.on_epoch(2, [{"val_ic": 0.3}, None, {"val_ic": 0.5}])  # member 2 stopped
    assert trial.storage.get_trial(trial._trial_id).intermediate_values == pytest.approx({11: 0.3, 12: 0.4})
    with (tmp_path / "metrics.csv").open() as fh:
        rows = [(r["fold"], r["repeat"], r["epoch"], r["val_ic"]) for r in csv.DictReader(fh)]
    assert rows == [("1", "1", "1", "0.1"), ("1", "2", "1", "0.2"), ("2", "1", "1", "0.6"),
                    ("1", "1", "2", "0.3"), ("2", "1", "2", "0.5")]
    events = [line for line in capsys.readouterr().out.splitlines() if '"epoch"' in line]
    assert len(events) == 5


class _StopAt(NullHookish):
    """Asks the stack to stop at the first step of epoch ``epoch``."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch, self.seen = epoch, 0

    def on_epoch(self, epoch, metrics):
        self.seen = epoch
        return False

    def should_stop(self):
        return self.seen == self.epoch - 1


def test_a_stack_stopped_mid_run_continues_from_its_checkpoint_as_if_never_stopped(tmp_path):
    from sweeper.core import FileCheckpointer
    from sweeper.errors import Interrupted

    panel = toy_panel()
    cfg = toy_config(epochs=4, schedule="cosine", patience=10, model={"name": "mlp", "hidden_size": 16,
                                                                       "dropout": 0.2})
    cfgs = [seeded(cfg, s) for s in range(3)]
    whole = train_stack([Member(c, panel) for c in cfgs], device="cpu")
    ckpt = FileCheckpointer(tmp_path / "checkpoint.pt")
    with pytest.raises(Interrupted):
        train_stack([Member(c, panel) for c in cfgs], device="cpu", checkpoint=ckpt, hook=_StopAt(3))
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["epoch"] == 2
    again = train_stack([Member(c, panel) for c in cfgs], device="cpu", checkpoint=ckpt)
    for a, b in zip(whole, again):
        assert [h["val_ic"] for h in b.history] == [h["val_ic"] for h in a.history]
        for name, value in a.best_state.items():
            assert torch.equal(b.best_state[name], value), name


class _StackMemory:
    """A device whose step needs ``per_row`` bytes for every row of every member it holds."""

    base_bytes = 0

    def __init__(self, free, per_row):
        self.free, self.per_row, self.rows, self.peak = free, per_row, 0, 0

    def free_bytes(self):
        return self.free

    def reset_peak(self):
        self.peak = 0

    def peak_bytes(self):
        return self.peak

    def saw(self, rows):
        self.peak = max(self.peak, self.per_row * rows)


def test_the_batch_probe_sizes_the_micro_batch_for_every_member_of_the_stack(monkeypatch):
    import sweeper.core.loop as S
    import sweeper.core.step as P

    mem = _StackMemory(free=1_000_000, per_row=100)  # budget 0.9e6 = 9000 rows in all
    real = P.gather_stack

    def counting(batchers, rows, width):
        mem.saw(len(batchers) * width)
        return real(batchers, rows, width)

    monkeypatch.setattr(P, "gather_stack", counting)
    monkeypatch.setattr(S, "trial_memory", lambda device: _Mem(mem))
    panel = toy_panel(T=200, N=64)
    cfg = toy_config(epochs=1, batch_size="auto", max_batch_size=4096, min_micro_batch=8)
    results = train_stack([Member(seeded(cfg, s), panel) for s in range(4)], device="cpu")
    # 4 members: at most 9000 / 4 = 2250 rows each; doubling from 512 fails at 4096 (4 x 4096 x 100 bytes)
    assert results[0].metrics["micro_batch_size"] == 2250
    alone = train_stack([Member(cfg, panel)], device="cpu")
    assert alone[0].metrics["micro_batch_size"] == 4096  # one member: the cap (4096 x 100 bytes fit)


class _Mem:
    def __init__(self, reader):
        self._reader = reader

    def reader(self):
        return self._reader

    def start_peak_mb(self, probed_mb):
        return probed_mb

    def reset_peak(self):
        return None

    def peak_mb(self):
        return math.nan


def test_the_batch_probe_leaves_a_models_batch_statistics_as_they_were(monkeypatch):
    """Its probing steps ran the model in training: a BatchNorm's running statistics kept their batches."""
    import sys
    from pathlib import Path

    import sweeper.core.loop as S

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    sys.modules.pop("custom_model", None)
    panel = toy_panel()
    cfg = seeded(toy_config(model={"name": "custom_model:TinyBatchNorm"}, epochs=2), 0)
    unprobed = train_stack([Member(cfg, panel)], device="cpu")[0]
    monkeypatch.setattr(S, "trial_memory", lambda device: _Mem(_StackMemory(free=10**9, per_row=100)))
    probed = train_stack([Member(cfg, panel)], device="cpu")[0]
    assert probed.metrics["micro_batch_size"] == unprobed.metrics["micro_batch_size"] == 64
    for name, value in unprobed.best_state.items():
        torch.testing.assert_close(probed.best_state[name], value, rtol=0, atol=0)


@pytest.mark.parametrize(("model", "plan"), [
    ({"name": "custom_model:Tiny", "scale": 2.0}, "stacked, batched by torch.func.vmap"),
    # dropout: each member draws from its own generator, where its lone run drew, so the masks and
    # the weights are its lone run's (vmap could only draw from the global one)
    ({"name": "custom_model:TinyDropout", "p": 0.3}, "stacked, one member's forward after another: its forward "
                                                     "draws random numbers (dropout), each member from its own"),
    ({"name": "custom_model:TinyLSTM"}, "stacked, one member's forward after another: torch.func.vmap cannot run "
                                        "it (RuntimeError: Batching rule not implemented for aten::lstm"),
])
def test_a_user_model_stacks_through_torch_func_and_trains_as_its_lone_runs(model, plan, monkeypatch):
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    sys.modules.pop("custom_model", None)
    panel = toy_panel()
    cfg = toy_config(model=model, epochs=2, schedule="cosine", grad_clip=0.5)
    cfgs = [seeded(cfg, s) for s in range(3)]
    alone = [train(c, panel, device="cpu") for c in cfgs]
    lines: list[str] = []
    stacked = train_stack([Member(c, panel) for c in cfgs], device="cpu", log=lines.append)
    assert any(plan in line for line in lines), lines
    for a, s in zip(alone, stacked):
        for name, value in a.best_state.items():
            torch.testing.assert_close(s.best_state[name], value, rtol=1e-4, atol=1e-6)
        assert s.metrics["val_ic"] == pytest.approx(a.metrics["val_ic"], rel=1e-4)


@pytest.mark.parametrize("model", ["custom_model:Tiny", "custom_model:TinyDropout", "custom_model:TinyBatchNorm"])
def test_a_user_model_stacked_where_members_rows_differ_trains_as_its_lone_runs(model, monkeypatch):
    """An IC loss's batches are whole dates, and the toy panel's dates hold 32 or 31 assets, so the
    members' batches differ in rows: the user's forward sees each member's own rows, not a shorter one's
    padding (dropout drew for the padding, batch statistics counted it: the lone runs' IC was not kept)."""
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    sys.modules.pop("custom_model", None)
    panel = toy_panel()
    cfg = toy_config(model={"name": model}, epochs=3, batch_order="cross_section", loss="ic", grad_clip=0.5)
    cfgs = [seeded(cfg, s) for s in range(3)]
    alone = [train(c, panel, device="cpu") for c in cfgs]
    stacked = train_stack([Member(c, panel) for c in cfgs], device="cpu")
    for a, s in zip(alone, stacked):
        for name, value in a.best_state.items():
            if not name.endswith(".bias"):  # an IC loss does not see a shift: its gradient is round-off
                torch.testing.assert_close(s.best_state[name], value, rtol=1e-4, atol=1e-6)
        assert s.metrics["val_ic"] == pytest.approx(a.metrics["val_ic"], rel=1e-4)


@pytest.mark.parametrize(("model", "mode"), [("Tiny", "vmap"), ("TinyBatchNorm", "vmap_even_rows"),
                                             ("TinyDropout", "loop")])
def test_a_stacked_user_models_members_see_their_own_rows_where_padding_would_reach_them(model, mode, monkeypatch):
    import sys
    from pathlib import Path

    from sweeper.models.stacked.base import member_rows
    from sweeper.models.stacked.func import FuncStack, stack_mode

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    sys.modules.pop("custom_model", None)
    import custom_model

    solos = []
    for seed in range(3):
        torch.manual_seed(seed)
        solos.append(getattr(custom_model, model)(3, 4))
    assert stack_mode(solos, 4, 3)[0] == mode
    stack = FuncStack(solos, mode).train()
    stack.seed_members([0, 1, 2], "cpu")
    kept = [g.get_state() for g in stack.generators]
    x = torch.randn(3, 6, 4, 3, generator=torch.Generator().manual_seed(0))
    member_rows(stack, [6, 4, 0])
    out = stack(x)
    if mode == "vmap":  # no row sees another: vmap, each member's own rows' outputs as alone
        assert torch.allclose(out[1, :4], solos[1](x[1, :4].clone()), atol=1e-6)
        return
    for k, size in enumerate([6, 4]):  # each member's forward on its own rows, from its own generator
        torch.set_rng_state(kept[k])
        assert torch.allclose(out[k, :size], solos[k](x[k, :size].clone()), atol=1e-6)
    # a member without rows in the step runs no forward: no draw, no statistics, zeros for the loss to ignore
    assert out[1, 4:].tolist() == out[2].tolist()[:2] == [0.0, 0.0] and out[2].abs().sum() == 0
    assert torch.equal(stack.generators[2].get_state(), kept[2])
    if mode == "vmap_even_rows":
        for k in range(3):
            torch.testing.assert_close(stack.member_state(k)["norm.running_mean"], solos[k].norm.running_mean)
    member_rows(stack, None)
    stack.eval()
    torch.testing.assert_close(stack(x)[1], solos[1].eval()(x[1].clone()))


def test_a_user_model_that_fails_the_row_probe_runs_its_members_in_turn(monkeypatch):
    import sys
    from pathlib import Path

    from sweeper.models.stacked.func import stack_mode

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    sys.modules.pop("custom_model", None)
    from custom_model import EvenRows

    assert stack_mode([EvenRows(3, 4), EvenRows(3, 4)], 4, 3) == (
        "loop", "torch.func.vmap cannot run it (ValueError: an even batch is needed)")


def test_one_step_of_a_vmapped_user_model_equals_its_lone_runs(monkeypatch):
    import sys
    from pathlib import Path

    from sweeper.models.stacked.func import VMAP, FuncStack

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    sys.modules.pop("custom_model", None)
    from custom_model import Tiny

    solos = []
    for seed in range(3):
        torch.manual_seed(seed)
        solos.append(Tiny(3, 4, scale=2.0))
    stack = FuncStack(solos, VMAP)
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(3, 32, 4, 3, generator=g), torch.randn(3, 32, generator=g)
    _one_step(solos, stack, x, y, lr=[1e-2, 3e-3, 1e-3], wd=[0.0, 0.1, 0.01], clip=0.5)
    _close(stack, solos)


@pytest.mark.slow  # a user model's plan is found in a checking child, as all user code runs
@pytest.mark.parametrize(("model", "how"), [
    ("custom_model:Tiny", "stacked, batched by torch.func.vmap"),
    ("custom_model:TinyLSTM", "stacked, one member's forward after another: torch.func.vmap cannot run it"),
    ("custom_model:TinyBatchNorm", "stacked, batched by torch.func.vmap, but a row's output depends on the "
                                   "batch's other rows (batch statistics), so where the members' rows differ "
                                   "each member's forward runs on its own rows in turn"),
])
def test_validate_says_how_a_user_models_runs_stack(study_file, model, how):
    from click.testing import CliRunner

    from sweeper.cli import main

    path = study_file({"model": {"name": model}, "validation": {"repeats": 3}})
    done = CliRunner().invoke(main, ["validate", str(path)], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    (line,) = [x for x in done.output.splitlines() if x.startswith("  runs:")]
    assert line.startswith("  runs: 3 per trial, in stacks of a size measured on the device at the study's first "
                           f"trial (train.max_stack: auto, at most 3): model.name '{model}': {how}")


def _built(name: str):
    """Three lone one-member models (as the lone loop trained them: tests/reference_models.py) and
    the stack of their weights."""
    from reference_models import RecurrentModel, TransformerModel
    from sweeper.config import ModelConfig
    from sweeper.models.stacked.build import build_stack

    fields = {"lstm": {"hidden_size": 8, "num_layers": 2}, "gru": {"hidden_size": 8, "num_layers": 2},
              "transformer": {"d_model": 8, "nhead": 2, "num_layers": 1, "dim_feedforward": 16}}[name]
    cfg = ModelConfig(name=name, dropout=0.0, **fields)
    solos = []
    for seed in range(3):
        torch.manual_seed(seed)
        solos.append(TransformerModel(3, 4, dropout=0.0, **fields) if name == "transformer"
                     else RecurrentModel(3, 4, cell=name, dropout=0.0, **fields))
    return solos, build_stack([cfg] * 3, 3, 4, solos)


@pytest.mark.parametrize("name", ["lstm", "gru", "transformer"])
def test_one_step_of_each_built_in_stack_equals_its_lone_runs(name):
    solos, stack = _built(name)
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(3, 16, 4, 3, generator=g), torch.randn(3, 16, generator=g)
    _one_step(solos, stack, x, y, lr=[1e-2, 3e-3, 1e-3], wd=[0.0, 0.1, 0.01], clip=0.5)
    _close_per_tensor(stack, solos)


def _close_per_tensor(stack, solos):
    for k, solo in enumerate(solos):
        mine = stack.member_state(k)
        for key, value in solo.state_dict().items():
            got = mine[key]
            if key.endswith("self_attn.in_proj_bias"):
                # the key bias shifts every score of a query alike, which softmax cancels: its
                # gradient is round-off, which Adam's first step scales up to +-lr in either run
                d = value.shape[0] // 3
                got, value = torch.cat([got[:d], got[2 * d:]]), torch.cat([value[:d], value[2 * d:]])
            # relative to the tensor (Adam's first step moves a near-zero gradient's element by lr
            # whatever its sign: an element's own relative error means nothing there)
            assert float((got - value).norm() / value.norm()) <= 1e-5, (k, key)


class _WritesItsInput(torch.nn.Module):
    """A user's model whose forward adds a learnt per-feature offset to its input in place."""

    def __init__(self, features: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.offset, self.head = torch.nn.Parameter(torch.randn(features)), torch.nn.Linear(features, 1)
        self.drop = torch.nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x += self.offset
        return self.head(self.drop(x[:, -1])).squeeze(-1)


@pytest.mark.parametrize("mode, dropout", [("vmap", 0.0), ("loop", 0.0), ("loop", 0.5)])
def test_a_user_forward_that_writes_its_input_stacks_as_it_runs_alone(mode, dropout):
    """x += self.offset ran alone and failed in every stack: vmap of one input expanded for all members
    ("more than one element of the written-to tensor refers to a single memory location"), and member
    after member autograd's "modified by an inplace operation" (the members' inputs were views of one)."""
    from sweeper.models.stacked.func import FuncStack

    solos = []
    for seed in range(2):
        torch.manual_seed(seed)
        solos.append(_WritesItsInput(3, dropout).eval())
    stack = FuncStack(solos, mode).eval()
    x = torch.randn(1, 8, 4, 3).expand(2, 8, 4, 3)  # the same rows for both, as a stacked validation has
    kept = x.clone()
    out = stack(x)
    out.sum().backward()
    assert torch.equal(x, kept)  # the caller's rows are not written
    for k, solo in enumerate(solos):
        assert torch.allclose(out[k], solo(x[k].clone()), atol=1e-6)
    stack.train()
    stack(torch.randn(2, 8, 4, 3)).sum().backward()  # training, each member its own rows
    assert all(p.grad is not None for p in stack.parameters())
