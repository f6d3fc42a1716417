"""Issue 12 from the outside, on one real sweep (the CLI's commands, in this process): the
long-short view and the top-3 ensemble of `sweeper best`, `predict --trial top3`, trials of
different lookbacks scored on the same dates, scoring new dates with the trial's own
normalisation, and the report's new sections."""
from __future__ import annotations

import json

import numpy as np
import optuna
import pandas as pd
import pytest
import yaml
from optuna.trial import TrialState

from conftest import TINY, merge, sweeper_cli
from sweeper.quant.ensemble import ensemble
from sweeper.quant.ic import ic_report
from test_portfolio import reference_long_short

pytestmark = pytest.mark.slow  # every test here starts a real process

SWEEP = merge(TINY, {
    "study": {"name": "views", "n_trials": 4, "sampler": {"name": "random", "seed": 3}},
    "data": {"feature_norm": "robust_zscore"},
    "train": {"epochs": 2},
    "search_space": {"data.lookback": {"type": "categorical", "choices": [10, 20]},
                     "train.lr": {"type": "float", "low": 1e-3, "high": 1e-2, "log": True}},
})
Q, H = 5, 2  # report.quantiles and data.horizon of SWEEP (their defaults)


@pytest.fixture(scope="module")
def views(tmp_path_factory):
    root = tmp_path_factory.mktemp("views")
    (root / "study.yaml").write_text(yaml.safe_dump(SWEEP))
    sweeper_cli(root, "run", "study.yaml")  # in process: the sweep is not what is tested here
    from sweeper.store import open_storage

    study = optuna.load_study(study_name="views", storage=open_storage(f"sqlite:///{root}/runs/views/study.db"))
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE] * 4
    best = json.loads(sweeper_cli(root, "best", "study.yaml", "--json").stdout)
    return {"root": root, "study": study, "best": best}


def predicted(views, *args: str) -> pd.DataFrame:
    """`sweeper predict`, the checks of the issue from the outside (in this process: a process's
    start-up adds nothing to what the frames are checked for)."""
    name = "p-" + "-".join(a.strip("-") for a in args) + ".parquet"
    sweeper_cli(views["root"], "predict", "study.yaml", *args, "-o", name)
    return pd.read_parquet(views["root"] / name)


def cli(views, *args: str) -> str:
    """The same CLI in this process (no interpreter and torch start-up per call): its output."""
    return sweeper_cli(views["root"], *args).output


def test_best_portfolio_is_the_definition_on_the_predict_output(views):
    portfolio = views["best"]["portfolio"]
    for split in ("valid", "test"):
        args = ("--trial", "best", "--split", split)
        frame = predicted(views, *args)
        # in float64, as sweeper computes it: float32 sums of the float32 labels drift by ~1e-6
        want = reference_long_short(frame.astype({"pred": "float64", "label": "float64"}), H, Q)
        got = portfolio[split]
        assert got["n_periods"] == want["n_periods"] > 5
        for key in ("long_short_ann_return", "long_short_sharpe", "long_short_max_drawdown", "top_turnover"):
            assert got[key] == pytest.approx(want[key], rel=1e-6), (split, key)
        assert got["bucket_mean_label"] == pytest.approx(want["bucket_mean_label"], rel=1e-6)
    text = cli(views, "best", "study.yaml")
    assert "long-short, q=5 buckets, dates 2 apart (gross: equal weights, no costs)" in text
    ann = portfolio["test"]["long_short_ann_return"]
    assert f"test:  ann. return {ann:.1%}" in text
    assert views["best"]["constant_pred_dates"] == {"valid": 0, "test": 0}


