"""Every mistake in a study or data file: exit 2, one message naming the culprit, nothing written."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from sweeper.cli import main

GOOD_DATA = {"lookback": 5, "split": {"train": 0.6, "valid": 0.2, "test": 0.2}}


def _panel(path, n_dates=80, n_assets=6, **mutate):
    dates = pd.bdate_range("2020-01-01", periods=n_dates)
    df = pd.DataFrame({"date": np.repeat(dates, n_assets), "asset": np.tile([f"A{i}" for i in range(n_assets)], n_dates)})
    rng = np.random.default_rng(0)
    df["f1"] = rng.normal(size=len(df))
    df["f2"] = rng.normal(size=len(df))
    df["label"] = rng.normal(size=len(df))
    for key, value in mutate.items():
        df = value(df)
    df.to_parquet(path)
    return path


def _study(tmp_path, text: str | None = None, **sections):
    base = {"study": {"name": "bad", "n_trials": 1}, "data": {"synthetic": {"assets": 20, "dates": 200, "features": 3}},
            "devices": {"gpus": "none", "cpu_workers": 1}}
    base.update(sections)
    path = tmp_path / "study.yaml"
    path.write_text(text if text is not None else yaml.safe_dump(base))
    return path


def _run(tmp_path, path, *args, command="run"):
    before = set(os.listdir(tmp_path))
    result = CliRunner().invoke(main, [command, str(path), *args], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert set(os.listdir(tmp_path)) == before, "something was written"
    lines = [line for line in result.output.strip().splitlines() if line]
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SWEEPER_FAKE_GPUS", raising=False)
    return tmp_path


CASES = {
    "yaml syntax": ({"text": "study:\n  name: bad\n  n_trials: [1\n"}, ["YAML syntax error", "line 3"]),
    # a second section would replace the first whole (its batch size, lr, loss...) without a word
    "repeated section": ({"text": "study:\n  name: bad\ntrain:\n  lr: 0.01\ntrain:\n  epochs: 2\n"},
                         ["line 5, column 1", "the key 'train' is given twice (the second would replace the first)"]),
    "repeated key": ({"text": "study:\n  name: bad\ntrain: {epochs: 8, epochs: 3}\n"},
                     ["line 3, column 20", "the key 'epochs' is given twice"]),
    "unknown key": ({"train": {"epocs": 2}}, ["unknown key 'train.epocs'; did you mean 'train.epochs'?"]),
    "wrong type": ({"train": {"epochs": "many"}}, ["train.epochs: Input should be a valid integer", "'many'"]),
    "low > high": ({"search_space": {"train.lr": {"type": "float", "low": 0.1, "high": 0.01}}}, ["search_space.train.lr", "low (0.1) > high (0.01)"]),
    "log low <= 0": ({"search_space": {"train.lr": {"type": "float", "low": 0.0, "high": 0.1, "log": True}}}, ["search_space.train.lr", "log scale needs low > 0"]),
    "empty choices": ({"search_space": {"model.d_model": {"type": "categorical", "choices": []}}}, ["search_space.model.d_model", "non-empty 'choices'"]),
    "unknown sampler": ({"study": {"name": "bad", "sampler": {"name": "bayes"}}}, ["study.sampler.name", "'bayes'"]),
    "unknown pruner": ({"study": {"name": "bad", "pruner": {"name": "early"}}}, ["study.pruner.name", "'early'"]),
    "unknown model": ({"model": {"name": "resnet"}}, ["unknown model 'resnet'"]),
    "model path does not import": ({"model": {"name": "no_such_pkg.models:Net"}}, ["model.name 'no_such_pkg.models:Net'", "cannot import module 'no_such_pkg.models'"]),
    "bad sampler option": ({"study": {"name": "bad", "sampler": {"name": "tpe", "options": {"n_startup": 3}}}}, ["study.sampler.options", "n_startup"]),
    "unreachable storage": ({"study": {"name": "bad", "storage": "postgresql+psycopg://nobody@127.0.0.1:1/none"}}, ["storage postgresql+psycopg://nobody@127.0.0.1:1/none", "cannot connect"]),
    "gpu index": ({"devices": {"gpus": [7]}}, ["devices.gpus", "index 7"]),
    "gpu uuid": ({"devices": {"gpus": ["GPU-deadbeef"]}}, ["GPU-deadbeef"]),
    "gp with a pruner": ({"study": {"name": "bad", "sampler": {"name": "gp"}}},
                         ["study: sampler gp learns from complete trials only: with pruner median it keeps proposing "
                          "pruned configs; set pruner: {name: none}, or use tpe"]),
    "grace period under two heartbeats": (
        {"study": {"name": "bad", "heartbeat_interval": 10, "grace_period": 15}},
        ["study: grace_period (15) must be at least 2 x heartbeat_interval (10)"]),
    # found before the study is created (it was found after, by a traceback, with trial 0 WAITING in
    # a new study); /proc takes no folders, even from root, whom os.access lets write anywhere
    "unwritable run folder": ({"study": {"name": "bad", "artifacts": "/proc/sweeper-runs"}},
                              ["study.artifacts: the run folder /proc/sweeper-runs cannot be made or written here"]),
    # validate said ok, and run pruned every trial as a config the model refuses, exit 0
    "fp16 on a CPU host": ({"train": {"precision": "fp16"}, "devices": {"gpus": "none", "cpu_workers": 1}},
                           ["train.precision: fp16 needs a CUDA device (training on the CPU: cpu0); "
                            "use bf16, fp32 or auto"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_bad_study_file(here, monkeypatch, name):
    sections, fragments = CASES[name]
    if name.startswith("gpu"):
        monkeypatch.setenv("SWEEPER_FAKE_GPUS", "2")
    path = _study(here, **sections)
    line = _run(here, path)
    assert line.startswith("Error: ")
    for fragment in fragments:
        assert fragment in line, line
    if name not in ("bad sampler option", "unreachable storage", "gpu index", "gpu uuid", "model path does not import",
                    "unwritable run folder", "fp16 on a CPU host"):
        assert str(path) in line


DATA_CASES = {
    "missing file": (lambda p: p.with_name("absent.parquet"), ["absent.parquet"]),
    "not parquet": (lambda p: (p.write_text("date,asset\n2020-01-01,A\n"), p)[1], ["not a Parquet file"]),
    "missing column": (lambda p: _panel(p, drop=lambda d: d.drop(columns=["label"])), ["'label'"]),
    "non-numeric feature": (lambda p: _panel(p, s=lambda d: d.assign(f2=d["f2"].astype(str))), ["'f2'"]),
    "duplicated rows": (lambda p: _panel(p, dup=lambda d: pd.concat([d, d.iloc[:3]])), ["duplicate"]),
    "too few dates": (lambda p: _panel(p, n_dates=9), ["dates"]),
}


# slow: `sweeper run` starts the workers' fork server once the study file loads, before the data's checks
@pytest.mark.slow
@pytest.mark.parametrize("name", list(DATA_CASES))
def test_bad_data_file(here, name):
    make, fragments = DATA_CASES[name]
    data_path = make(here / "panel.parquet")
    features = None if name == "missing column" else ["f1", "f2"]
    path = _study(here, data={**GOOD_DATA, "path": str(data_path), "features": features})
    line = _run(here, path)
    assert str(data_path) in line, line
    for fragment in fragments:
        assert fragment.lower() in line.lower(), line


def test_validate_runs_every_check_without_writing(here):
    path = _study(here, model={"name": "mlp", "hidden_size": 8})
    result = CliRunner().invoke(main, ["validate", str(path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert f"{path}: ok" in result.output
    assert os.listdir(here) == ["study.yaml"]
    bad = _study(here, train={"epochs": 0})
    assert "train.epochs" in _run(here, bad, command="validate")


@pytest.mark.slow  # the fork server starts before the study is looked up (above)
def test_resume_needs_an_existing_study(here):
    path = _study(here)
    line = _run(here, path, command="resume")
    assert "study 'bad' does not exist" in line and "sweeper run" in line
