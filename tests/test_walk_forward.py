"""Walk-forward folds and seed repeats (sweeper.validation): the runs, the scores, the attrs."""
from __future__ import annotations

import json
import math
import statistics
import time

import pandas as pd
import pytest

from sweeper import config as C
from sweeper.config import load_config
from sweeper.data.load import load_panel
from sweeper.store.layout import trial_files
from sweeper.validation import RunStore, Trainer, daily_valid, objective, train_runs, trial_attrs

WF = {"validation": {"scheme": "walk_forward", "folds": 3}}


def _outcome(path, tmp_path, **over):
    cfg = C.with_overrides(load_config(path), over, "test") if over else load_config(path)
    files = trial_files(tmp_path / "run", 0)
    files.folder.mkdir(parents=True)
    store = RunStore(files, {"study_uuid": None, "trial": 0, "fingerprint": "x"})
    return cfg, files, train_runs(load_panel(cfg.data), Trainer(cfg, _Hook(), time.monotonic(), store=store))


class _Hook:
    def __init__(self):
        self.steps = []
        self.offset = 0

    def begin_run(self, fold, repeat, offset):
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
    attrs = trial_attrs(out.runs, cfg, folds_run=out.folds_run, fold_dates=out.fold_dates,
                        predictions=out.predictions)
    for key in ("val_ic", "val_rank_ic"):
        per_fold = [statistics.mean(r.metrics[key] for r in out.runs if r.fold == f) for f in range(3)]
        assert attrs[f"fold_{key}"] == pytest.approx(per_fold, abs=1e-12)
        assert attrs[key] == pytest.approx(statistics.mean(per_fold), abs=1e-12)
        assert attrs[f"{key}_se"] == pytest.approx(statistics.stdev(per_fold) / math.sqrt(3), abs=1e-12)
        assert attrs[f"worst_fold_{key}"] == min(attrs[f"fold_{key}"])
    assert objective(out.runs, cfg) == attrs["val_rank_ic"]
    assert attrs["seed_val_ic_sd"] > 0 and len(attrs["fold_seed_ensemble_val_ic"]) == 3
    assert attrs["fold_dates"] == out.fold_dates and len(out.fold_dates) == 3
    assert attrs["folds_run"] == 3 and len(attrs["fold_best_epoch"]) == 3
    # each run's files, result.json last; a second pass finds them all finished and trains nothing
    for f in range(3):
        for r in range(2):
            result = json.loads((files.run(f + 1, r + 1) / "result.json").read_text())
            assert (result["fold"], result["repeat"], result["seed"]) == (f + 1, r + 1, r)
    assert (files.run(3, 1) / "weights.pt").exists() and not (files.run(2, 1) / "weights.pt").exists()
    again = train_runs(load_panel(cfg.data), Trainer(cfg, _Hook(), time.monotonic(),
                                                     store=RunStore(files, {})))
    assert again.model is None
    assert [r.metrics["val_ic"] for r in again.runs] == [r.metrics["val_ic"] for r in out.runs]
    # only the model (the last fold's first seed) is scored on test
    assert [r for r in out.runs if "test_ic" in r.metrics] == [out.runs[4]]
    daily = daily_valid(out.daily)
    assert list(daily.columns) == ["date", "ic", "rank_ic", "fold"]
    assert daily["date"].is_unique and daily["date"].is_monotonic_increasing
    assert sorted(daily["fold"].unique()) == [1, 2, 3]
    lcb = C.with_overrides(cfg, {"validation.aggregate": "lcb"}, "test")
    lower = attrs["val_rank_ic"] - attrs["val_rank_ic_se"]
    assert objective(out.runs, lcb) == pytest.approx(lower, abs=1e-12)
    pd.testing.assert_frame_equal(again.predictions[(2, 1)], out.predictions[(2, 1)], check_dtype=False)
