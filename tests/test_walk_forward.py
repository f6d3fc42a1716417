"""Walk-forward folds and seed repeats (sweeper.validation): the runs, the scores, the attrs."""
from __future__ import annotations

import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
import torch
from optuna.trial import TrialState

from conftest import sweeper_cli
from sweeper import config as C
from sweeper.config import load_config
from sweeper.core.hooks import NullHook
from sweeper.data.load import load_panel
from sweeper.errors import ConfigError
from sweeper.inspect.printing import validation_line
from sweeper.interrupt import StopToken
from sweeper.quant import ic as M
from sweeper.store.layout import trial_files
from sweeper.validation.grid import RunGrid
from sweeper.validation.run_files import RunStore
from sweeper.validation.runner import Trainer, train_runs
from sweeper.validation.scores import daily_valid, objective, trial_attrs
from sweeper.worker.constraints import valid_figures
from sweeper.worker.hook import OptunaHook

WF = {"validation": {"scheme": "walk_forward", "folds": 3}}


def _outcome(path, tmp_path, **over):
    cfg = C.with_overrides(load_config(path), over, "test") if over else load_config(path)
    files = trial_files(tmp_path / "run", 0)
    files.folder.mkdir(parents=True)
    store = RunStore(files, {"study_uuid": None, "trial": 0, "fingerprint": "x"}, RunGrid.of(cfg))
    return cfg, files, train_runs(load_panel(cfg.data), Trainer(cfg, _Hook(), time.monotonic(), store=store))


class _Hook(NullHook):
    def __init__(self):
        self.steps = []
        self.offset = 0

    def begin(self, runs, offset):
        self.offset = offset

    def on_epoch(self, epoch, metrics):
        self.steps.append(self.offset + epoch)
        return False

    def should_stop(self):
        return False

    def tick(self):
        return None


def test_runs_and_scores_in_process(study_file, tmp_path):
    path = study_file({"validation": {"scheme": "walk_forward", "folds": 3, "repeats": 2},
                       "study": {"metric": "val_rank_ic"}})
    cfg, files, out = _outcome(path, tmp_path)
    assert [(r.fold, r.repeat, r.seed) for r in out.runs] == [(f, r, r) for f in range(3) for r in range(2)]
    assert out.folds_run == 3 and out.cut_short is None and out.model is not None
    attrs = trial_attrs(out.runs, cfg, folds_run=out.folds_run, spans=out.spans,
                        predictions=out.predictions)
    for key in ("val_ic", "val_rank_ic"):
        per_fold = [statistics.mean(r.metrics[key] for r in out.runs if r.fold == f) for f in range(3)]
        assert attrs[f"fold_{key}"] == pytest.approx(per_fold, abs=1e-12)
        assert attrs[key] == pytest.approx(statistics.mean(per_fold), abs=1e-12)
        assert attrs[f"{key}_se"] == pytest.approx(statistics.stdev(per_fold) / math.sqrt(3), abs=1e-12)
        assert attrs[f"worst_fold_{key}"] == min(attrs[f"fold_{key}"])
    assert objective(out.runs, cfg) == attrs["val_rank_ic"]
    assert attrs["seed_val_ic_sd"] > 0 and len(attrs["fold_seed_ensemble_val_ic"]) == 3
    assert attrs["fold_dates"] == out.spans and len(out.spans) == 3
    assert attrs["folds_run"] == 3 and len(attrs["fold_best_epoch"]) == 3
    # each run's files, result.json last; a second pass finds them all finished and trains nothing
    for f in range(3):
        for r in range(2):
            result = json.loads((files.run(f + 1, r + 1) / "result.json").read_text())
            assert (result["fold"], result["repeat"], result["seed"]) == (f + 1, r + 1, r)
    assert (files.run(3, 1) / "weights.pt").exists() and not (files.run(2, 1) / "weights.pt").exists()
    again = train_runs(load_panel(cfg.data), Trainer(cfg, _Hook(), time.monotonic(),
                                                     store=RunStore(files, {}, RunGrid.of(cfg))))
    assert again.model is None
    assert [r.metrics["val_ic"] for r in again.runs] == [r.metrics["val_ic"] for r in out.runs]
    # only the model (the last fold's seed ensemble) is scored on test
    assert [r for r in out.runs if "test_ic" in r.metrics] == out.runs[4:]
    assert out.ensemble is not None and sorted(out.members) == [0, 1]
    daily = daily_valid(out.daily)
    assert list(daily.columns) == ["date", "ic", "rank_ic", "fold"]
    assert daily["date"].is_unique and daily["date"].is_monotonic_increasing
    assert sorted(daily["fold"].unique()) == [1, 2, 3]
    lcb = C.with_overrides(cfg, {"validation.aggregate": "lcb"}, "test")
    lower = attrs["val_rank_ic"] - attrs["val_rank_ic_se"]
    assert objective(out.runs, lcb) == pytest.approx(lower, abs=1e-12)
    pd.testing.assert_frame_equal(again.predictions[(2, 1)], out.predictions[(2, 1)], check_dtype=False)


