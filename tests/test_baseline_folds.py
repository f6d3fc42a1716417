"""The LightGBM baseline under walk_forward (docs/baseline.md, "Folds"): one booster per fold on
exactly that fold's train window, early-stopped on its valid block; fold_val_ic per fold, its
mean as val_ic, test IC from the last fold's booster; holdout studies as before."""
from __future__ import annotations

import json
import os

import lightgbm as lgb
import numpy as np
import optuna
import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from conftest import TESTS, TINY, merge
from sweeper.baseline import features as BF
from sweeper.baseline.compare import comparison
from sweeper.baseline.fit import fit
from sweeper.cli import main
from sweeper.config import load_config
from sweeper.data import load_panel, synth
from sweeper.data.folds import fold_layout, fold_panel
from sweeper.data.split import split_widths
from sweeper.quant import ic as M
from sweeper.store import layout

pytestmark = pytest.mark.slow  # every test here starts a real process

# a tree small enough to split on the tiny panel (Qlib's lambda_l1 of 205 leaves it one leaf, IC 0)
SMALL_TREE = {"params": {"lambda_l1": 0.0, "lambda_l2": 1.0, "num_leaves": 7, "min_data_in_leaf": 20,
                         "learning_rate": 0.05}, "early_stopping_rounds": 10}
FOLDS = merge(TINY, {"validation": {"scheme": "walk_forward", "folds": 3},
                     "data": {"feature_norm": "robust_zscore"}, "baseline": SMALL_TREE})


def _cli(*args, code=0):
    result = CliRunner().invoke(main, list(map(str, args)), catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result


def _computed(root, raw, name):
    """``sweeper baseline --json`` on a fresh study ``raw``, run in ``root``."""
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(merge(raw, {"study": {"name": name}})))
    _cli("db", "init", path)
    result = _cli("baseline", path, "--json")
    cfg = load_config(path)
    study = optuna.load_study(study_name=name, storage=cfg.study.resolved_storage)
    return {"path": path, "cfg": cfg, "study": study, "out": json.loads(result.stdout),
            "stderr": result.stderr, "attr": study.user_attrs["baseline"],
            "files": layout.baseline_files(layout.run_dir(cfg))}


@pytest.fixture(scope="module")
def wf(tmp_path_factory):
    root = tmp_path_factory.mktemp("baseline_folds")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.syspath_prepend(str(TESTS))
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
        run = _computed(root, FOLDS, "wf")
        panel = load_panel(run["cfg"].data)
        folds = fold_layout(panel, run["cfg"])
        yield {**run, "root": root, "panel": panel, "folds": folds}


def _days(dates) -> pd.Series:
    return pd.Series(pd.DatetimeIndex(np.asarray(dates)).strftime("%Y-%m-%d"))


def test_each_fold_trains_on_exactly_its_train_window_purged_from_its_valid_block(wf):
    cfg, panel, folds = wf["cfg"], wf["panel"], wf["folds"]
    assert len(folds) == 3 and wf["attr"]["fold_dates"] == wf["study"].user_attrs["fold_dates"]
    trained = pd.read_parquet(wf["files"].train_rows)
    assert sorted(trained["fold"].unique()) == [1, 2, 3]
    s = cfg.data.synthetic
    raw = synth.generate(s.assets, s.dates, s.features, s.seed)
    raw_days = _days(raw["date"])
    _, horizon, embargo = split_widths(cfg.data)
    for fold, dates in zip(folds, wf["attr"]["fold_dates"]):
        mine = trained[trained["fold"] == fold.index + 1]
        got = set(zip(_days(mine["date"]), mine["asset"]))
        assert len(got) == len(mine) == wf["attr"]["fold_rows"][fold.index]["train"]
        # independently: the raw rows on the fold's stored train dates with a finite label
        first, last = dates["train"]
        keep = (raw_days >= first) & (raw_days <= last) & np.isfinite(raw["label"].to_numpy())
        assert got == set(zip(raw_days[keep], raw["asset"][keep]))
        # and exactly the fold panel's train rows (what the fold's trial trains on)
        t, i = BF.split_rows(fold_panel(panel, fold, cfg.data), "train")
        assert got == set(zip(_days(panel.dates[t]), panel.assets[i]))
        # purged: every train target t and valid target u have t + horizon + embargo < u
        t_idx = np.searchsorted(panel.dates, pd.to_datetime(mine["date"]).to_numpy())
        assert t_idx.max() + horizon + embargo < fold.valid[0]
        assert t_idx.min() >= fold.train[0] and t_idx.max() < fold.train[1]
    # expanding: each fold's window holds the one before it
    sizes = [r["train"] for r in wf["attr"]["fold_rows"]]
    assert sizes[0] < sizes[1] < sizes[2]


