"""Studies written by the code of d1a4397, before issue 39 changed a trial's files, still work:
every command reads, resumes, collects and reports them (tests/old_studies.py made the archive;
what it holds is tests/fixtures/old_studies.json). A holdout study (one run per trial) and a
walk-forward study (2 folds x 2 seeds as one stack of 4), each with a trial interrupted after
its first epoch's checkpoint, which ``resume`` must continue."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import optuna
import pandas as pd
import pytest

import old_studies as O
from conftest import sweeper_cli

WANT = O.expected()
STORED = ("holdout", "walk_forward")


def _study(root: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=f"old_{name}", storage=f"sqlite:///{root}/runs/old_{name}/study.db")


def _trial_folder(root: Path, name: str, number: int) -> Path:
    return root / "runs" / f"old_{name}" / "trials" / str(number)


def _json(root: Path, *args: str) -> dict:
    return json.loads(sweeper_cli(root, *args, "study.yaml", "--json").stdout)


@pytest.fixture
def old(tmp_path):
    return O.unpack(tmp_path)


def test_the_archive_is_what_its_record_says(old):
    for name in STORED:
        trials = _study(old[name], name).trials
        want = WANT[name]["trials"]
        assert [(t.number, t.state.name, t.params) for t in trials] == [
            (t["number"], t["state"], t["params"]) for t in want]
        assert [t.value for t in trials] == [t["value"] for t in want]
        last = _trial_folder(old[name], name, want[-1]["number"])
        assert (last / "checkpoint.pt").exists() and not (last / "weights.pt").exists()
    assert "fold" not in WANT["holdout"]["checkpoint"]["owner"]  # a one-run trial's stamp names no run
    assert len(WANT["walk_forward"]["checkpoint"]["owner"]["stack"]) == 4


@pytest.mark.parametrize("name", STORED)
def test_status_best_and_export_read_an_old_study(old, name):
    root, want = old[name], WANT[name]
    best = _json(root, "best")
    assert (best["trial"], best["value"]) == (want["best"], want["best_value"])
    assert Path(root / best["weights"]).exists()
    status = _json(root, "status")
    states = [t["state"] for t in want["trials"]]
    assert {k: v for k, v in status["counts"].items() if v} == {s: states.count(s) for s in set(states)}
    assert status["best"]["trial"] == want["best"] and status["running"] == []
    sweeper_cli(root, "export", "study.yaml", "-o", "trials.parquet")
    frame = pd.read_parquet(root / "trials.parquet")
    assert frame["number"].tolist() == [t["number"] for t in want["trials"]]
    assert frame["state"].tolist() == states
    values = [None if v is None or math.isnan(v) else v for v in frame["value"]]
    assert values == [t["value"] for t in want["trials"]]


@pytest.mark.parametrize("name", STORED)
def test_predict_scores_the_best_trial_as_it_stored_its_predictions(old, name):
    root, best = old[name], WANT[name]["best"]
    sweeper_cli(root, "predict", "study.yaml", "-o", "preds.parquet")
    got = pd.read_parquet(root / "preds.parquet")
    stored = pd.read_parquet(_trial_folder(root, name, best) / "predictions_valid.parquet")
    keys = ["date", "asset"]
    got, stored = (f.sort_values(keys, ignore_index=True) for f in (got, stored))
    assert len(got) == len(stored) > 0
    assert (got[keys] == stored[keys]).all().all()
    assert got["label"].equals(stored["label"])
    # the same weights on the same rows: equal up to another CPU's rounding
    assert (got["pred"] - stored["pred"]).abs().max() < 1e-5


@pytest.mark.parametrize("name", STORED)
def test_report_writes_one_page(old, name):
    sweeper_cli(old[name], "report", "study.yaml", "-o", "report.html")
    page = (old[name] / "report.html").read_text()
    assert f"old_{name}" in page and "<html" in page.lower()


@pytest.mark.parametrize("name", STORED)
def test_gc_removes_what_keep_says_and_no_more(old, name):
    """Keep the best trial's weights only: the other COMPLETE trial's go; the interrupted trial's
    checkpoint stays (its retry is due) and so does the best's model."""
    root, want = old[name], WANT[name]
    keep = ("--set", "study.keep.weights=top_k", "--set", "study.keep.k=1")
    other = next(t["number"] for t in want["trials"] if t["state"] == "COMPLETE" and t["number"] != want["best"])
    weights = _trial_folder(root, name, other) / "weights.pt"
    dry = sweeper_cli(root, "gc", "study.yaml", *keep, "--dry-run").output
    assert str(Path("trials") / str(other) / "weights.pt") in dry and weights.exists()
    sweeper_cli(root, "gc", "study.yaml", *keep)
    assert not weights.exists()
    assert (_trial_folder(root, name, want["best"]) / "weights.pt").exists()
    assert (_trial_folder(root, name, want["checkpoint"]["trial"]) / "checkpoint.pt").exists()


