"""One anchor (issue 42): every relative path of a study file is taken from the study file's
folder, whatever the current folder; a study made before the rule (its storage and run folder
relative to the current folder) is still found there, with a notice."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml

from conftest import TINY, merge, sweeper_cli
from sweeper.data import write_synthetic
from sweeper.store.studies import best_trial

pytestmark = pytest.mark.slow  # real sweeps (their workers fork from the shared fork server)


def _study(folder: Path, **over: object) -> Path:
    """TINY, its data a Parquet file beside the study file, named relative to it."""
    folder.mkdir(parents=True)
    write_synthetic(folder / "panel.parquet", assets=24, dates=160, features=3, seed=1)
    raw = merge(TINY, {"study": {"n_trials": 2}, "data": {"synthetic": None, "path": "panel.parquet"}, **over})
    (folder / "study.yaml").write_text(yaml.safe_dump(raw))
    return folder / "study.yaml"


def _reads(cwd: Path, study: Path | str, stored: optuna.Study, folder: str, notice: str = "",
           data: str | None = None) -> None:
    """status, best, predict and gc --dry-run, run in ``cwd``, find the one study (``stored``, its
    run folder named ``folder``), each saying ``notice`` first on stderr (and no other), and write
    nothing relative to ``cwd``."""
    def cli(*args: object) -> str:
        result = sweeper_cli(cwd, *args)
        assert result.stderr.startswith(notice) and result.stderr.count("older sweeper") == bool(notice)
        return result.stdout

    n = len(stored.trials)
    status = cli("status", study).splitlines()
    budget = yaml.safe_load(Path(cwd, study).read_text())["study"]["n_trials"]
    assert status[:2] == [f"study 'tiny': {n}/{budget} finished (complete {n})", f"run folder {folder}: "
                          + status[1].split(": ")[1]]
    best = json.loads(cli("best", study, "--json"))
    assert best["trial"] == best_trial(stored).number
    out = cli("predict", study, "-o", "pred.parquet")
    assert f"trial {best['trial']}" in out and (data or stored.user_attrs["config"]["data"]["path"]) in out
    assert len(pd.read_parquet(cwd / "pred.parquet")) > 0
    assert cli("gc", study, "--dry-run") == "would free 0 B in 0 files\n"
    assert (cwd / "runs").exists() == (folder == "runs/tiny")  # only the study file's folder has one
    (cwd / "pred.parquet").unlink()


def test_every_command_finds_the_one_study_from_any_folder(tmp_path):
    study = _study(tmp_path / "exp")
    out = sweeper_cli(tmp_path, "run", "exp/study.yaml")
    assert out.stderr.splitlines()[:2] == [
        "enqueued 1 parameter set ahead of the sampler's: the study file's own values (config)",
        "created study 'tiny' in sqlite:///exp/runs/tiny/study.db, its files in exp/runs/tiny"]
    # one host's SQLite study: its budget, plainly (a shared one's counts across hosts, names this one)
    assert re.search(r"\] budget reached: study\.n_trials=2 trials are finished\n", out.stdout)
    assert (tmp_path / "exp/runs/tiny/study.db").is_file() and not (tmp_path / "runs").exists()
    stored = optuna.load_study(study_name="tiny", storage=f"sqlite:///{tmp_path}/exp/runs/tiny/study.db")
    assert stored.user_attrs["config"]["data"]["path"] == str(study.parent / "panel.parquet")

    _reads(study.parent, "study.yaml", stored, "runs/tiny")  # the study file's own folder
    _reads(tmp_path, "exp/study.yaml", stored, "exp/runs/tiny")  # its parent
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _reads(elsewhere, study, stored, str(study.parent / "runs/tiny"))  # elsewhere, the file named absolute
    out = sweeper_cli(elsewhere, "run", study, "--set", "study.n_trials=3")  # resumes the same study
    assert "created study" not in out.stderr and "older sweeper" not in out.stderr
    assert len(optuna.load_study(study_name="tiny", storage=stored._storage).trials) == 3
    assert not (elsewhere / "runs").exists()
    assert stored.metric_names == ["val_ic"]  # optuna-dashboard's axes name the metric (issue 42)

    moved = shutil.move(study.parent, tmp_path / "moved")  # the whole folder moved: its data with it
    stored = optuna.load_study(study_name="tiny", storage=f"sqlite:///{moved}/runs/tiny/study.db")
    (moved / "panel.parquet").rename(moved / "renamed.parquet")  # trials' config.yaml name the old path
    raw = yaml.safe_load((moved / "study.yaml").read_text())
    (moved / "study.yaml").write_text(yaml.safe_dump({**raw, "data": {**raw["data"], "path": "renamed.parquet"}}))
    _reads(elsewhere, moved / "study.yaml", stored, str(moved / "runs/tiny"), data=str(moved / "renamed.parquet"))


def test_a_study_made_before_the_rule_is_found_where_it_is_with_a_notice(tmp_path):
    # made as an older sweeper made it from tmp_path: storage and run folder relative to the current
    # folder, while the study file sits in exp/
    study = _study(tmp_path / "exp")
    sweeper_cli(study.parent, "run", "study.yaml")
    shutil.move(study.parent / "runs", tmp_path / "runs")
    notice = ("sweeper: study 'tiny' is used where an older sweeper put it, relative to the current folder "
              "(runs/tiny); to keep it beside exp/study.yaml, as a new study is, move runs/tiny to "
              "exp/runs/tiny while no sweep runs\n")
    stored = optuna.load_study(study_name="tiny", storage=f"sqlite:///{tmp_path}/runs/tiny/study.db")
    _reads(tmp_path, "exp/study.yaml", stored, "runs/tiny", notice)
    out = sweeper_cli(tmp_path, "run", "exp/study.yaml", "--set", "study.n_trials=3")
    assert notice in out.stderr and "created study" not in out.stderr
    assert len(stored.trials) == 3 and not (study.parent / "runs").exists()
    shutil.move(tmp_path / "runs", study.parent / "runs")  # moved as the notice says: found, no notice
    status = sweeper_cli(tmp_path, "status", "exp/study.yaml")
    assert status.stderr == "" and "tiny" in status.stdout
