"""A trial's files have one owner (issue 27): store.trial_folder copies, moves and removes them,
every path is worked out from the run folder at use time, and two defects found by reading."""
from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import yaml
from click.testing import CliRunner
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from sweeper.cli import main
from sweeper.config import load_config, to_dict
from sweeper.store.layout import previous_dir, trial_files, trial_of_checkpoint
from sweeper.store.trial_folder import Liveness, TrialFolder, remove, resume_attrs, resume_checkpoint, resumes
from sweeper.validation.contract import FOLD_DATES, FOLDS_RUN
from sweeper.validation.grid import RunGrid

LR = {"train.lr": FloatDistribution(1e-4, 1.0)}
TWO_FOLDS = [{"train": ["2010-01-08", "2010-03-22"], "valid": ["2010-03-25", "2010-06-03"]},
             {"train": ["2010-01-08", "2010-06-03"], "valid": ["2010-06-08", "2010-08-17"]}]


def _study_yaml(tmp_path: Path, **study) -> Path:
    from conftest import TINY, merge

    path = tmp_path / "study.yaml"
    raw = merge(TINY, {"study": {"storage": f"sqlite:///{tmp_path}/s.db", "artifacts": str(tmp_path / "run"),
                                 **study}})
    path.write_text(yaml.safe_dump(raw))
    return path


