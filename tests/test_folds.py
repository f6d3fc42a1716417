"""The walk-forward fold layout (sweeper.data.folds): purged, forward in time, clear of the
test split, the same for every trial; and each fold's normalisation fitted on its own train
window."""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from click.testing import CliRunner, Result

from sweeper import config as C
from sweeper.cli import main
from sweeper.data import load_panel
from sweeper.data.folds import MIN_TRAIN_DATES, MIN_VALID_DATES, Fold, fold_layout, fold_panel, fold_spans
from sweeper.data.normalize import MAD_TO_STD, ROBUST_EPS
from sweeper.data.split import purge_gap, split_widths
from sweeper.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def default_study(**validation) -> C.SweeperConfig:
    """The README's main job (studies/transformer_ic.yaml) with a validation section."""
    raw = yaml.safe_load((ROOT / "studies" / "transformer_ic.yaml").read_text())
    raw["validation"] = {"scheme": "walk_forward", **validation}
    return C.validate_config(raw, "transformer_ic.yaml")


@pytest.fixture(scope="module")
def default_panel():
    return load_panel(default_study().data)


@pytest.mark.parametrize("window", ["expanding", "rolling"])
def test_every_fold_obeys_the_purge_and_never_touches_the_test_split(default_panel, window):
    cfg = default_study(folds=4, window=window)
    panel = default_panel
    folds = fold_layout(panel, cfg)
    lookback, horizon, embargo = split_widths(cfg.data)
    test_start = panel.splits["test"][0]
    assert len(folds) == 4
    for fold in folds:
        train, valid = np.arange(*fold.train), np.arange(*fold.valid)
        assert len(train) >= MIN_TRAIN_DATES and len(valid) >= MIN_VALID_DATES
        assert train.min() >= lookback - 1  # a full input window behind every target
        # every pair, not just the bounds: t + horizon + embargo < u
        assert (train[:, None] + horizon + embargo < valid[None, :]).all()
        # no fold touches a test date, and its block ends before the test split's purge
        assert valid.max() + horizon + embargo < test_start
        assert train.max() < test_start
    # the blocks march forward, back to back, and the last one ends where the test purge begins
    assert [f.valid[0] for f in folds] == sorted(f.valid[0] for f in folds)
    assert all(a.valid[1] == b.valid[0] for a, b in itertools.pairwise(folds))
    assert folds[-1].valid[1] == test_start - purge_gap(horizon, embargo)


def test_the_default_layouts_exactly(default_panel):
    # 1000 dates: targets 19..605 train, 607..803 valid, 805.. test (tests/test_data_split.py);
    # the region 19..803 (784 targets) less one purge of 2, in 5 parts: blocks of 156
    expanding = fold_layout(default_panel, default_study())
    assert expanding == [Fold(0, (19, 177), (179, 335)), Fold(1, (19, 333), (335, 491)),
                         Fold(2, (19, 489), (491, 647)), Fold(3, (19, 645), (647, 803))]
    rolling = fold_layout(default_panel, default_study(window="rolling"))
    assert [f.train for f in rolling] == [(19, 177), (175, 333), (331, 489), (487, 645)]  # 158 dates each
    assert [f.valid for f in rolling] == [f.valid for f in expanding]
    short = fold_layout(default_panel, default_study(window="rolling", train_dates=50, valid_dates=40))
    assert [f.train for f in short] == [(591, 641), (631, 681), (671, 721), (711, 761)]
    assert [f.valid for f in short] == [(643, 683), (683, 723), (723, 763), (763, 803)]
    assert fold_spans(default_panel, expanding)[0] == {"train": ["2010-01-29", "2010-09-07"],
                                                       "valid": ["2010-09-10", "2011-04-15"]}


def test_holdout_is_one_fold_the_panels_own_split(default_panel):
    cfg = default_study()
    cfg = cfg.model_copy(update={"validation": C.ValidationConfig()})
    assert fold_layout(default_panel, cfg) == [Fold(0, (19, 605), (607, 803))]
    assert fold_panel(default_panel, fold_layout(default_panel, cfg)[0], cfg.data) is default_panel


def test_a_cross_sectional_fold_shares_the_panels_arrays(default_panel):
    cfg = default_study()
    fold = fold_layout(default_panel, cfg)[1]
    panel = fold_panel(default_panel, fold, cfg.data)
    assert panel.splits == {"train": (19, 333), "valid": (335, 491), "test": default_panel.splits["test"]}
    assert panel.X.data_ptr() == default_panel.X.data_ptr()
    assert panel.sample_index("valid")[:, 0].min() == 335


def scaled_panel_file(path: Path, n_dates: int = 240, n_assets: int = 8) -> np.ndarray:
    """One feature whose scale doubles at date 100, about halfway through the dates before the test split."""
    rng = np.random.default_rng(3)
    values = rng.standard_normal((n_dates, n_assets))
    values[100:] *= 2.0
    dates = pd.bdate_range("2021-01-04", periods=n_dates)
    pd.DataFrame({
        "date": np.repeat(dates.to_numpy(), n_assets),
        "asset": np.tile([f"A{k}" for k in range(n_assets)], n_dates),
        "f": values.reshape(-1), "label": rng.standard_normal(n_dates * n_assets) * 0.01,
    }).to_parquet(path, index=False)
    return values


