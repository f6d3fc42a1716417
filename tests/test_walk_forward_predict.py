"""Scoring a walk-forward trial's model on the study's own dates: its train and valid are the
last fold's (the fold it trained on, with that fold's normalisation), never dates it trained on
called valid."""
from __future__ import annotations

import optuna
import pandas as pd
import pytest
from click.testing import CliRunner

from conftest import TINY, merge, swept_study
from sweeper.cli import main
from sweeper.quant.ic import ic_report
from sweeper.store import open_storage

STUDY = merge(TINY, {"study": {"n_trials": 2},
                     "data": {"feature_norm": "robust_zscore"},
                     "validation": {"scheme": "walk_forward", "folds": 3}})


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    return swept_study(tmp_path_factory.mktemp("wf_predict"), STUDY)


@pytest.mark.slow
def test_predict_valid_scores_the_last_folds_block_as_the_trial_did(swept, monkeypatch):
    monkeypatch.chdir(swept)
    study = optuna.load_study(study_name="tiny", storage=open_storage("sqlite:///runs/tiny/study.db"))
    best = study.best_trial
    last = study.user_attrs["fold_dates"][-1]
    result = CliRunner().invoke(main, ["predict", "study.yaml", "--split", "valid", "-o", "valid.parquet"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    frame = pd.read_parquet("valid.parquet")
    days = sorted({str(d)[:10] for d in frame["date"]})
    assert [days[0], days[-1]] == last["valid"]  # the last fold's block, not the holdout valid split
    # the model and that fold's robust_zscore statistics give back the fold's own score exactly
    assert ic_report(frame)["ic"] == pytest.approx(best.user_attrs["fold_val_ic"][-1], abs=1e-6)

    test = CliRunner().invoke(main, ["predict", "study.yaml", "--split", "test", "-o", "test.parquet"],
                              catch_exceptions=False)
    assert test.exit_code == 0, test.output
    scored = ic_report(pd.read_parquet("test.parquet"))["ic"]
    assert scored == pytest.approx(best.user_attrs["test_ic"], abs=1e-6)