def _cli(*args, code=0):
    result = CliRunner().invoke(main, list(map(str, args)), catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result.output


# ---------------------------------------------------------------- defect 1: gc of a moved-aside study

@pytest.mark.parametrize("names_source", [
    lambda run: {"resume_from": str(run / "trials/0/checkpoint.pt")},  # a retry stored before issue 27
    lambda run: {"resume_from_trial": 0},
])
def test_gc_of_a_moved_aside_study_keeps_the_checkpoint_its_waiting_retry_resumes(tmp_path, names_source):
    """Study A's trial 0 was interrupted and its retry (trial 1) waits; then study B took the run
    folder over, moving A's files to previous/<A's uuid>/. ``sweeper gc`` on A judges liveness in
    that folder: the retry's source is live there, whatever path its ``resume_from`` stored."""
    run = tmp_path / "run"
    path = _study_yaml(tmp_path)
    study = optuna.create_study(study_name="tiny", storage=f"sqlite:///{tmp_path}/s.db", direction="maximize")
    study.set_user_attr("study_uuid", "uuid-a")
    study.add_trial(create_trial(state=TrialState.FAIL, params={"train.lr": 0.01}, distributions=LR,
                                 user_attrs={"fail_reason": "interrupted",
                                             "checkpoint": str(run / "trials/0/checkpoint.pt")}))
    study.enqueue_trial({"train.lr": 0.01}, user_attrs={"retry_of": 0, "attempt": 1, **names_source(run)})
    aside = previous_dir(run, "uuid-a")
    for number in (0, 1):
        (aside / "trials" / str(number)).mkdir(parents=True)
    (aside / "trials/0/checkpoint.pt").write_bytes(b"x" * 1300)
    run.joinpath("owner.json").write_text(json.dumps({"study": "tiny", "study_uuid": "uuid-b"}))

    assert _cli("gc", path, "--dry-run").splitlines() == ["would free 0 B in 0 files"]
    assert _cli("gc", path).splitlines() == ["freed 0 B in 0 files"]
    assert (aside / "trials/0/checkpoint.pt").exists()  # the waiting retry resumes from it


# ---------------------------------------------------------------- defect 2: predict of a model never trained

def test_predict_of_a_trial_pruned_before_its_last_fold_says_it_has_no_model(tmp_path, monkeypatch):
    """A trial of two folds pruned in its first never trained its model run (the last fold's
    first seed): it has no weights, and none were removed."""
    monkeypatch.chdir(tmp_path)
    path = _study_yaml(tmp_path)
    study = optuna.create_study(study_name="tiny", storage=f"sqlite:///{tmp_path}/s.db", direction="maximize")
    study.set_user_attr(FOLD_DATES, TWO_FOLDS)
    study.add_trial(create_trial(state=TrialState.PRUNED, params={"train.lr": 0.01}, distributions=LR,
                                 user_attrs={"stop_reason": "pruned", FOLDS_RUN: 1, FOLD_DATES: TWO_FOLDS},
                                 intermediate_values={1: 0.01}))
    files = trial_files(tmp_path / "run", 0)
    files.folder.mkdir(parents=True)
    files.config.write_text(yaml.safe_dump(to_dict(load_config(path))))
    out = _cli("predict", path, "--trial", 0, "-o", "p.csv", code=2)
    assert "weights are gone" not in out
    assert "trial 0 has no model: it was pruned before its last fold" in out, out
    assert "fold 2, seed 1" in out, out  # the model run that never finished


# ---------------------------------------------------------------- the folder's operations

def test_what_a_retry_resumes_is_a_trial_number_resolved_in_the_run_folder(tmp_path):
    assert trial_of_checkpoint("runs/x/trials/3/checkpoint.pt") == 3
    assert trial_of_checkpoint("runs/x/previous/u/trials/12/checkpoint.pt") == 12
    assert trial_of_checkpoint("two-0.pt") is None and trial_of_checkpoint("trials/3/weights.pt") is None
    assert resumes({"resume_from_trial": 4, "resume_from": "runs/x/trials/3/checkpoint.pt"}) == 4
    assert resumes({"resume_from": "runs/x/trials/3/checkpoint.pt"}) == 3  # an older retry
    assert resumes({"resume_from": "two-0.pt"}) == "two-0.pt"  # a path that names no trial
    assert resumes({}) is None
    assert resume_attrs(3) == {"resume_from_trial": 3} and resume_attrs("a.pt") == {"resume_from": "a.pt"}
    assert resume_attrs(None) == {}
    aside = tmp_path / "previous" / "u"
    assert resume_checkpoint(aside, {"resume_from": "runs/x/trials/3/checkpoint.pt"}) == \
        aside / "trials" / "3" / "checkpoint.pt"
    assert TrialFolder.of(trial_files(aside, 3)) == TrialFolder(aside, 3)


def test_liveness_of_running_waiting_and_due_trials(tmp_path):
    running = create_trial(state=TrialState.COMPLETE, value=1.0)
    running.state, running.number = TrialState.RUNNING, 5
    waiting = create_trial(state=TrialState.COMPLETE, value=1.0)
    waiting.state, waiting.number = TrialState.WAITING, 6
    waiting.user_attrs = {"resume_from_trial": 2}
    failed = create_trial(state=TrialState.FAIL)
    failed.number = 3
    live = Liveness.of(tmp_path, [running, waiting, failed], [(failed, {"resume_from_trial": 1})])
    assert {n for n in range(8) if live.keeps(TrialFolder(tmp_path, n))} == {1, 2, 3, 5, 6}


def test_a_retry_copies_its_sources_finished_runs_and_a_trial_takes_its_model(tmp_path):
    grid = RunGrid(folds=2, repeats=2, epochs=3)
    source, retry = TrialFolder(tmp_path, 0), TrialFolder(tmp_path, 1)
    for fold, seed in [(0, 0), (0, 1), (1, 0)]:
        run = source.files.run_files(fold, seed)
        run.folder.mkdir(parents=True)
        run.result.write_text("{}")
    source.files.run_files(1, 1).folder.mkdir(parents=True)  # in progress: no result.json
    source.files.weights.write_bytes(b"w")  # the model run's weights, taken before it was interrupted
    # the store takes plain cells, (fold, seed) 0-based: here the grid's, and its model's members
    assert retry.copy_runs_from(source.files, grid.cells(), grid.members) == [(0, 0), (0, 1), (1, 0)]
    assert retry.files.run_files(1, 0).weights.read_bytes() == b"w"
    assert not retry.files.run_files(1, 1).folder.exists()
    assert retry.copy_runs_from(source.files, [(1, 1)], grid.members) == []  # unfinished: nothing to skip

    model = retry.files.run_files(*grid.model_run)
    model.norm_stats.write_text("{}")
    model.daily_ic("test").write_text("date,ic\n")
    retry.take_model(grid.members)
    assert retry.files.weights.read_bytes() == b"w" and not model.weights.exists()
    assert retry.files.norm_stats.exists() and model.norm_stats.exists()
    assert retry.files.daily_ic("test").exists()
    assert retry.checkpoint_files() == [retry.files.checkpoint]


def test_clear_stale_and_remove(tmp_path):
    folder = TrialFolder(tmp_path, 0)
    folder.files.run_files(0, 0).folder.mkdir(parents=True)
    folder.files.checkpoint.write_bytes(b"c" * 10)
    said: list[str] = []
    folder.clear_stale(said.append)
    assert not folder.files.checkpoint.exists() and not folder.files.runs.exists() and len(said) == 2
    folder.files.weights.write_bytes(b"w" * 7)
    assert remove(folder.files.weights, dry_run=True) == 7 and folder.files.weights.exists()
    assert remove(folder.files.weights) == 7 and remove(folder.files.weights) is None
