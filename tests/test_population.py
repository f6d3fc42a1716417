"""Issue 40: several trials of one shape train as one stack (a population), each still a whole trial.

In process: the runner's population against each trial's solo run, a member that fails or is pruned
alone, each trial's own checkpoint resumed alone, the claim of a population. With real processes
(slow): a population sweep stores what solo sweeps store; kill -9 and Ctrl-C mid-stack; a member
forced to NaN fails its own trial only.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pandas as pd
import pytest
import torch
import yaml
from optuna.trial import TrialState

from conftest import sweeper_cli
from sweeper import config as C
from sweeper.config import load_config
from sweeper.core import FileCheckpointer, Member, NullHook, checkpoint_epoch, train_stack
from sweeper.data.load import load_panel
from sweeper.errors import Interrupted
from sweeper.store import claim_lock, open_storage
from sweeper.store.identity import Identity
from sweeper.study.stacking import member_keys, population_line
from sweeper.validation.population import PopulationCheckpointer, PopulationHook
from sweeper.validation.runner import Trainer, train_population, train_runs

# three trials of one shape (an MLP of one size) that differ in every per-member setting
MEMBERS = [{"train.lr": 1e-3, "train.weight_decay": 0.0, "model.dropout": 0.0, "train.seed": 0},
           {"train.lr": 3e-3, "train.weight_decay": 0.1, "model.dropout": 0.2, "train.seed": 7,
            "train.epochs": 2},
           {"train.lr": 5e-3, "train.weight_decay": 0.01, "model.dropout": 0.1, "train.seed": 3}]
SCORES = ("val_ic", "val_rank_ic", "val_loss", "test_ic", "test_rank_ic")


def _cfgs(study_file, over=None, members=MEMBERS):
    base = load_config(study_file({"train": {"epochs": 3}, **(over or {})}))
    return [C.with_overrides(base, m, "test") for m in members]


def _close(a: dict, b: dict, keys=SCORES, rel=1e-6, abs_=1e-7) -> None:
    for key in keys:  # a stack of several computes through batched kernels: rounding, not more
        assert a[key] == pytest.approx(b[key], rel=rel, abs=abs_), key


def test_a_population_gives_each_trial_its_solo_run(study_file):
    """Different lr, weight decay, dropout, seed and epochs in one stack: each trial's run ends
    where its solo run ends (epochs, best epoch, stop reason) with its scores."""
    cfgs = _cfgs(study_file)
    panel = load_panel(cfgs[0].data)
    together = train_population(panel, [Trainer(c, NullHook(), time.monotonic()) for c in cfgs])
    for cfg, out in zip(cfgs, together):
        solo = train_runs(panel, Trainer(cfg, NullHook(), time.monotonic()))
        (run,), (alone,) = out.runs, solo.runs
        assert (run.metrics["epochs_run"], run.metrics["best_epoch"], run.stop_reason) == \
               (alone.metrics["epochs_run"], alone.metrics["best_epoch"], alone.stop_reason)
        _close(run.metrics, alone.metrics)
    assert [out.runs[0].metrics["epochs_run"] for out in together] == [3, 2, 3]


def test_each_trial_of_a_population_logs_its_own_epochs_and_end(study_file):
    """A member's epoch and done lines go to its own trial's log (they all went to the first trial's, and
    the others' logs had none of their training)."""
    cfgs, logs = _cfgs(study_file), [[], [], []]
    outs = train_population(load_panel(cfgs[0].data), [Trainer(c, NullHook(), time.monotonic(), log=log.append)
                                                       for c, log in zip(cfgs, logs)])
    for log, out, cfg in zip(logs, outs, cfgs):
        epochs = [line for line in log if line.startswith("epoch ")]
        assert [line.split()[1] for line in epochs] == [f"{e}/{cfg.train.epochs}" for e in range(1, 4)][
            :out.runs[0].metrics["epochs_run"]]
        assert [line.split(":")[0] for line in log if line.startswith("done")] == ["done (epochs)"]


class _Steps(NullHook):
    """Keeps the steps a trial reports, as its OptunaHook would report them (offset + epoch)."""

    def __init__(self) -> None:
        self.offset, self.steps = 0, []

    def begin(self, runs, offset):
        self.offset = offset

    def on_epoch(self, epoch, rows):
        if any(row is not None for row in rows):
            self.steps.append(self.offset + epoch)
        return False


def test_folds_and_seeds_compose_each_trial_stacking_as_it_would_alone(study_file):
    """2 trials x 2 walk-forward folds x 2 seeds, each trial's runs in stacks of 2: the population
    trains the trials' first stacks side by side (4 members), then their second; each trial reports
    at the steps it reports alone and ends with its solo run's scores and seed ensemble."""
    over = {"validation": {"scheme": "walk_forward", "folds": 2, "repeats": 2},
            "train": {"epochs": 2, "max_stack": 2}}
    cfgs = _cfgs(study_file, over, [MEMBERS[0], MEMBERS[2]])
    panel = load_panel(cfgs[0].data)
    hooks, said = [_Steps(), _Steps()], []
    together = train_population(panel, [Trainer(c, h, time.monotonic(), log=said.append)
                                        for c, h in zip(cfgs, hooks)])
    assert sum(line.startswith("training a stack of 4 mlp") for line in said) == 2  # two stacks of 2 x 2
    for cfg, hook, out in zip(cfgs, hooks, together):
        alone_hook = _Steps()
        solo = train_runs(panel, Trainer(cfg, alone_hook, time.monotonic()))
        assert hook.steps == alone_hook.steps == [1, 2, 3, 4]
        assert [(r.fold, r.repeat) for r in out.runs] == [(r.fold, r.repeat) for r in solo.runs]
        for a, b in zip(out.runs, solo.runs):
            _close(a.metrics, b.metrics, ("val_ic", "val_loss"))
        assert out.ensemble is not None and solo.ensemble is not None
        mine, alone = out.ensemble["valid"], solo.ensemble["valid"]
        pd.testing.assert_frame_equal(mine[["date", "asset"]], alone[["date", "asset"]])
        assert mine["pred"].to_numpy() == pytest.approx(alone["pred"].to_numpy(), rel=1e-4, abs=1e-6)


def test_a_member_stopped_early_leaves_the_others_validating(study_file):
    """A stack member that early-stops while the others go on (it used to crash the next epoch's
    validation: the stack was fed the live members' rows only)."""
    cfg = C.with_overrides(load_config(study_file()), {"validation.repeats": 3, "train.patience": 1,
                                                       "train.epochs": 6, "train.max_stack": 3,
                                                       "train.lr": 0.02}, "test")
    panel = load_panel(cfg.data)
    stacked = train_runs(panel, Trainer(cfg, NullHook(), time.monotonic()))
    one = C.with_overrides(cfg, {"train.max_stack": 1}, "test")
    alone = train_runs(panel, Trainer(one, NullHook(), time.monotonic()))
    epochs = [r.metrics["epochs_run"] for r in stacked.runs]
    assert epochs == [r.metrics["epochs_run"] for r in alone.runs] and len(set(epochs)) > 1
    for a, b in zip(stacked.runs, alone.runs):
        _close(a.metrics, b.metrics, ("val_ic", "val_loss"))


class _Prunes(NullHook):
    """A trial's hook whose pruner says stop at ``at`` (never: None)."""

    def __init__(self, at: int | None) -> None:
        self.at, self.epochs, self.pruned = at, [], False

    def on_epoch(self, epoch, rows):
        self.epochs.append(epoch)
        self.pruned = epoch == self.at
        return self.pruned


def test_a_pruned_trial_stops_alone_while_the_others_train_on(study_file):
    """Pruned at epoch 1, trial 1 is masked and handed back at once (scored with its best weights,
    as alone), while trials 0 and 2 have trained one epoch; they train on to their last."""
    cfgs = _cfgs(study_file, members=MEMBERS[:1] * 3)
    hooks = [_Prunes(None), _Prunes(1), _Prunes(None)]
    ended = []
    trainers = [Trainer(c, h, time.monotonic(), finished=lambda out: ended.append(list(hooks[0].epochs)))
                for c, h in zip(cfgs, hooks)]
    outs = train_population(load_panel(cfgs[0].data), trainers)
    assert [h.epochs for h in hooks] == [[1, 2, 3], [1], [1, 2, 3]]
    assert ended == [[1]]  # trial 1 ended when the others had one epoch behind them
    assert [(o.runs[0].stop_reason, o.runs[0].metrics["epochs_run"]) for o in outs] == \
           [("epochs", 3), ("pruned", 1), ("epochs", 3)]
    solo = train_runs(load_panel(cfgs[1].data), Trainer(cfgs[1], _Prunes(1), time.monotonic()))
    _close(outs[1].runs[0].metrics, solo.runs[0].metrics)


def test_a_member_that_goes_non_finite_fails_its_trial_alone(study_file):
    cfgs = _cfgs(study_file, {"train": {"epochs": 3, "nonfinite_patience": 2}},
                 [MEMBERS[0], {**MEMBERS[2], "train.lr": 1e30}, MEMBERS[2]])
    panel = load_panel(cfgs[0].data)
    outs = train_population(panel, [Trainer(c, NullHook(), time.monotonic()) for c in cfgs])
    assert outs[1].failure is not None and "non-finite" in outs[1].failure and outs[1].runs == []
    assert [o.failure for o in (outs[0], outs[2])] == [None, None]
    solo = train_runs(panel, Trainer(cfgs[2], NullHook(), time.monotonic()))
    _close(outs[2].runs[0].metrics, solo.runs[0].metrics)


def test_a_member_that_goes_non_finite_ends_its_trial_at_once(study_file):
    """Told the moment its members fail (both its seeds, in one sync: once), not when the stack ends: a
    Ctrl-C, crash or timeout that stops the others later is not its outcome (it would be retried from
    before its NaN)."""
    cfgs = _cfgs(study_file, {"train": {"epochs": 3, "nonfinite_patience": 2, "max_stack": 2},
                              "validation": {"repeats": 2}}, [MEMBERS[0], {**MEMBERS[2], "train.lr": 1e30}])
    hooks, ended = [_Prunes(None), _Prunes(None)], []
    trainers = [Trainer(c, h, time.monotonic(),
                        finished=lambda out: ended.append((out.failure, list(hooks[0].epochs))))
                for c, h in zip(cfgs, hooks)]
    outs = train_population(load_panel(cfgs[0].data), trainers)
    assert len(ended) == 1 and "non-finite" in ended[0][0] and ended[0][1] == []  # during epoch 1
    assert outs[1].failure == ended[0][0] and hooks[0].epochs == [1, 2, 3]


def test_a_trial_pruned_at_the_epoch_its_patience_ends_is_pruned_and_trains_no_later_fold(study_file):
    """Its member stopped by its patience at epoch E, the pruner prunes its trial at E: it ends then,
    pruned, as alone, and does not go on to its second walk-forward fold (it used to, and the pruner's
    next answer decided its state)."""
    over = {"validation": {"scheme": "walk_forward", "folds": 2}, "train": {"epochs": 6, "max_stack": 1}}
    cfgs = _cfgs(study_file, over, [MEMBERS[0] | {"train.patience": 10},
                                    MEMBERS[2] | {"train.patience": 1, "train.lr": 0.02}])
    panel = load_panel(cfgs[0].data)
    (alone, *_) = train_runs(panel, Trainer(cfgs[1], NullHook(), time.monotonic())).runs
    stops = alone.metrics["epochs_run"]
    assert alone.stop_reason == "early_stop" and stops < 6
    hooks, ended = [_Prunes(None), _Prunes(stops)], []
    trainers = [Trainer(c, h, time.monotonic(), finished=lambda out: ended.append(list(hooks[0].epochs)))
                for c, h in zip(cfgs, hooks)]
    outs = train_population(panel, trainers)
    assert ended == [list(range(1, stops + 1))] and hooks[1].epochs == list(range(1, stops + 1))
    assert [(r.fold, r.stop_reason, r.metrics["epochs_run"]) for r in outs[1].runs] == [(0, "pruned", stops)]
    assert outs[1].cut_short == "pruned" and len(outs[0].runs) == 2


def test_a_lone_members_checkpoint_keeps_a_gpu_dropout_state_as_the_cuda_generators():
    """A population's member alone draws its dropout from the global generator: on a GPU the CUDA
    one, whose Philox state (16 bytes) the CPU generator refuses (a retry crashed on it)."""
    from sweeper.core.checkpoint import member_states

    philox = [torch.arange(16, dtype=torch.uint8) + k for k in range(2)]
    cpu_rng = torch.get_rng_state()
    state = {"values": torch.zeros(2, 3), "optimizer": {"exp_avg": torch.zeros(2, 3)},
             "scaler": {"scale": torch.ones(2)}, "rng": {"torch": cpu_rng, "cuda": []},
             "members": [{"dropout": philox[0]}, {"dropout": philox[1]}], "eval_batch_size": 8}
    cfg = load_config(Path(__file__).parent.parent / "studies" / "mlp_ic.yaml")
    mine = member_states(state, [1], cfg)
    assert torch.equal(mine["rng"]["torch"], cpu_rng) and len(mine["rng"]["cuda"]) == 1
    assert torch.equal(mine["rng"]["cuda"][0], philox[1]) and mine["members"] == [{"dropout": None}]
    assert torch.equal(mine["values"], torch.zeros(1, 3)) and mine["eval_batch_size"] == 16


class _StopAfter(NullHook):
    def __init__(self, epochs: int) -> None:
        self.epochs, self.seen = epochs, 0

    def on_epoch(self, epoch, rows):
        self.seen = epoch
        return False

    def should_stop(self):
        return self.seen >= self.epochs


def test_each_trial_keeps_its_own_checkpoint_and_its_retry_continues_it_alone(study_file, tmp_path):
    """Interrupted after epoch 1, each member's checkpoint is the state a stack of it alone saves:
    continued alone it ends where the population would have ended it."""
    cfgs = _cfgs(study_file, members=[MEMBERS[1] | {"train.epochs": 3}, MEMBERS[2]])
    panel = load_panel(cfgs[0].data)
    members = [Member(c, panel) for c in cfgs]
    whole = train_stack(members)
    files = [FileCheckpointer(tmp_path / f"{k}.pt") for k in range(2)]
    checkpoint = PopulationCheckpointer([([k], files[k], cfgs[k]) for k in range(2)])
    hook = PopulationHook([_StopAfter(1)], [[0, 1]])
    with pytest.raises(Interrupted):
        train_stack(members, hook=hook, checkpoint=checkpoint)
    assert [checkpoint_epoch(f.path) for f in files] == [1, 1]
    for k, cfg in enumerate(cfgs):
        assert len(FileCheckpointer(files[k].path).load()["members"]) == 1
        (resumed,) = train_stack([Member(cfg, panel)], checkpoint=files[k])
        assert resumed.metrics["epochs_run"] == whole[k].metrics["epochs_run"] == 3
        _close(resumed.metrics, whole[k].metrics)


def test_a_claim_asks_for_a_population_of_one_shape(study_file, workdir):
    from sweeper.dispatch.claim import claim

    path = study_file({"study": {"n_trials": 6, "sampler": {"name": "random", "seed": 3}},
                       "search_space": {"train.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
                                        "model.hidden_size": {"type": "categorical", "choices": [8, 16, 32]},
                                        "model.dropout": {"type": "float", "low": 0.0, "high": 0.3}}})
    cfg = load_config(path)
    assert member_keys(cfg) == (["model.dropout", "train.lr"], ["model.hidden_size"])  # the file's order
    storage = open_storage(cfg.study.resolved_storage, heartbeat_interval=1, grace_period=60)
    study = optuna.create_study(study_name="tiny", storage=storage, direction="maximize")
    lock, me = claim_lock(storage, cfg.study.resolved_storage, "tiny"), Identity.current()
    four = claim(study, cfg, lock, me, Path("runs/tiny"), size=4)
    assert len(four) == 4 and len({t.params["model.hidden_size"] for t in four}) == 1
    assert len({t.params["train.lr"] for t in four}) == len({t.params["model.dropout"] for t in four}) == 4
    assert claim(study, cfg, lock, me, Path("runs/tiny"), size=4)[0].number == 4  # the budget: 2 left
    assert len(study.trials) == 6 and all(t.state == TrialState.RUNNING for t in study.trials)
    more = C.with_overrides(cfg, {"study.n_trials": 9}, "test")
    study.enqueue_trial({"train.lr": 1e-3, "model.hidden_size": 8, "model.dropout": 0.0})
    assert len(claim(study, more, lock, me, Path("runs/tiny"), size=4)) == 1  # a queued trial runs alone
    assert len(claim(study, more, lock, me, Path("runs/tiny"), size=4)) == 2


def test_validate_names_the_per_member_and_the_shape_params(study_file):
    space = {"train.lr": {"type": "float", "low": 1e-4, "high": 1e-2},
             "model.hidden_size": {"type": "int", "low": 8, "high": 32}}
    cfg = load_config(study_file({"study": {"population": "auto"}, "search_space": space}))
    assert population_line(cfg) == ("up to 8 trials per stack, as measured on the first trial; per member: "
                                    "train.lr; shape (one value per population): model.hidden_size")
    pinned = C.with_overrides(cfg, {"train.max_stack": 4}, "test")  # not measured: as many as fill it
    assert population_line(pinned).startswith("up to 8 trials per stack, as many as fill train.max_stack; per member")
    probe = {"name": "fault_models:Probe", "kind": "mlp", "hidden": 8}
    user = C.with_overrides(cfg, {"model": probe}, "test")
    dropout = cfg.search_space["train.lr"]  # (any float spec)
    user = user.model_copy(update={"search_space": {**cfg.search_space, "model.dropout": dropout}})
    # a user model's dropout is its template's, shared: shape
    assert member_keys(user) == (["train.lr"], ["model.hidden_size", "model.dropout"])


# ------------------------------------------------------------------ with real processes
# (no trial 0 of the file's own values: a queued trial runs alone)
POPULATION = {"study": {"name": "tiny", "n_trials": 4, "population": 4,
                        "sampler": {"name": "random", "seed": 5}, "start_from_config": False},
              "model": {"name": "mlp", "hidden_size": 8, "num_layers": 1, "dropout": 0.1},
              "train": {"epochs": 1, "batch_size": 256, "samples_per_epoch": 512},
              "devices": {"cpu_workers": 1},
              "search_space": {"train.lr": {"type": "float", "low": 1e-3, "high": 1e-2, "log": True},
                               "train.weight_decay": {"type": "float", "low": 0.0, "high": 0.1},
                               "model.dropout": {"type": "float", "low": 0.0, "high": 0.3}}}


def _study(path):
    cfg = load_config(path)
    return optuna.load_study(study_name=cfg.study.name, storage=cfg.study.resolved_storage)


@pytest.mark.slow
def test_a_population_sweep_stores_what_solo_trials_store(study_file, workdir):
    """A short sweep of one population of 4, then the same 4 param sets one trial at a time in another
    study: the same values, intermediate values and numeric attributes, to 1e-6."""
    path = study_file(POPULATION)
    sweeper_cli(workdir, "run", str(path))
    together = _study(path).get_trials()
    assert [t.user_attrs["population"] for t in together] == [[0, 1, 2, 3]] * 4
    queue = workdir / "queue.yaml"
    queue.write_text(yaml.safe_dump([t.params for t in together]))
    solo_path = study_file({**POPULATION, "study": {**POPULATION["study"], "name": "solo", "population": 1}},
                           name="solo.yaml")
    sweeper_cli(workdir, "run", str(solo_path), "--enqueue", str(queue))
    alone = _study(solo_path).get_trials()
    assert [t.params for t in alone] == [t.params for t in together]
    numeric = ("val_ic", "test_ic", "val_rank_ic", "test_rank_ic", "val_icir", "best_epoch", "epochs_run")
    for a, b in zip(together, alone):
        assert a.state == b.state == TrialState.COMPLETE and "population" not in b.user_attrs
        assert a.value == pytest.approx(b.value, rel=1e-6, abs=1e-9)
        assert list(a.intermediate_values) == list(b.intermediate_values)
        for step, value in a.intermediate_values.items():
            assert value == pytest.approx(b.intermediate_values[step], rel=1e-6, abs=1e-9)
        for key in numeric:
            assert a.user_attrs[key] == pytest.approx(b.user_attrs[key], rel=1e-6, abs=1e-9), key


@pytest.mark.slow
def test_auto_asks_for_as_many_trials_as_the_first_trials_measurement_pays_for(study_file, workdir):
    """``population: auto``: the first trial (alone) measures the stack size over up to 8 trials' runs
    and the study keeps it (``population_size``); the next claim asks for that many (the budget
    allowing), each trial naming its population (the measured size is this machine's)."""
    path = study_file({**POPULATION, "study": {**POPULATION["study"], "population": "auto", "n_trials": 6}})
    sweeper_cli(workdir, "run", str(path))
    study = _study(path)
    chosen = study.user_attrs["stack_size"]
    size = chosen.get("population_size", 1)
    assert chosen["stack_size"] == 1 and chosen["stack_size_from"] == "measured"
    assert sorted(chosen["stack_rates"]) == ["1", "2", "4", "8"][:len(chosen["stack_rates"])]
    trials = study.get_trials()
    assert "population" not in trials[0].user_attrs  # the measuring trial ran alone
    if size > 1:  # the next trials: as many as measured, within the 5 left
        first = list(range(1, 1 + min(size, 5)))
        assert [t.user_attrs.get("population") for t in trials[1:1 + len(first)]] == [first] * len(first)
    assert all(t.user_attrs.get("population_size", 1) == size for t in trials)


@pytest.mark.slow
def test_a_pruned_trial_ends_at_once_while_its_population_trains_on(study_file, workdir):
    """After the pruner's 2 start-up trials (each alone: one lr that learns, one that does not), the
    population of trials 2-5 mixes them too (the random sampler's seed 13: 0.01 once, 1e-5 three times);
    the pruner prunes the latter at epoch 1, and they end then, each a PRUNED trial, while the one that
    learns trains its 4 epochs."""
    path = study_file({**POPULATION, "study": {**POPULATION["study"], "n_trials": 6,
                                               "sampler": {"name": "random", "seed": 13},
                                               "pruner": {"name": "percentile", "options": {
                                                   "percentile": 60, "n_startup_trials": 2,
                                                   "n_warmup_steps": 0}}},
                       "train": {**POPULATION["train"], "epochs": 4, "samples_per_epoch": 1024},
                       "search_space": {"train.lr": {"type": "categorical", "choices": [0.01, 0.00001]}}},
                      replace=("search_space",))
    sweeper_cli(workdir, "run", str(path))
    every = _study(path).get_trials()
    assert all("population" not in t.user_attrs for t in every[:2])  # the start-up trials: one at a time
    trials = every[2:]
    assert all(t.user_attrs["population"] == [2, 3, 4, 5] for t in trials)
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    (learns,) = [t for t in trials if t.state == TrialState.COMPLETE]
    assert pruned and all(t.params["train.lr"] == 0.00001 for t in pruned)
    assert learns.user_attrs["epochs_run"] == 4 and all(t.user_attrs["epochs_run"] == 1 for t in pruned)
    assert all(t.datetime_complete < learns.datetime_complete for t in pruned)
    assert all(not Path(f"runs/tiny/trials/{t.number}/checkpoint.pt").exists() for t in trials)


@pytest.mark.slow
def test_a_member_forced_to_nan_fails_its_own_trial_only(study_file, workdir):
    path = study_file({**POPULATION, "study": {**POPULATION["study"], "retries": 0},
                       "train": {**POPULATION["train"], "nonfinite_patience": 1},
                       "search_space": {"train.lr": {"type": "categorical", "choices": [1e-3, 1e30]}}},
                      replace=("search_space",))
    sweeper_cli(workdir, "run", str(path), code=None)
    trials = _study(path).get_trials()[:4]  # (a failed trial takes no budget: the sweep asks on)
    assert all(t.user_attrs["population"] == [0, 1, 2, 3] for t in trials)
    failed = [t for t in trials if t.params["train.lr"] == 1e30]
    fine = [t for t in trials if t.params["train.lr"] == 1e-3]
    assert failed and fine  # the sampler's seed draws both
    assert all(t.state == TrialState.FAIL and t.user_attrs["fail_reason"] == "nan" for t in failed)
    assert all(t.state == TrialState.COMPLETE for t in fine)


SLOW = {"study": {"name": "tiny", "n_trials": 4, "population": 4, "retries": 1, "heartbeat_interval": 1,
                  "grace_period": 3, "start_from_config": False},
        "model": {"name": "fault_models:Slow", "step_sleep": 0.1},
        "train": {"epochs": 4, "batch_size": 128, "samples_per_epoch": 1024, "patience": 10},
        "devices": {"cpu_workers": 1}}


def _start_and_wait(path):
    """``sweeper run`` in a process of its own, once every trial of its population has checkpointed."""
    proc = subprocess.Popen([sys.executable, "-m", "sweeper.cli", "run", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        epochs = [checkpoint_epoch(f"runs/tiny/trials/{n}/checkpoint.pt") for n in range(4)]
        if all(e is not None and e >= 1 for e in epochs):
            return proc, epochs
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"the population did not checkpoint in time: {proc.communicate()[0]}")


def _retried_from_checkpoints(path, epochs):
    trials = _study(path).get_trials()
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    originals, retries = trials[:4], trials[4:]
    assert all(t.state == TrialState.FAIL and t.user_attrs["fail_reason"] == "interrupted" for t in originals)
    assert sorted(t.user_attrs["retry_of"] for t in retries) == [0, 1, 2, 3]  # each once, none twice
    for retry in retries:
        n = retry.user_attrs["retry_of"]
        assert retry.state == TrialState.COMPLETE and retry.params == trials[n].params
        assert retry.user_attrs["resumed_from_epoch"] == epochs[n] >= 1


@pytest.mark.slow
def test_kill_9_mid_stack_reruns_every_trial_from_its_own_checkpoint(study_file, workdir):
    path = study_file(SLOW, replace=("model",))
    proc, _ = _start_and_wait(path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    time.sleep(1.0)  # the worker follows its driver
    epochs = [checkpoint_epoch(f"runs/tiny/trials/{n}/checkpoint.pt") for n in range(4)]
    sweeper_cli(workdir, "run", str(path))
    _retried_from_checkpoints(path, epochs)


@pytest.mark.slow
def test_ctrl_c_mid_stack_exits_130_with_every_trials_checkpoint_kept(study_file, workdir):
    path = study_file(SLOW, replace=("model",))
    proc, _ = _start_and_wait(path)
    os.kill(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    epochs = [checkpoint_epoch(f"runs/tiny/trials/{n}/checkpoint.pt") for n in range(4)]
    assert all(e is not None and e >= 1 for e in epochs)
    assert all(t.user_attrs["fail_reason"] == "interrupted" for t in _study(path).get_trials())
    sweeper_cli(workdir, "run", str(path))
    _retried_from_checkpoints(path, epochs)


class _Study:
    """What Population reads of the study: its attributes and its finished trials (each read counted)."""

    def __init__(self, finished: int = 0) -> None:
        self.attrs: dict = {}
        self.finished, self.reads = finished, []

    @property
    def user_attrs(self) -> dict:
        self.reads.append("attrs")
        return self.attrs

    def get_trials(self, deepcopy: bool, states: tuple) -> list:
        assert not deepcopy and set(states) == {TrialState.COMPLETE, TrialState.PRUNED}
        self.reads.append("trials")
        return [None] * self.finished


def test_the_driver_reads_the_population_size_from_the_study_only_until_it_is_stored(study_file):
    from sweeper.study.stacking import Population

    cfg = load_config(study_file({"study": {"population": "auto"}}))  # random sampler, no pruner: no start-up
    study = _Study()
    size = Population(cfg, study)
    assert size() == 1 and size() == 1 and study.reads == ["attrs"] * 2  # not measured yet: asked each time
    study.attrs["stack_size"] = {"stack_size": 1, "stack_size_from": "measured", "population_size": 4}
    assert [size(), size(), size()] == [4, 4, 4] and len(study.reads) == 3  # stored: read once, then kept
    fixed = Population(C.with_overrides(cfg, {"study.population": 3}, "test"), study)
    assert fixed() == 3 and len(study.reads) == 3  # a number: the study is never read
    # at most 8 trials, however asked: a study stored 16 before the cap (own stacks of one run, 16 members);
    # a pinned train.max_stack of 32 a trial's one run
    study = _Study()
    study.attrs["stack_size"] = {"stack_size": 1, "stack_size_from": "measured", "population_size": 16}
    assert Population(cfg, study)() == 8
    assert Population(C.with_overrides(cfg, {"train.max_stack": 32}, "test"), study)() == 8


@pytest.mark.parametrize("study,startup", [
    ({"sampler": {"name": "tpe"}, "pruner": {"name": "median"}}, 10),  # TPE's default start-up
    ({"sampler": {"name": "tpe", "options": {"n_startup_trials": 6}},
      "pruner": {"name": "median", "options": {"n_startup_trials": 4}}}, 6),  # the transformer study's
    ({"sampler": {"name": "random"}, "pruner": {"name": "median"}}, 4),  # the median pruner's own default
    ({"sampler": {"name": "random"}, "pruner": {"name": "percentile"}}, 5),
    ({"sampler": {"name": "cmaes"}, "pruner": {"name": "none"}}, 1),
])
def test_populations_wait_for_the_samplers_and_the_pruners_start_up_trials(study_file, study, startup):
    from sweeper.study.samplers import startup_trials
    from sweeper.study.stacking import Population

    cfg = load_config(study_file({"study": {**study, "population": 4}}))
    assert startup_trials(cfg.study) == startup
    fake = _Study(finished=startup - 1)
    size = Population(cfg, fake)
    assert [size(), size()] == [1, 1] and fake.reads == ["trials"] * 2  # counted at each claim until then
    fake.finished = startup
    assert [size(), size(), size()] == [4, 4, 4] and fake.reads == ["trials"] * 3  # then never again