@pytest.mark.parametrize("name", STORED)
def test_refit_trains_the_best_trial_on_every_date(old, name):
    root, best = old[name], WANT[name]["best"]
    sweeper_cli(root, "refit", "study.yaml", "--until", "2010-09-30")
    refit = _trial_folder(root, name, best) / "refit"
    record = json.loads((refit / "refit.json").read_text())
    assert record["trial"] == best and record["until"] == "2010-09-30"
    assert (refit / "weights.pt").exists() and (refit / "norm_stats.json").exists()
    assert (refit / "weights.seed-2.pt").exists() == (name == "walk_forward")


@pytest.mark.slow
@pytest.mark.parametrize("name", STORED)
def test_resume_continues_the_old_checkpoint_and_every_reader_takes_the_mixed_study(old, name):
    """The interrupted trial's retry continues its old checkpoint (the holdout one's stamp names
    no run; the walk-forward one's names a stack of 4); afterwards the study holds trials in the
    old layout and the retry in today's, and every reader takes both."""
    root, want = old[name], WANT[name]
    interrupted = want["checkpoint"]["trial"]
    sweeper_cli(root, "resume", "study.yaml")
    study = _study(root, name)
    retry = study.trials[-1]
    assert retry.user_attrs["retry_of"] == interrupted and retry.number == interrupted + 1
    assert retry.state.name in ("COMPLETE", "PRUNED")
    assert retry.user_attrs["resumed_from_epoch"] == want["checkpoint"]["epoch"]
    assert "resume_skipped" not in retry.user_attrs
    folder = _trial_folder(root, name, retry.number)
    log = (folder / "train.log").read_text()
    assert f"trials/{interrupted}/checkpoint.pt" in log and "starting fresh" not in log
    with (folder / "metrics.csv").open() as fh:  # the old trial's rows, copied, name their run too
        table = list(csv.reader(fh))
    assert table[0][:3] == ["fold", "repeat", "epoch"] and {len(row) for row in table} == {len(table[0])}
    assert len(table) > 1 + want["checkpoint"]["epoch"]
    # the retry lays its runs out as every trial does today; the old trials stay as they were
    assert (folder / "runs" / "fold-1.seed-1" / "result.json").exists()
    assert not (_trial_folder(root, name, want["best"]) / "runs").exists() or name == "walk_forward"
    assert retry.params == want["trials"][-1]["params"]
    old_steps = study.trials[interrupted].intermediate_values
    assert {s: v for s, v in retry.intermediate_values.items() if s in old_steps} == old_steps
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    top = max(complete, key=lambda t: t.value)
    best = _json(root, "best")
    assert (best["trial"], best["value"]) == (top.number, top.value)
    assert _json(root, "status")["counts"]["COMPLETE"] == len(complete)
    sweeper_cli(root, "export", "study.yaml", "-o", "trials.parquet")
    assert pd.read_parquet(root / "trials.parquet")["number"].tolist() == [t.number for t in study.trials]
    sweeper_cli(root, "report", "study.yaml", "-o", "report.html")
    if retry.state.name == "COMPLETE":
        sweeper_cli(root, "predict", "study.yaml", "--trial", str(retry.number), "-o", "retry.parquet")
        assert len(pd.read_parquet(root / "retry.parquet")) > 0
    sweeper_cli(root, "predict", "study.yaml", "--trial", "top2", "-o", "top2.parquet")
    sweeper_cli(root, "gc", "study.yaml", "--dry-run")
    sweeper_cli(root, "gc", "study.yaml")
    assert not (_trial_folder(root, name, interrupted) / "checkpoint.pt").exists()  # its retry has ended