def test_top3_ensemble_predicts_and_is_reported_beside_the_best(views):
    study, best = views["study"], views["best"]
    top = sorted(study.get_trials(), key=lambda t: -t.value)[:3]
    frame = predicted(views, "--trial", "top3")
    assert frame.columns.tolist() == ["date", "asset", "pred", "label"]
    assert len(frame) > 0 and np.isfinite(frame["pred"]).all() and not frame.duplicated(["date", "asset"]).any()
    members = [predicted(views, "--trial", str(t.number)) for t in top]
    assert len(frame) == len(members[0])  # same valid rows for every member: the split is the study's
    np.testing.assert_allclose(frame["pred"], ensemble(members)["pred"], rtol=1e-6, atol=1e-9)
    ens = best["ensemble"]
    assert ens["k"] == 3 and ens["trials"] == [t.number for t in top]
    assert ens["valid"]["ic"] == pytest.approx(ic_report(frame)["ic"], rel=1e-6)
    assert ens["portfolio"]["valid"]["n_periods"] == reference_long_short(frame, H, Q)["n_periods"]
    assert "top3 ensemble (trials " in cli(views, "best", "study.yaml")


def test_lookback_10_and_20_trials_predict_the_same_valid_dates(views):
    study = views["study"]
    by_lookback = {t.params["data.lookback"]: t.number for t in study.get_trials()}
    assert set(by_lookback) == {10, 20}
    frames = {lb: predicted(views, "--trial", str(n), "--split", "valid") for lb, n in by_lookback.items()}
    assert set(frames[10]["date"]) == set(frames[20]["date"])
    assert frames[10][["date", "asset"]].equals(frames[20][["date", "asset"]])
    first, last = study.user_attrs["split_dates"]["valid"]
    assert str(frames[10]["date"].min())[:10] == first and str(frames[10]["date"].max())[:10] == last
    assert study.user_attrs["split_widths"] == {"lookback": 20, "horizon": 2, "embargo": 0}
    for lb, n in by_lookback.items():  # and each is the trial's stored val_ic
        assert ic_report(frames[lb])["ic"] == pytest.approx(study.trials[n].user_attrs["val_ic"], abs=1e-6)


def new_file(views) -> pd.Timestamp:
    """new.parquet: the last 30 dates of the study's data plus lookback-1 dates of history
    before them, without a label column; returns the first date to score."""
    from sweeper.data import synthetic_frame

    lookback = views["study"].trials[views["best"]["trial"]].params["data.lookback"]
    frame, _ = synthetic_frame(**SWEEP["data"]["synthetic"])
    days = sorted(frame["date"].unique())
    new = frame[frame["date"] >= days[-30 - (lookback - 1)]]
    new.drop(columns=["label"]).to_parquet(views["root"] / "new.parquet", index=False)
    return days[-30]


def test_new_dates_are_scored_with_the_trials_statistics(views):
    """A file holding only lookback-1 dates of history before the dates to score and no
    label column: its predictions equal those on the study's own data, so robust_zscore
    used the trial's train statistics (a fit on these 30-odd dates would differ)."""
    import torch

    from sweeper.data import load_panel
    from sweeper.data.normalize import fit_stats
    from sweeper.inspect.trial_model import trial_config
    from sweeper.store.layout import trial_files

    root = views["root"]
    best = views["best"]["trial"]
    start = new_file(views)
    out = cli(views, "predict", "study.yaml", "--data", "new.parquet", "--start", str(start)[:10],
              "-o", "new_preds.parquet")
    saved = (root / "runs/views/trials" / str(best) / "norm_stats.json").exists()
    assert ("re-fitted on the study's train split" in out) != saved  # only a trial without the file
    scored = pd.read_parquet(root / "new_preds.parquet")
    assert scored["date"].min() == start and scored["label"].isna().all()
    stored = predicted(views, "--trial", "best", "--split", "all", "--start", str(start)[:10])
    merged = scored.merge(stored, on=["date", "asset"], suffixes=("", "_study"))
    assert len(merged) == len(scored) == len(stored)
    np.testing.assert_allclose(merged["pred"], merged["pred_study"], rtol=1e-6, atol=1e-6)
    # the check can fail: fitted on the new file itself, the statistics are different
    train_median = load_panel(trial_config(trial_files(root / "runs/views", best)).data).norm_stats["median"]
    new = pd.read_parquet(root / "new.parquet")[["f00", "f01", "f02"]].to_numpy(np.float32)
    own = fit_stats(torch.from_numpy(new[None]), torch.ones(1, len(new), dtype=torch.bool), "robust_zscore",
                    (0, 1), [])
    own_median = np.array(own["median"])
    assert np.abs(own_median - np.array(train_median)).max() > 0.05


