"""status, best, drift refusal and --force on a real finished study."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from sweeper.cli import main
from sweeper.store import layout


def _cli(*args, code=0):
    result = CliRunner().invoke(main, list(map(str, args)), catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result.output


@pytest.mark.slow
def test_status_best_and_drift(study_file):
    path = study_file({"study": {"n_trials": 2}, "model": {"name": "mlp", "hidden_size": 8}}, replace=("model",))
    _cli("run", path)
    status = json.loads(_cli("status", path, "--json"))
    assert status["finished"] == 2 and status["counts"]["COMPLETE"] == 2 and status["running"] == []
    best = json.loads(_cli("best", path, "--json"))
    assert best["trial"] in (0, 1) and best["metric"] == "val_ic"
    assert set(best["params"]) == {"train.lr"}
    assert best["weights"].endswith(f"trials/{best['trial']}/weights.pt")
    assert best["oracle_test_ic"] > 0.05 and "test_ic_oracle_fraction" in best
    assert best["value"] == best["metrics"]["val_ic"]
    assert "best: trial" in _cli("status", path)
    # a study file edited since (the metric, for a new study): read commands read the trials as they ran;
    # `best` called val_ic "val_rank_ic", and under val_loss named a val_ic "val_loss"
    for metric in ("val_rank_ic", "val_loss"):
        result = CliRunner().invoke(main, ["best", str(path), "--json", "--set", f"study.metric={metric}"])
        again = json.loads(result.stdout)
        assert (again["trial"], again["value"], again["metric"], again["objective"]) == (
            best["trial"], best["value"], "val_ic", "val_ic")
        assert result.stderr == (f"sweeper: the study file differs from study 'tiny' in study.metric ('val_ic' -> "
                                 f"{metric!r}): its trials are read as it ran them\n")
    natural = CliRunner().invoke(main, ["best", str(path), "--json", "--set", "study.direction=maximize"])
    assert natural.stderr == "" and json.loads(natural.stdout)["value"] == best["value"]  # None -> maximize: none

    raw = yaml.safe_load(path.read_text())
    raw["train"]["lr"] = 0.05
    raw["search_space"]["train.lr"]["high"] = 0.02
    path.write_text(yaml.safe_dump(raw))
    out = _cli("run", path, code=2)
    assert "train.lr (0.001 -> 0.05)" in out and "search_space.train.lr.high (0.01 -> 0.02)" in out
    assert "--force" in out
    assert _cli("validate", path, code=2) == out  # validate says what run would refuse (it said ok)
    # another synthetic panel: its fingerprint differs, and there is no data file to name (it said "None")
    other = {**raw, "data": {**raw["data"], "synthetic": {**raw["data"]["synthetic"], "seed": 9}}}
    path.write_text(yaml.safe_dump(other))
    assert "): the synthetic panel is not the data this study was run on" in _cli("run", path, code=2)

    raw["study"]["n_trials"] = 3  # the budget may change
    path.write_text(yaml.safe_dump(raw))
    _cli("run", path, "--force")
    assert json.loads(_cli("status", path, "--json"))["finished"] == 3


@pytest.mark.slow
def test_a_data_file_that_grew_moves_the_split_which_the_drift_message_names_with_its_pin(study_file, workdir):
    """Daily use: the panel gains dates, and a split given as fractions moves with them. The refusal named
    only the fingerprint, and --force ranked new trials, scored on other valid and test dates, with the
    study's: the message names the dates and the pin to paste, and with the pin the study carries on on its own."""
    from sweeper.data.synth import synthetic_frame

    frame, _ = synthetic_frame(24, 200, 3, 1)
    days = sorted(frame["date"].unique())
    frame[frame["date"] <= days[159]].to_parquet(workdir / "panel.parquet")
    path = study_file({"study": {"n_trials": 1}, "data": {"path": "panel.parquet", "synthetic": None}})
    _cli("run", path)
    frame.to_parquet(workdir / "panel.parquet")  # 40 dates more
    out = _cli("run", path, "--set", "study.n_trials=2", code=2)
    pin = ("data.split: {train: [2010-01-08, 2010-05-14], valid: [2010-05-19, 2010-06-30], "
           "test: [2010-07-05, 2010-08-13]}")
    assert ("; split dates (train 2010-01-08 to 2010-05-14, valid 2010-05-19 to 2010-06-30, test 2010-07-05 to "
            "2010-08-13 -> train 2010-01-08 to 2010-06-17, valid 2010-06-22 to 2010-08-13, test 2010-08-18 to "
            "2010-10-08): new trials would be scored on other dates than its trials so far and ranked with "
            f"them; {pin} keeps its dates (with --force for the data's fingerprint). Revert them") in out
    assert _cli("validate", path, code=2) == out
    raw = yaml.safe_load(path.read_text())
    raw["data"]["split"] = yaml.safe_load(pin.split(": ", 1)[1])
    path.write_text(yaml.safe_dump(raw))
    assert "split dates" not in _cli("run", path, code=2)  # the fingerprint and the split's keys only
    _cli("run", path, "--force", "--set", "study.n_trials=2")
    assert json.loads(_cli("status", path, "--json"))["finished"] == 2
    valid = [pd.read_csv(layout.trial_files(workdir / "runs/tiny", k).daily_ic("valid"))["date"] for k in (0, 1)]
    assert list(valid[1]) == list(valid[0]) and (valid[0].iloc[0], valid[0].iloc[-1]) == ("2010-05-19", "2010-06-30")


