"""Issue 28: every trial stores its model's predictions on valid and test, exactly the frames
``sweeper predict`` computes from its weights, and ``sweeper best`` reads them instead of
running the models (and falls back to running them for a trial without them)."""
from __future__ import annotations

import json

import optuna
import pandas as pd
import pytest

from conftest import TINY, merge, sweeper_cli, swept_study

STUDY = merge(TINY, {"study": {"n_trials": 3, "pruner": {"name": "none"}}, "train": {"epochs": 1},
                     "devices": {"cpu_workers": 1}})


pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    return swept_study(tmp_path_factory.mktemp("stored"), STUDY)


def _best(root) -> dict:
    return json.loads(sweeper_cli(root, "best", "study.yaml", "--json").stdout)


def _study(root):
    from sweeper.config import load_config
    from sweeper.store.layout import run_dir

    cfg = load_config(root / "study.yaml")
    folder = root / run_dir(cfg)
    return cfg, folder, optuna.load_study(study_name=cfg.study.name, storage=f"sqlite:///{folder / 'study.db'}")


def test_a_trial_stores_exactly_the_frames_predict_computes(swept, monkeypatch):
    from sweeper.inspect.frames import TrialFrames
    from sweeper.inspect.trial_model import Predictor

    monkeypatch.chdir(swept)
    cfg, folder, study = _study(swept)
    predictor, frames = Predictor(cfg, study), TrialFrames(cfg, study)
    for trial in study.get_trials():
        for split in ("valid", "test"):
            assert (folder / "trials" / str(trial.number) / f"predictions_{split}.parquet").is_file()
            stored = frames.frame(trial, split)
            pd.testing.assert_frame_equal(stored, predictor.frame(trial, split), check_exact=True)
            assert stored["label"].isna().any() == (split == "test")  # the last dates' labels are unknown
    assert frames.predicted == []  # nothing was predicted: every frame was read


def test_best_reads_them_and_its_figures_equal_the_model_run_again(swept):
    _cfg, folder, _study_ = _study(swept)
    stored = _best(swept)
    assert stored["ensemble"] is not None and stored["portfolio"] is not None
    hidden = []
    for path in sorted(folder.glob("trials/*/predictions_*.parquet")):
        hidden.append((path, path.with_suffix(".hidden")))
        path.rename(hidden[-1][1])
    try:
        rerun = _best(swept)  # an older study's trials: the models run on the data again
    finally:
        for path, away in hidden:
            away.rename(path)
    assert len(hidden) == 6
    for key in ("portfolio", "constant_pred_dates", "ensemble"):
        assert stored[key] == rerun[key], key
    assert stored == rerun


ENSEMBLE = merge(STUDY, {"study": {"n_trials": 1}, "validation": {"repeats": 2, "aggregate": "ensemble"}})


def test_a_seed_ensembles_stored_frames_are_the_mean_of_its_seeds_and_predict_computes_them(
        tmp_path_factory, monkeypatch):
    """validation.repeats 2: the trial's model is the mean of its two seeds' predictions; what it
    stores is exactly what ``predict`` computes from its two weights files, and its test_ic is
    that ensemble's (each seed's own in seed_test_ic)."""
    from sweeper.inspect.trial_model import Predictor
    from sweeper.quant import ic as M

    root = swept_study(tmp_path_factory.mktemp("ensemble"), ENSEMBLE)
    monkeypatch.chdir(root)
    cfg, folder, study = _study(root)
    (trial,) = study.get_trials()
    here = folder / "trials" / str(trial.number)
    assert sorted(p.name for p in here.glob("weights*.pt")) == ["weights.pt", "weights.seed-2.pt"]
    predictor = Predictor(cfg, study)
    for split in ("valid", "test"):
        stored = pd.read_parquet(here / f"predictions_{split}.parquet")
        pd.testing.assert_frame_equal(stored, predictor.frame(trial, split), check_exact=True)
        seeds = [pd.read_parquet(here / f"runs/fold-1.seed-{r}/predictions_{split}.parquet") for r in (1, 2)]
        assert stored["pred"].tolist() == pytest.approx(
            ((seeds[0]["pred"].to_numpy() + seeds[1]["pred"].to_numpy()) / 2).tolist(), abs=1e-7)
    ua = trial.user_attrs
    assert ua["test_ic"] == pytest.approx(M.ic_report(pd.read_parquet(here / "predictions_test.parquet"))["ic"],
                                          abs=1e-12)
    # aggregate: ensemble: the value is the stored valid file's IC (one source: the seeds' model frames)
    assert trial.value == pytest.approx(M.ic_report(pd.read_parquet(here / "predictions_valid.parquet"))["ic"],
                                        abs=1e-12)
    assert len(ua["seed_test_ic"]) == 2 and ua["test_ic"] not in ua["seed_test_ic"]
    best = _best(root)
    assert best["metrics"]["test_ic"] == pytest.approx(ua["test_ic"], abs=1e-12)
    assert best["test_model"]["members"] == 2