def test_fold_val_ic_is_one_per_fold_and_val_ic_their_mean(wf):
    attr, files = wf["attr"], wf["files"]
    ics = attr["fold_val_ic"]
    assert attr["folds"] == 3 and len(ics) == 3 and len(attr["fold_best_iteration"]) == 3
    assert abs(attr["val_ic"] - float(np.mean(ics))) < 1e-12
    assert abs(attr["val_rank_ic"] - float(np.mean(attr["fold_val_rank_ic"]))) < 1e-12
    assert attr["worst_fold_val_ic"] == min(ics)
    assert attr["val_ic_se"] == pytest.approx(np.std(ics, ddof=1) / np.sqrt(3), rel=1e-12)
    assert len(set(ics)) == 3 and all(v != 0 for v in ics)  # three real fits, not one repeated
    # each fold's IC re-scores from its own valid block's predictions
    frame = pd.read_parquet(files.predictions("valid"))
    assert list(frame.columns) == ["date", "asset", "pred", "label", "fold"]
    for k, fold in enumerate(wf["folds"]):
        block = frame[frame["fold"] == k + 1]
        assert abs(M.ic_report(block)["ic"] - ics[k]) < 1e-9
        days = np.searchsorted(wf["panel"].dates, block["date"].unique())
        assert days.min() >= fold.valid[0] and days.max() < fold.valid[1]
    # the daily valid file: the folds' blocks in date order, fold 1-based, as a trial's
    daily = pd.read_csv(files.daily_ic("valid"))
    assert list(daily.columns) == ["date", "ic", "rank_ic", "fold"]
    assert daily["date"].is_monotonic_increasing and daily["date"].is_unique
    assert daily.groupby("fold")["date"].agg(["min", "max"]).values.tolist() == \
        [d["valid"] for d in attr["fold_dates"]]
    assert attr["daily"]["valid"]["fold"] == daily["fold"].tolist()
    assert attr["rows"]["valid"] == len(frame)
    assert attr["rows"]["train"] == sum(r["train"] for r in attr["fold_rows"])


def test_test_ic_is_the_last_fold_booster_scored_alone(wf):
    attr, cfg, panel, folds = wf["attr"], wf["cfg"], wf["panel"], wf["folds"]
    last = fold_panel(panel, folds[-1], cfg.data)
    rows = BF.design(last, "test", cfg.baseline.lags)
    booster = lgb.Booster(model_file=str(wf["files"].model))
    assert booster.current_iteration() >= attr["best_iteration"] == attr["fold_best_iteration"][-1]
    pred = booster.predict(rows.X, num_iteration=attr["best_iteration"])
    from sweeper.baseline.fit import frame_of

    scored = M.ic_report(frame_of(last, rows, pred))
    assert abs(scored["ic"] - attr["test_ic"]) < 1e-9 and abs(scored["rank_ic"] - attr["test_rank_ic"]) < 1e-9
    assert abs(M.ic_report(pd.read_parquet(wf["files"].predictions("test")))["ic"] - attr["test_ic"]) < 1e-9
    # the last fold's fit alone gives the same test IC; the first fold's booster another one
    alone = fit(last, cfg.baseline, threads=attr["threads"], seed=0)
    assert abs(alone.scores["test_ic"] - attr["test_ic"]) < 1e-9
    assert abs(alone.scores["val_ic"] - attr["fold_val_ic"][-1]) < 1e-9
    first = fit(fold_panel(panel, folds[0], cfg.data), cfg.baseline, threads=attr["threads"], seed=0)
    assert abs(first.scores["test_ic"] - attr["test_ic"]) > 1e-6


def test_max_rows_subsamples_each_fold_alone(wf):
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(wf["root"])
        run = _computed(wf["root"], merge(FOLDS, {"baseline": {"max_rows": 1000}}), "capped")
    attr = run["attr"]
    subs = attr["fold_subsampled"]
    # fold 1's window (667 rows) fits; folds 2 and 3 are cut to at most 1000 rows each
    assert subs[0] is None and subs[1] and subs[2]
    assert [r["train"] for r in attr["fold_rows"]] == [wf["attr"]["fold_rows"][0]["train"],
                                                       subs[1]["rows_kept"], subs[2]["rows_kept"]]
    assert all(r["train"] <= 1000 for r in attr["fold_rows"])
    assert attr["subsampled"]["folds"] == [2, 3]
    assert attr["subsampled"]["rows_kept"] == subs[1]["rows_kept"] + subs[2]["rows_kept"]
    assert "train rows subsampled by dates (baseline.max_rows) in folds 2, 3 (summed)" in run["stderr"]
    trained = pd.read_parquet(run["files"].train_rows)
    assert trained.groupby("fold").size().tolist() == [r["train"] for r in attr["fold_rows"]]