def test_aggregate_ensemble_scores_each_folds_seed_ensemble(study_file, tmp_path):
    path = study_file({"validation": {"scheme": "walk_forward", "folds": 2, "repeats": 2,
                                      "aggregate": "ensemble"}, "study": {"metric": "val_rank_ic"}})
    cfg, files, out = _outcome(path, tmp_path)
    attrs = trial_attrs(out.runs, cfg, folds_run=out.folds_run, spans=out.spans, predictions=out.predictions)
    per_fold = []
    for f in range(2):
        both = pd.concat([out.predictions[(f, r)] for r in range(2)])
        mean = both.groupby(["date", "asset"], as_index=False).agg(pred=("pred", "mean"), label=("label", "first"))
        per_fold.append(M.ic_report(mean)["rank_ic"])
    assert objective(out.runs, cfg, out.predictions) == pytest.approx(statistics.mean(per_fold), abs=1e-12)
    # the ensemble is its own figure: not the mean of the seeds' rank ICs
    assert objective(out.runs, cfg, out.predictions) != pytest.approx(attrs["val_rank_ic"], abs=1e-9)
    line = validation_line(cfg.validation.model_dump(), "val_rank_ic", True)
    assert line.endswith("objective = each fold's seed ensemble, mean over folds of val_rank_ic")


