"""`sweeper train STUDY --set ... --json`: one run, the JSON keys the driver stores."""
from __future__ import annotations

import json

from click.testing import CliRunner

from sweeper.cli import main

KEYS = {"val_ic", "val_rank_ic", "val_icir", "val_loss", "test_ic", "test_rank_ic", "test_icir", "best_epoch",
        "epochs_run", "batch_size", "micro_batch_size", "accum_steps", "precision", "samples_per_s", "peak_mem_mb",
        "duration_s", "final_scoring_s", "oracle_val_ic", "oracle_test_ic"}


def test_train_json_prints_the_final_metrics(study_file):
    path = study_file({"model": {"name": "mlp", "hidden_size": 8}}, replace=("model",))
    result = CliRunner().invoke(main, ["train", str(path), "--set", "train.epochs=2", "--set", "train.lr=0.003",
                                       "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    start = result.output.index("{")  # the per-epoch table goes to stderr, merged here by CliRunner
    metrics = json.loads(result.output[start:])
    assert set(metrics) >= KEYS
    assert metrics["epochs_run"] == 2 and metrics["batch_size"] == 256
    assert metrics["precision"] == "fp32" and metrics["accum_steps"] == 1
    assert metrics["oracle_test_ic"] > 0.05
    assert 0 < metrics["final_scoring_s"] < metrics["duration_s"]
    assert -1 <= metrics["val_ic"] <= 1


def test_train_prints_a_table_per_epoch(study_file):
    path = study_file({"model": {"name": "mlp", "hidden_size": 8}}, replace=("model",))
    result = CliRunner().invoke(main, ["train", str(path), "--set", "train.epochs=3"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = next(i for i, line in enumerate(lines) if "val_ic" in line and "samples/s" in line)
    assert [line.split()[0] for line in lines[header + 1: header + 4]] == ["1", "2", "3"]
    assert any(line.startswith("valid: ic") for line in lines)
    assert any(line.startswith("test:  ic") for line in lines)


def test_train_cut_short_by_max_minutes_says_so_and_gives_no_value(study_file):
    # the trial's time ran out after its first run: its figures are that run's, not its seeds' ensemble,
    # and a sweep records it PRUNED with no value; it printed a value labelled as the ensemble's
    path = study_file({"model": {"name": "mlp", "hidden_size": 8}}, replace=("model",))
    sets = ["train.epochs=100000", "train.max_minutes=0.01", "validation.repeats=2", "train.max_stack=1",
            "train.patience=100000"]
    result = CliRunner().invoke(main, ["train", str(path), *[a for s in sets for a in ("--set", s)], "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert ("stopped (time) after 1 of 2 runs: the figures below are of those runs; a sweep records the trial "
            "PRUNED, with no value") in result.output
    metrics = json.loads(result.output[result.output.index("{"):])
    assert (metrics["value"], metrics["cut_short"], metrics["stop_reason"]) == (None, "time", "time")


def test_train_under_walk_forward_cut_short_before_its_last_fold_prints_its_figures(study_file):
    # the last fold's model gives the test IC: cut short before it, there is none, and the oracle line
    # divided by it (a KeyError traceback, exit 1, and no JSON)
    path = study_file({"model": {"name": "mlp", "hidden_size": 8}, "validation": {"scheme": "walk_forward",
                                                                                   "folds": 2}}, replace=("model",))
    sets = ["train.epochs=100000", "train.max_minutes=0.01", "train.max_stack=1", "train.patience=100000"]
    result = CliRunner().invoke(main, ["train", str(path), *[a for s in sets for a in ("--set", s)], "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "test:  ic -  rank_ic -  icir -" in result.output and "oracle IC" not in result.output
    metrics = json.loads(result.output[result.output.index("{"):])
    assert (metrics["value"], metrics["cut_short"], "test_ic" in metrics) == (None, "time", False)


def test_train_under_walk_forward_prints_no_valid_oracle(study_file):
    """A fold's valid block has no oracle figure (NaN): the line said `valid nan`; it says `-`, as every
    other figure that is not there, and keeps the test oracle and the fraction reached."""
    path = study_file({"validation": {"scheme": "walk_forward", "folds": 2}, "train": {"epochs": 1}})
    result = CliRunner().invoke(main, ["train", str(path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("oracle IC:"))
    assert line.startswith("oracle IC: valid -  test 0.") and "nan" not in line and "(test reached " in line


def test_train_whose_loss_diverges_says_so_in_one_line(study_file):
    # a learning rate of 1e38: a 50-line traceback ending in NonFiniteLoss before
    path = study_file({"model": {"name": "mlp", "hidden_size": 8}}, replace=("model",))
    result = CliRunner().invoke(main, ["train", str(path), "--set", "train.epochs=2", "--set", "train.lr=1e38",
                                       "--set", "train.batch_size=32", "--set", "train.samples_per_epoch=1024"],
                                catch_exceptions=False)
    assert result.exit_code == 1, result.output
    assert result.output.splitlines()[-1].startswith("Error: loss or gradients non-finite for ")
    assert "Traceback" not in result.output