def test_the_comparison_runs_over_every_fold_block(wf):
    attr = wf["attr"]
    daily = attr["daily"]
    rng = np.random.default_rng(0)
    # a stand-in best trial scored on the same valid blocks and test dates
    best_daily = {}
    for split in ("valid", "test"):
        ic = np.asarray(daily[split]["ic"], dtype=np.float64)
        noisy = ic + 0.01 + rng.normal(0, 0.01, len(ic))
        best_daily[split] = (np.asarray(daily[split]["date"], dtype=object), noisy)
    best = {"val_ic": attr["val_ic"] + 0.01, "test_ic": attr["test_ic"],
            "fold_val_ic": [v + 0.02 for v in attr["fold_val_ic"]]}
    out = comparison(attr, best, best_daily, horizon=wf["cfg"].data.horizon)
    blocks = len(pd.read_csv(wf["files"].daily_ic("valid")))
    assert out["val_shared_dates"] == len(daily["valid"]["date"]) == blocks
    assert out["val_ic_diff"] == pytest.approx(0.01, abs=1e-12)
    assert out["fold_val_ic_diff"] == pytest.approx([0.02] * 3, abs=1e-12)
    assert out["fold_val_ic"] == attr["fold_val_ic"] and out["folds"] == 3
    assert out["val_t_stat"] > 2


def test_a_holdout_study_keeps_one_fit_and_no_fold_keys(wf):
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(wf["root"])
        run = _computed(wf["root"], merge(TINY, {"baseline": SMALL_TREE}), "hold")
    attr, files = run["attr"], run["files"]
    assert not [k for k in attr if k.startswith("fold") or k in ("folds", "val_ic_se", "worst_fold_val_ic")]
    assert list(pd.read_parquet(files.train_rows).columns) == ["date", "asset"]
    assert list(pd.read_csv(files.daily_ic("valid")).columns) == ["date", "ic", "rank_ic"]
    assert "fold" not in attr["daily"]["valid"]
    panel = load_panel(run["cfg"].data)
    alone = fit(panel, run["cfg"].baseline, threads=attr["threads"], seed=0)
    assert abs(alone.scores["val_ic"] - attr["val_ic"]) < 1e-9
    assert abs(alone.scores["test_ic"] - attr["test_ic"]) < 1e-9


def test_the_sweeps_job_subprocess_entry_fits_the_folds(wf, capsys):
    from sweeper.baseline import job
    from sweeper.config import to_dict

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(wf["root"])
        path = wf["root"] / "job.yaml"
        path.write_text(yaml.safe_dump(merge(FOLDS, {"study": {"name": "job"}})))
        _cli("db", "init", path)
        cfg = load_config(path)
        config = wf["root"] / "resolved.json"
        config.write_text(json.dumps(to_dict(cfg)))
        code = job.main(["--config", str(config), "--storage", cfg.study.resolved_storage, "--run-dir",
                         str(layout.run_dir(cfg)), "--threads", "1", "--host", "h", "--driver", "d"])
        study = optuna.load_study(study_name="job", storage=cfg.study.resolved_storage)
    assert code == 0
    assert "(val: the mean of 3 folds, one booster each; test: the last fold's)" in capsys.readouterr().out
    attr = study.user_attrs["baseline"]
    assert study.user_attrs["baseline_state"]["state"] == "done" and attr["threads"] == 1
    assert len(attr["fold_val_ic"]) == 3 and abs(attr["val_ic"] - float(np.mean(attr["fold_val_ic"]))) < 1e-12


def test_a_walk_forward_sweep_compares_the_best_trial_on_every_fold_block(study_file):
    path = study_file(merge(FOLDS, {"study": {"n_trials": 1}, "devices": {"cpu_workers": 1},
                                    "report": {"baseline": "lightgbm"}}))
    _cli("run", path)
    cfg = load_config(path)
    study = optuna.load_study(study_name=cfg.study.name, storage=cfg.study.resolved_storage)
    best, attr = study.best_trial, study.user_attrs["baseline"]
    base = json.loads(_cli("best", path, "--json").stdout)["baseline"]
    trial = pd.read_csv(layout.trial_files(layout.run_dir(cfg), best.number).daily_ic("valid"))
    mine = pd.read_csv(layout.baseline_files(layout.run_dir(cfg)).daily_ic("valid"))
    # the same valid dates, block by block, on both sides
    assert trial[["date", "fold"]].values.tolist() == mine[["date", "fold"]].values.tolist()
    assert base["val_shared_dates"] == len(mine) and sorted(mine["fold"].unique()) == [1, 2, 3]
    assert base["fold_val_ic_diff"] == pytest.approx(
        [a - b for a, b in zip(best.user_attrs["fold_val_ic"], attr["fold_val_ic"])], abs=1e-12)
    assert base["val_ic_diff"] == pytest.approx(best.user_attrs["val_ic"] - attr["val_ic"], abs=1e-12)