def test_report_has_the_long_short_sections(views):
    from test_report import arr, figures_of

    root = views["root"]
    cli(views, "report", "study.yaml", "-o", "report.html")
    figures = figures_of((root / "report.html").read_text())
    assert list(figures)[8:] == ["buckets", "longshort", "ic_time", "baseline"]
    meta = figures["buckets"]["layout"]["meta"]
    for split in ("valid", "test"):
        want = views["best"]["portfolio"][split]
        assert set(meta[split]) == set(want)
        for key, value in want.items():  # (pytest.approx takes no nested lists in a dict)
            assert meta[split][key] == pytest.approx(value, rel=1e-9), (split, key)
        bars = next(t for t in figures["buckets"]["data"] if t["name"] == split)
        assert arr(bars["y"]) == pytest.approx(meta[split]["bucket_mean_label"])
    line = next(t for t in figures["longshort"]["data"] if t["name"] == "test")
    assert len(arr(line["y"])) == views["best"]["portfolio"]["test"]["n_periods"]


def test_saved_statistics_are_used_instead_of_a_refit(views, monkeypatch):
    """With trials/<n>/norm_stats.json present, --data uses it: the right statistics give the
    same predictions with no note; altered ones change them (so they were really read)."""
    from sweeper.config import load_config
    from sweeper.data import load_panel
    from sweeper.inspect.predict import predict_trial
    from sweeper.inspect.trial_model import trial_config
    from sweeper.store.layout import trial_files

    root, study = views["root"], views["study"]
    monkeypatch.chdir(root)
    cfg = load_config("study.yaml")
    files = trial_files(root / "runs/views", views["best"]["trial"])
    stats = load_panel(trial_config(files).data).norm_stats
    assert stats["method"] == "robust_zscore" and len(stats["median"]) == 3
    new_file(views)
    kept = files.norm_stats.read_text() if files.norm_stats.exists() else None  # a runner that saves it
    try:
        files.norm_stats.write_text(json.dumps(stats))
        right = predict_trial(cfg, study, data="new.parquet", split="all")
        assert right.notes == []
        files.norm_stats.write_text(json.dumps({**stats, "median": [m + 1.0 for m in stats["median"]]}))
        wrong = predict_trial(cfg, study, data="new.parquet", split="all")
        files.norm_stats.unlink()
        refit = predict_trial(cfg, study, data="new.parquet", split="all")
        assert refit.notes and "re-fitted" in refit.notes[0]
    finally:
        if kept is not None:
            files.norm_stats.write_text(kept)
    np.testing.assert_allclose(right.frame["pred"], refit.frame["pred"], rtol=1e-6, atol=1e-6)
    assert not np.allclose(wrong.frame["pred"], refit.frame["pred"], atol=1e-3)


def test_predict_refuses_what_it_cannot_do(views, monkeypatch):
    from click.testing import CliRunner

    from sweeper.cli import main

    monkeypatch.chdir(views["root"])

    def refused(*args: str) -> str:
        result = CliRunner().invoke(main, ["predict", "study.yaml", *args, "-o", "x.parquet"])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        return result.output

    assert "has 4 completed trials; top9 needs 9" in refused("--trial", "top9")
    assert "expected a trial number, 'best' or 'topK'" in refused("--trial", "first")
    assert "no rows to predict in the all split between 2031-01-01 and the end" in refused("--start", "2031-01-01")
    assert "cannot parse the date 'soon'" in refused("--end", "soon")
    assert not (views["root"] / "x.parquet").exists()