def test_robust_zscore_is_fitted_on_each_folds_train_window(tmp_path):
    values = scaled_panel_file(tmp_path / "p.parquet")
    cfg = C.validate_config({"data": {"path": str(tmp_path / "p.parquet"), "lookback": 4, "horizon": 2,
                                      "embargo": 1, "feature_norm": "robust_zscore", "cache": False},
                             "validation": {"scheme": "walk_forward", "folds": 4, "window": "rolling"}}, "x")
    panel = load_panel(cfg.data)
    folds = fold_layout(panel, cfg)
    first, last = (fold_panel(panel, folds[k], cfg.data) for k in (0, 3))
    for fold, fp in ((folds[0], first), (folds[3], last)):
        start, stop = fold.train
        seen = values[start - 3:stop].reshape(-1)  # the dates that fold's train windows can see
        median = np.median(seen)
        scale = (np.median(np.abs(seen - median)) + ROBUST_EPS) * MAD_TO_STD
        assert fp.norm_stats is not None
        assert fp.norm_stats["median"] == [pytest.approx(median, rel=1e-5)]
        assert fp.norm_stats["scale"] == [pytest.approx(scale, rel=1e-5)]
        np.testing.assert_allclose(fp.X[:, :, 0].numpy(), np.clip((values - median) / scale, -3, 3),
                                   rtol=1e-5, atol=1e-5)
    # fold 1's windows see only dates before the change, fold 4's only dates after it: twice the scale
    assert folds[0].train[1] < 100 <= folds[3].train[0] - 3
    assert 1.6 < last.norm_stats["scale"][0] / first.norm_stats["scale"][0] < 2.5


def test_a_layout_that_cannot_fit_names_the_keys(default_panel):
    # 60 blocks of 13 from target 803 back leave 803 - 780 - 2 - 19 = 2 train dates for the first fold
    with pytest.raises(ConfigError, match=r"^validation\.folds: 60 walk-forward folds \(validation\."
                                          r"valid_dates 13\) in the 784 target dates .* give a first train "
                                          r"window of 2 target dates"):
        fold_layout(default_panel, default_study(folds=60, valid_dates=13))
    with pytest.raises(ConfigError, match=r"valid blocks of 5 target dates; each needs at least 10: set fewer "
                                          r"validation\.folds, or give"):
        fold_layout(default_panel, default_study(folds=150))
    # it said "set fewer validation.folds or a smaller validation.valid_dates": neither helps
    with pytest.raises(ConfigError, match=r"valid blocks of 5 target dates; each needs at least 10: set "
                                          r"validation\.valid_dates to at least 10, or give"):
        fold_layout(default_panel, default_study(folds=3, valid_dates=5))
    # at 2 folds, walk-forward's least, "set fewer validation.folds" was offered all the same
    for dates, said in ((40, r"give valid blocks of \d+ target dates; each needs at least 10: give the train"),
                        (70, r"each needs at least 20 \(the larger of 20 and data\.lookback\): set a smaller "
                             r"validation\.valid_dates, or give the train")):
        small = C.with_overrides(default_study(folds=2), {"data.synthetic.dates": dates, "data.lookback": 5}, "s")
        with pytest.raises(ConfigError, match=said):
            fold_layout(load_panel(small.data), small)
    with pytest.raises(ConfigError, match=r"^validation\.train_dates: 12 target dates is too short a rolling "
                                          r"window; it needs at least 20"):
        fold_layout(default_panel, default_study(window="rolling", train_dates=12))
    # longer than the first fold can have: its window was cut to what there was, so the folds' lengths
    # differed (an expanding layout in all but name)
    first = fold_layout(default_panel, default_study(window="rolling"))[0].train
    most = first[1] - first[0]
    folds = fold_layout(default_panel, default_study(window="rolling", train_dates=most))
    assert {f.train[1] - f.train[0] for f in folds} == {most}
    with pytest.raises(ConfigError, match=rf"^validation\.train_dates: {most + 1} target dates is too long a "
                                          rf"rolling window; the first fold has {most} before its purge: set at "
                                          r"most that, or fewer validation\.folds$"):
        fold_layout(default_panel, default_study(window="rolling", train_dates=most + 1))


def test_validate_prints_the_folds_and_refuses_a_layout_that_cannot_fit(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    study = tmp_path / "wf.yaml"
    study.write_text(yaml.safe_dump({
        "data": {"synthetic": {"assets": 20, "dates": 200, "features": 3}, "lookback": 5},
        "validation": {"scheme": "walk_forward", "folds": 3}, "devices": {"gpus": "none"}}))

    def validate(*sets: str) -> Result:
        args = [x for s in sets for x in ("--set", s)]
        return CliRunner().invoke(main, ["validate", str(study), *args], catch_exceptions=False)

    ok = validate()
    assert ok.exit_code == 0, ok.output
    lines = [line.strip() for line in ok.output.splitlines() if line.strip().startswith(("fold", "test:"))]
    assert [line.split(":")[0] for line in lines] == ["fold 1", "fold 2", "fold 3", "test"]
    assert ("  runs: 3 per trial, in stacks of a size measured on the device at the study's first trial "
            "(train.max_stack: auto, at most 3): model transformer: stacked natively") in ok.output
    assert "  runs: 3 per trial, in stacks of up to 3: model transformer: stacked natively" in \
        validate("train.max_stack=3").output
    assert "  runs: 3 per trial, in stacks of up to 1: one run after another (train.max_stack: 1)" in \
        validate("train.max_stack=1").output
    assert not (tmp_path / "runs").exists()  # validate writes nothing
    bad = validate("validation.folds=30")
    assert bad.exit_code == 2
    assert bad.output.startswith("Error: ") and "validation.folds: 30 walk-forward folds" in bad.output
    assert "Traceback" not in bad.output and not (tmp_path / "runs").exists()