@pytest.mark.slow
def test_a_study_run_with_set_is_read_with_the_same_set(study_file):
    # the read commands took no --set: a study named by one could not be read at all
    path = study_file({"study": {"n_trials": 1}, "model": {"name": "mlp", "hidden_size": 8}}, replace=("model",))
    renamed = ("--set", "study.name=other", "--set", "study.storage=sqlite:///runs/other/study.db")
    out = _cli("run", path, *renamed)
    # the lines to paste carry the --set that names the study (they named the file's own study)
    args = f"{path} --set study.name=other --set study.storage=sqlite:///runs/other/study.db"
    assert f"next: sweeper best {args} | sweeper report {args} -o report.html | sweeper dashboard {args}" in out
    status = json.loads(_cli("status", path, *renamed, "--set", "study.n_trials=1", "--json"))
    assert (status["study"], status["finished"], status["n_trials"]) == ("other", 1, 1)
    # and by its --storage (they named the file's own store: a resume there made another study)
    out = _cli("run", path, "--storage", "sqlite:///elsewhere.db")
    args = f"{path} --storage sqlite:///elsewhere.db"
    assert f"next: sweeper best {args} | sweeper report {args} -o report.html | sweeper dashboard {args}" in out
    assert json.loads(_cli("status", path, "--storage", "sqlite:///elsewhere.db", "--json"))["finished"] == 1
    assert json.loads(_cli("best", path, *renamed, "--json"))["trial"] == 0
    assert "wrote" in _cli("export", path, *renamed, "-o", "t.csv")
    _cli("best", path, code=2)  # the file's own study was never run


@pytest.mark.slow
def test_budget_and_devices_may_change_without_force(study_file):
    path = study_file({"study": {"n_trials": 1}, "model": {"name": "mlp", "hidden_size": 8}}, replace=("model",))
    _cli("run", path)
    raw = yaml.safe_load(path.read_text())
    raw["study"]["n_trials"] = 2
    raw["devices"]["cpu_workers"] = 1
    raw["study"]["timeout"] = 600
    path.write_text(yaml.safe_dump(raw))
    _cli("resume", path)
    assert json.loads(_cli("status", path, "--json"))["finished"] == 2


def test_status_of_a_missing_study_is_a_clear_error(study_file):
    path = study_file()
    out = _cli("status", path, code=2)
    assert "no such database file" in out or "not found" in out