@pytest.mark.parametrize(("over", "message"), [
    ({"validation": {"aggregate": "ensemble"}}, "aggregate: ensemble scores each fold's seed ensemble"),
    ({"validation": {"aggregate": "ensemble", "repeats": 2}, "study": {"metric": "val_loss"}},
     "scores the seed ensemble's val_ic, val_rank_ic, val_icir; study.metric is 'val_loss'"),
])
def test_aggregate_ensemble_needs_seeds_and_an_ic_metric(study_file, over, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(study_file(over))


def test_holdout_with_repeats_is_one_fold_of_seeds(study_file, tmp_path):
    path = study_file({"validation": {"repeats": 3}})
    cfg, files, out = _outcome(path, tmp_path)
    assert [(r.fold, r.repeat) for r in out.runs] == [(0, 0), (0, 1), (0, 2)] and out.spans == []
    attrs = trial_attrs(out.runs, cfg, folds_run=out.folds_run, spans=out.spans,
                        predictions=out.predictions)
    seeds = [r.metrics["val_ic"] for r in out.runs]
    assert attrs["fold_val_ic"] == [pytest.approx(statistics.mean(seeds), abs=1e-12)]
    assert attrs["val_ic_se"] == pytest.approx(statistics.stdev(seeds) / math.sqrt(3), abs=1e-12)
    assert attrs["seed_val_ic_sd"] == pytest.approx(statistics.stdev(seeds), abs=1e-12)
    assert attrs["seed_val_ic_sd"] > 0
    assert "worst_fold_val_ic" not in attrs and "fold_dates" not in attrs
    assert sorted(p.name for p in files.runs.iterdir()) == [f"fold-1.seed-{r}" for r in (1, 2, 3)]
    assert "test_ic" in out.runs[0].metrics  # the model: the (only) fold's first seed


def test_a_trials_duration_counts_each_stack_once():
    # the members of a stack train together and each reports the stack's time: duration_s (the
    # trial's training time, as before stacking) counts every stack once, one after another
    from sweeper.validation.record import training_seconds
    from sweeper.validation.scores import TrainingRun

    times = (3.0, 3.0, 3.25, 3.25)  # (fold, seed): (0, 0), (0, 1), (1, 0), (1, 1)
    runs = [TrainingRun(f, r, r, {"duration_s": t}) for (f, r), t in zip(RunGrid(2, 2).cells(), times)]
    assert training_seconds(runs, RunGrid(2, 2, stack=4)) == 3.25  # one stack of four
    assert training_seconds(runs, RunGrid(2, 2, stack=2)) == 6.25  # a fold's two seeds, then the next
    assert training_seconds(runs, RunGrid(2, 2, stack=1)) == 12.5  # one run after another: their sum
    assert training_seconds(runs[:3], RunGrid(2, 2, stack=4)) == 3.25  # cut short: what ran
    # the trial's final_scoring_s: each stack's final scoring, counted as its training time is
    scoring = [TrainingRun(f, r, r, {"final_scoring_s": t / 10}) for (f, r), t in zip(RunGrid(2, 2).cells(), times)]
    assert training_seconds(scoring, RunGrid(2, 2, stack=2), "final_scoring_s") == 0.625
    assert training_seconds(scoring, RunGrid(2, 2, stack=2)) == 0.0  # no duration_s reported: none counted


# ---------------------------------------------------------------- real sweeps through the CLI

def _sweep(path):
    sweeper_cli(Path.cwd(), "run", str(path))  # in process: the attributes, not the processes, are tested
    return _study(path)


def _study(path):
    cfg = load_config(path)
    return optuna.load_study(study_name=cfg.study.name, storage=cfg.study.resolved_storage)


def _results(number):
    """{(fold, repeat): result.json} of a trial's finished runs (1-based)."""
    out = {}
    for path in sorted(Path(f"runs/tiny/trials/{number}/runs").glob("fold-*.seed-*/result.json")):
        raw = json.loads(path.read_text())
        out[(raw["fold"], raw["repeat"])] = raw
    return out


@pytest.mark.slow
def test_walk_forward_sweep_with_repeats_stores_the_contract(study_file):
    # a pinned stack size: the steps below count stacks of 8 (auto measures its own)
    path = study_file({"validation": {"scheme": "walk_forward", "folds": 3, "repeats": 3},
                       "study": {"n_trials": 2}, "train": {"max_stack": 8}})
    study = _sweep(path)
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2
    layout = study.user_attrs["fold_dates"]
    assert len(layout) == 3
    for t in trials:
        ua, results = t.user_attrs, _results(t.number)
        assert sorted(results) == [(f, r) for f in (1, 2, 3) for r in (1, 2, 3)]
        assert [results[(1, r)]["seed"] for r in (1, 2, 3)] == [0, 1, 2]
        seed_ics = {f: [results[(f, r)]["metrics"]["val_ic"] for r in (1, 2, 3)] for f in (1, 2, 3)}
        for f in (1, 2, 3):  # a fold's score is the mean of its seeds' ICs
            assert abs(ua["fold_val_ic"][f - 1] - statistics.mean(seed_ics[f])) < 1e-9
        assert t.value == ua["val_ic"] and abs(t.value - statistics.mean(ua["fold_val_ic"])) < 1e-12
        se = statistics.stdev(ua["fold_val_ic"]) / math.sqrt(3)
        assert abs(ua["val_ic_se"] - se) < 1e-12
        assert ua["worst_fold_val_ic"] == min(ua["fold_val_ic"])
        assert ua["fold_dates"] == layout and ua["folds_run"] == 3 and len(ua["fold_best_epoch"]) == 3
        sd = statistics.mean(statistics.stdev(v) for v in seed_ics.values())
        assert ua["seed_val_ic_sd"] > 0 and abs(ua["seed_val_ic_sd"] - sd) < 1e-12
        assert len(ua["fold_seed_ensemble_val_ic"]) == 3
        # the constraints' figures: of the trial's model on every fold's valid block, each fold's seed
        # ensemble (they were its first seed's, which the trial does not deploy)
        seeds = {f: [pd.read_parquet(f"runs/tiny/trials/{t.number}/runs/fold-{f}.seed-{r}/predictions_valid.parquet")
                     for r in (1, 2, 3)] for f in (1, 2, 3)}
        model = pd.concat([pd.concat(seeds[f]).groupby(["date", "asset"], as_index=False).agg(
            pred=("pred", "mean"), label=("label", "first")) for f in (1, 2, 3)], ignore_index=True)
        cfg = load_config(path)
        figures = valid_figures(model, cfg.data.horizon, cfg.report.quantiles)
        assert ua["valid_top_turnover"] == pytest.approx(figures["valid_top_turnover"], abs=1e-12)
        first = valid_figures(pd.concat([seeds[f][0] for f in (1, 2, 3)]), cfg.data.horizon, cfg.report.quantiles)
        assert ua["valid_top_turnover"] != first["valid_top_turnover"]
        # the model is the last fold's seed ensemble: only its seeds are scored on test, each
        # seed's test IC is kept, the trial's is the ensemble's (the IC of the mean prediction),
        # and its stored test predictions are that mean
        folder = Path(f"runs/tiny/trials/{t.number}")
        assert [k for k, v in results.items() if "test_ic" in v["metrics"]] == [(3, 1), (3, 2), (3, 3)]
        assert ua["seed_test_ic"] == [results[(3, r)]["metrics"]["test_ic"] for r in (1, 2, 3)]
        members = [pd.read_parquet(folder / f"runs/fold-3.seed-{r}/predictions_test.parquet") for r in (1, 2, 3)]
        mean = pd.concat(members).groupby(["date", "asset"], as_index=False).agg(
            pred=("pred", "mean"), label=("label", "first"))
        stored = pd.read_parquet(folder / "predictions_test.parquet")
        assert np.allclose(stored["pred"], mean["pred"], rtol=0, atol=1e-7)
        assert ua["test_ic"] == pytest.approx(M.ic_report(stored)["ic"], abs=1e-12)
        assert ua["test_ic"] not in ua["seed_test_ic"]
        assert [p.name for p in sorted(folder.glob("weights*.pt"))] == ["weights.pt", "weights.seed-2.pt",
                                                                         "weights.seed-3.pt"]
        assert not list(folder.glob("runs/*/weights.pt"))
        # 9 runs in stacks of train.max_stack 8 (8 runs, then 1): one step per stack and epoch,
        # stack * epochs + epoch, the mean of its members' values at that epoch
        assert sorted(t.intermediate_values) == [1, 2, 3, 4]
        rows = pd.read_csv(folder / "metrics.csv")
        assert len(rows) == 9 * 2
        first = rows[(rows["epoch"] == 1) & ~((rows["fold"] == 3) & (rows["repeat"] == 3))]
        assert t.intermediate_values[1] == pytest.approx(first["val_ic"].mean(), abs=1e-12)
        last = rows[(rows["fold"] == 3) & (rows["repeat"] == 3)]
        assert t.intermediate_values[4] == pytest.approx(float(last["val_ic"].iloc[-1]), abs=1e-12)
        _check_seeds_differ(folder)
        _check_files(folder, layout)


def _check_seeds_differ(folder):
    for f in (1, 2, 3):
        preds = [pd.read_parquet(folder / f"runs/fold-{f}.seed-{r}/predictions_valid.parquet")
                 for r in (1, 2, 3)]
        assert list(preds[0].columns) == ["date", "asset", "pred", "label"]
        for a, b in ((0, 1), (0, 2), (1, 2)):
            assert (preds[a][["date", "asset"]].values == preds[b][["date", "asset"]].values).all()
            assert not np.allclose(preds[a]["pred"], preds[b]["pred"])


def _check_files(folder, layout):
    daily = pd.read_csv(folder / "daily_ic_valid.csv", parse_dates=["date"])
    assert list(daily.columns) == ["date", "ic", "rank_ic", "fold"] and daily["date"].is_unique
    for f, dates in enumerate(layout, start=1):
        block = daily[daily["fold"] == f]["date"]
        seed_1 = pd.read_csv(folder / f"runs/fold-{f}.seed-1/daily_ic_valid.csv", parse_dates=["date"])
        assert list(block) == list(seed_1["date"])  # every valid date of the fold, once, in order
        lo, hi = (pd.Timestamp(d) for d in dates["valid"])
        assert block.min() >= lo and block.max() <= hi
    metrics = pd.read_csv(folder / "metrics.csv")
    assert list(metrics.columns[:3]) == ["fold", "repeat", "epoch"] and len(metrics) == 18
    # every run's every epoch once; a stack writes its members' rows epoch by epoch
    rows = list(zip(metrics["fold"], metrics["repeat"], metrics["epoch"]))
    assert sorted(rows) == [(f, r, e) for f in (1, 2, 3) for r in (1, 2, 3) for e in (1, 2)]
    assert rows[:8] == [(f, r, 1) for f in (1, 2, 3) for r in (1, 2, 3)][:8]


SLOW = {"model": {"name": "fault_models:Slow", "step_sleep": 0.1},
        "validation": {"scheme": "walk_forward", "folds": 3},
        "study": {"n_trials": 1, "retries": 1},
        "train": {"epochs": 3, "batch_size": 256, "samples_per_epoch": 1024, "patience": 10},
        "devices": {"cpu_workers": 1}}


def _checkpoint_owner(path):
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - not written yet, or being replaced
        return None
    return state.get("owner", {}).get("fold"), int(state["epoch"])


@pytest.mark.slow
def test_kill_9_in_fold_3_resumes_in_fold_3(study_file):
    # one run at a time (train.max_stack 1): fold 3 is a run of its own; a stack's kill is below
    path = study_file({**SLOW, "train": {**SLOW["train"], "max_stack": 1}}, replace=("model",))
    proc = subprocess.Popen([sys.executable, "-m", "sweeper.cli", "run", str(path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    ckpt = Path("runs/tiny/trials/0/checkpoint.pt")
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and _checkpoint_owner(ckpt) not in ((3, 1), (3, 2)):
            time.sleep(0.05)
        assert _checkpoint_owner(ckpt) in ((3, 1), (3, 2)), "the trial never checkpointed in fold 3"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(1.0)  # the workers follow their driver (test_resume checks that they do)
    _, epoch = _checkpoint_owner(ckpt)
    assert sorted(_results(0)) == [(1, 1), (2, 1)]
    original = _study(path).trials[0]
    study = _sweep(path)
    trials = study.get_trials()
    assert trials[0].state == TrialState.FAIL and trials[0].user_attrs["fail_reason"] == "interrupted"
    retry = trials[1]
    assert retry.state == TrialState.COMPLETE and retry.user_attrs["retry_of"] == 0
    assert retry.user_attrs["resumed_from_fold"] == 3 and retry.user_attrs["resumed_from_epoch"] == epoch
    log = Path("runs/tiny/trials/1/train.log").read_text()
    assert f"resuming in fold 3 (seed 1) from runs/tiny/trials/0/checkpoint.pt at epoch {epoch}; " \
           "folds 1-2 done" in log
    assert "fold 1/3" not in log and "fold 2/3" not in log  # folds 1-2 were not trained again
    assert f"resumed after epoch {epoch}" in log
    assert retry.user_attrs["folds_run"] == 3 and len(retry.user_attrs["fold_val_ic"]) == 3
    for key in ((1, 1), (2, 1)):  # the finished runs are the original's
        assert _results(1)[key] == _results(0)[key]
    replayed = RunGrid.of(load_config(path)).step(2, 0, epoch)
    for step in range(1, replayed + 1):
        assert retry.intermediate_values[step] == original.intermediate_values[step]
    assert sorted(retry.intermediate_values) == list(range(1, 3 * 3 + 1))
    metrics = pd.read_csv("runs/tiny/trials/1/metrics.csv")
    assert list(zip(metrics["fold"], metrics["epoch"])) == [(f, e) for f in (1, 2, 3) for e in (1, 2, 3)]


@pytest.mark.slow
def test_time_budget_counts_across_folds(study_file):
    # one run at a time: the budget ends before the last fold's run (in one stack of the three
    # folds it would end inside the stack that holds the last run: COMPLETE, stop_reason time)
    path = study_file({**SLOW, "model": {"name": "fault_models:Slow", "step_sleep": 0.2},
                       "train": {**SLOW["train"], "epochs": 2, "max_minutes": 0.02, "max_stack": 1}},
                      replace=("model",))
    trial = _sweep(path).trials[0]
    ua = trial.user_attrs
    assert trial.state == TrialState.PRUNED and ua["stop_reason"] == "time"
    assert 1 <= ua["folds_run"] < 3 and len(ua["fold_val_ic"]) == ua["folds_run"]
    assert len(_results(0)) == ua["folds_run"]
    assert "test_ic" not in ua  # the model (the last fold's) never ran


@pytest.mark.slow
def test_kill_9_mid_stack_resumes_the_stack_at_its_last_epoch(study_file):
    """The three folds in one stack (a user model, through torch.func): killed after an epoch, the
    retry continues the whole stack from its checkpoint, not from the start. The stack size is pinned: a
    measured one (train.max_stack: auto) chose 2 once on a loaded 2-core box, which is not what this tests."""
    path = study_file({**SLOW, "train": {**SLOW["train"], "max_stack": 3}}, replace=("model",))
    proc = subprocess.Popen([sys.executable, "-m", "sweeper.cli", "run", str(path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    ckpt = Path("runs/tiny/trials/0/checkpoint.pt")
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (_checkpoint_owner(ckpt) or (0, 0))[1] < 1:
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(1.0)
    owner = torch.load(ckpt, map_location="cpu", weights_only=True)["owner"]
    epoch = _checkpoint_owner(ckpt)[1]
    assert owner["stack"] == [[1, 1], [2, 1], [3, 1]] and 1 <= epoch < 3 and _results(0) == {}
    study = _sweep(path)
    original, retry = study.get_trials()
    assert original.state == TrialState.FAIL and retry.state == TrialState.COMPLETE
    assert retry.user_attrs["resumed_from_epoch"] == epoch and retry.user_attrs["folds_run"] == 3
    log = Path("runs/tiny/trials/1/train.log").read_text()
    assert f"resumed the stack after epoch {epoch}" in log
    assert (f"resuming the stack of 3 runs led by fold 1 (seed 1) from runs/tiny/trials/0/checkpoint.pt "
            f"at epoch {epoch}; no fold done") in log
    assert sorted(retry.intermediate_values) == [1, 2, 3]  # one per stack epoch, the replayed ones too


@pytest.mark.parametrize("max_stack", [1, 8])
def test_pruned_in_fold_1_runs_no_later_fold(study_file, tmp_path, max_stack):
    """A real study with a median pruner: the peer's value at step 1 is far above; the trial is
    pruned there. One run at a time (step 1: fold 1, seed 1, epoch 1): no later fold runs. In one
    stack of the 3 folds (step 1: the stack's epoch 1): every fold stops at its first epoch."""
    path = study_file({**WF, "model": {"name": "fault_models:Probe", "kind": "noise", "hidden": 8},
                       "train": {"max_stack": max_stack}}, replace=("model",))
    cfg = load_config(path)
    study = optuna.create_study(direction="maximize",
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0))
    steps = range(1, cfg.validation.runs * cfg.train.epochs + 1)
    study.add_trial(optuna.trial.create_trial(value=0.5, intermediate_values=dict.fromkeys(steps, 0.5)))
    trial = study.ask()
    files = trial_files(tmp_path / "run", trial.number)
    files.folder.mkdir(parents=True)
    hook = OptunaHook(trial, "val_ic", trial.number, files.metrics, StopToken())
    out = train_runs(load_panel(cfg.data), Trainer(cfg, hook, time.monotonic(), store=RunStore(files, {}, RunGrid.of(cfg))))
    assert hook.pruned and out.stop_reason == "pruned" and list(study.trials[1].intermediate_values) == [1]
    if max_stack == 1:
        assert out.cut_short == "pruned" and out.folds_run == 1
        assert [p.name for p in files.runs.iterdir()] == ["fold-1.seed-1"]
    else:
        assert out.folds_run == 3 and [r.metrics["epochs_run"] for r in out.runs] == [1, 1, 1]
        assert sorted(p.name for p in files.runs.iterdir()) == [f"fold-{f}.seed-1" for f in (1, 2, 3)]


@pytest.mark.parametrize("max_stack", [1, 4, 3])
def test_steps_run_on_across_folds_and_seeds(study_file, tmp_path, max_stack):
    """The hook's offsets with a real study: one run at a time, every (fold, seed, epoch) at its own
    step; in stacks, each stack's epoch at its own step, the mean of its members' values."""
    path = study_file({"validation": {"scheme": "walk_forward", "folds": 2, "repeats": 2},
                       "train": {"max_stack": max_stack}})
    cfg = load_config(path)
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    files = trial_files(tmp_path / "run", 0)
    files.folder.mkdir(parents=True)
    hook = OptunaHook(trial, "val_ic", 0, files.metrics, StopToken())
    out = train_runs(load_panel(cfg.data), Trainer(cfg, hook, time.monotonic(), store=RunStore(files, {}, RunGrid.of(cfg))))
    values = study.trials[0].intermediate_values
    stacks = -(-4 // max_stack)  # 4 runs in stacks of max_stack
    assert sorted(values) == list(range(1, 2 * stacks + 1))
    metrics = pd.read_csv(files.metrics)
    assert len(metrics) == 8  # every run's every epoch, stacked or not
    grid = RunGrid.of(cfg)
    steps = metrics.apply(lambda row: grid.step(row["fold"] - 1, row["repeat"] - 1, row["epoch"]), axis=1)
    for step, rows in metrics.groupby(steps):
        assert values[step] == pytest.approx(rows.val_ic.mean(), abs=1e-12)
    assert out.folds_run == 2


@pytest.mark.slow
def test_train_json_prints_the_folds(study_file):
    path = study_file(WF)
    proc = subprocess.run([sys.executable, "-m", "sweeper.cli", "train", str(path), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert len(out["fold_val_ic"]) == 3 and out["folds_run"] == 3 and len(out["fold_dates"]) == 3
    assert abs(out["val_ic"] - statistics.mean(out["fold_val_ic"])) < 1e-12 and out["value"] == out["val_ic"]
    assert out["worst_fold_val_ic"] == min(out["fold_val_ic"]) and "test_ic" in out
