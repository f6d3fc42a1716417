"""The LightGBM baseline (docs/baseline.md): ``sweeper baseline`` on a real study, its saved
predictions re-scored, its train rows against the study's, and ``best``/``status`` beside it."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import optuna
import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from conftest import TESTS, TINY, merge
from sweeper.baseline import features as BF
from sweeper.baseline import job
from sweeper.baseline.fit import QLIB_ALPHA158, fit, lgb_params
from sweeper.baseline.state import claim
from sweeper.cli import main
from sweeper.config import BaselineConfig, load_config
from sweeper.data import Batcher, load_panel, synth
from sweeper.errors import DiskFull
from sweeper.quant import ic as M
from sweeper.quant.hac import hac_standard_error
from sweeper.store import layout
from sweeper.store.identity import Identity
from sweeper.store.locks import NullLock

# the default synthetic panel (300 assets x 1000 dates x 16 features), one short trial
DEFAULT = merge(TINY, {"study": {"name": "base", "n_trials": 1},
                       "data": {"synthetic": {"assets": 300, "dates": 1000, "features": 16, "seed": 0}},
                       "train": {"epochs": 1, "samples_per_epoch": 2048},
                       "devices": {"cpu_workers": 1}, "report": {"baseline": None}})
DEFAULT["model"] = {"name": "mlp", "hidden_size": 8}


def _cli(*args, code=0):
    result = CliRunner().invoke(main, list(map(str, args)), catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result


@pytest.fixture(scope="module")
def default_study(tmp_path_factory):
    root = tmp_path_factory.mktemp("baseline")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
        path = root / "study.yaml"
        path.write_text(yaml.safe_dump(DEFAULT))
        _cli("run", path)
        out = json.loads(_cli("baseline", path, "--json").stdout)
        cfg = load_config(path)
        study = optuna.load_study(study_name="base", storage=cfg.study.resolved_storage)
        yield {"root": root, "path": path, "cfg": cfg, "out": out, "study": study,
               "files": layout.baseline_files(root / layout.run_dir(cfg))}


@pytest.mark.slow
def test_saved_predictions_rescore_to_the_stored_ic(default_study):
    attr, files = default_study["study"].user_attrs["baseline"], default_study["files"]
    assert default_study["study"].user_attrs["baseline_state"]["state"] == "done"
    for split, p in (("valid", "val"), ("test", "test")):
        frame = pd.read_parquet(files.predictions(split))
        assert list(frame.columns) == ["date", "asset", "pred", "label"]
        report = M.ic_report(frame)
        assert abs(report["ic"] - attr[f"{p}_ic"]) < 1e-6
        assert abs(report["rank_ic"] - attr[f"{p}_rank_ic"]) < 1e-6
        assert abs(report["icir"] - attr[f"{p}_icir"]) < 1e-6
        daily = pd.read_csv(files.daily_ic(split))
        assert daily["date"].tolist() == attr["daily"][split]["date"]
        np.testing.assert_allclose(daily["ic"], attr["daily"][split]["ic"], atol=1e-12)
        assert len(frame) == attr["rows"][split]
    out = default_study["out"]
    assert out["val_ic"] == attr["val_ic"] and out["test_ic"] == attr["test_ic"]
    assert out["lightgbm_version"] == attr["lightgbm_version"] and out["elapsed_s"] > 0
    assert out["subsampled"] is None and out["n_features"] == 16 and out["lags"] == 0
    assert out["constant_predictions"] == []
    assert 1 <= out["best_iteration"] <= 1000
    # the defaults are Qlib's Alpha158 configuration
    assert {k: out["params"][k] for k in QLIB_ALPHA158} == QLIB_ALPHA158
    assert QLIB_ALPHA158["learning_rate"] == 0.2 and QLIB_ALPHA158["num_leaves"] == 210


@pytest.mark.slow
def test_train_rows_are_exactly_the_study_train_rows(default_study):
    cfg, study = default_study["cfg"], default_study["study"]
    trained = pd.read_parquet(default_study["files"].train_rows)
    got = set(zip(pd.to_datetime(trained["date"]).dt.strftime("%Y-%m-%d"), trained["asset"]))
    assert len(got) == len(trained) == study.user_attrs["baseline"]["rows"]["train"]
    # independently: the raw synthetic rows on the study's stored train dates with a finite label
    s = cfg.data.synthetic
    raw = synth.generate(s.assets, s.dates, s.features, s.seed)
    first, last = study.user_attrs["split_dates"]["train"]
    days = pd.to_datetime(raw["date"]).dt.strftime("%Y-%m-%d")
    keep = (days >= first) & (days <= last) & np.isfinite(raw["label"].to_numpy())
    assert got == set(zip(days[keep], raw["asset"][keep]))
    # and the rows a trial's batcher trains on
    panel = load_panel(cfg.data)
    idx = Batcher(panel, "train", "cpu").index.numpy()
    trial_rows = {(str(np.datetime_as_string(panel.dates[t], unit="D")), panel.assets[i]) for t, i in idx}
    assert got == trial_rows


@pytest.mark.slow
def test_best_and_status_show_the_baseline(default_study):
    path, attr = default_study["path"], default_study["study"].user_attrs["baseline"]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(default_study["root"])
        best = json.loads(_cli("best", path, "--json").stdout)
        text = _cli("best", path).stdout
        status = _cli("status", path).stdout
        status_json = json.loads(_cli("status", path, "--json").stdout)
    base = best["baseline"]
    assert base["val_ic"] == attr["val_ic"] and base["test_ic"] == attr["test_ic"]
    assert base["val_ic_diff"] == pytest.approx(best["metrics"]["val_ic"] - attr["val_ic"], abs=1e-12)
    assert base["test_ic_diff"] == pytest.approx(best["metrics"]["test_ic"] - attr["test_ic"], abs=1e-12)
    # the t-statistic from the two daily IC files, on the dates both have (the synthetic label is 2-day)
    trial = pd.read_csv(default_study["root"] / layout.run_dir(default_study["cfg"]) / "trials"
                        / str(best["trial"]) / "daily_ic_test.csv")
    theirs = pd.read_csv(default_study["files"].daily_ic("test"))
    both = trial.merge(theirs, on="date", suffixes=("_t", "_b"))
    diff = (both["ic_t"] - both["ic_b"]).to_numpy()
    assert base["nw_lag"] == default_study["cfg"].data.horizon - 1
    assert base["test_shared_dates"] == len(both) > 150
    assert base["t_stat"] == pytest.approx(diff.mean() / hac_standard_error(diff, base["nw_lag"]), rel=1e-9)
    assert math.isfinite(base["val_t_stat"])
    assert "baseline LightGBM: valid ic" in text and "best - baseline: valid" in text
    assert "baseline: done" in status
    assert status_json["baseline_state"]["state"] == "done" and status_json["baseline_done"] is True


@pytest.mark.slow
def test_report_has_the_cumulative_figure(default_study):
    from sweeper.inspect.figures_ic import baseline_figure
    from sweeper.inspect.report import load

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(default_study["root"])
        data = load(default_study["study"], layout.run_dir(default_study["cfg"]), "val_ic")
        fig = baseline_figure(data)
    names = [t.name for t in fig.data]
    assert names == ["baseline (valid)", f"trial {data.best.number} (valid)", "baseline (test)",
                     f"trial {data.best.number} (test)"]
    attr = default_study["study"].user_attrs["baseline"]
    assert fig.data[2].y[-1] == pytest.approx(sum(attr["daily"]["test"]["ic"]), rel=1e-9)


def _tiny_panel(workdir):
    from sweeper.config import validate_config

    return load_panel(validate_config(TINY, "tiny").data)


def test_lags_add_exactly_the_earlier_dates_features(workdir):
    panel = _tiny_panel(workdir)
    plain, lagged = BF.design(panel, "valid", 0), BF.design(panel, "valid", 2)
    F = len(panel.features)
    assert plain.X.shape == (len(plain.t), F) and lagged.X.shape == (len(plain.t), 3 * F)
    assert lagged.names == [*panel.features, *(f"{f}@lag1" for f in panel.features),
                            *(f"{f}@lag2" for f in panel.features)]
    X = panel.X.numpy()
    np.testing.assert_array_equal(lagged.X[:, :F], plain.X)
    np.testing.assert_array_equal(lagged.X[:, 2 * F:], X[lagged.t - 2, lagged.i])
    result = fit(panel, BaselineConfig(lags=2), threads=1)
    assert result.n_features == 3 * F


def test_feature_names_with_json_characters_fit_and_the_booster_names_them_plainly(workdir):
    import dataclasses

    panel = _tiny_panel(workdir)
    odd = [f"ret[{k}]" if k % 2 else f'"{k}":{{a,b}}' for k in range(len(panel.features))]
    odd[2] = "ret_1_"  # ret[1] in LightGBM's characters: two names made one (it refused a name twice)
    result = fit(dataclasses.replace(panel, features=odd), BaselineConfig(), threads=1)
    assert "\nfeature_names=_0___a_b_ ret_1_@1 ret_1_@2\n" in result.model_text


@pytest.mark.slow
def test_a_panel_over_max_rows_is_subsampled_by_dates_and_says_so(study_file):
    path = study_file({"baseline": {"max_rows": 1000}})
    _cli("db", "init", path)
    result = _cli("baseline", path, "--json")
    out = json.loads(result.stdout)
    sub = out["subsampled"]
    assert "train rows subsampled by dates (baseline.max_rows)" in result.stderr
    assert sub["rows_kept"] == out["rows"]["train"] <= 1000 < sub["rows_total"]
    assert sub["dates_kept"] < sub["dates_total"]
    cfg = load_config(path)
    trained = pd.read_parquet(layout.baseline_files(layout.run_dir(cfg)).train_rows)
    # whole dates: every kept date has all the rows it has in the study's train split
    panel = load_panel(cfg.data)
    t, _ = BF.split_rows(panel, "train")
    per_date = pd.Series(panel.dates[t]).value_counts()
    kept = pd.to_datetime(trained["date"]).value_counts()
    assert (per_date[kept.index] == kept).all() and len(kept) == sub["dates_kept"]


def test_a_baseline_that_predicts_one_value_says_so_and_what_to_set(study_file):
    """On TINY's ~400 train rows Qlib's lambda_l1 (206) and lambda_l2 (581) leave every tree a leaf:
    an IC of 0 that is no model's, which sweeper baseline and best say, with the setting that fits."""
    path = study_file()
    _cli("db", "init", path)
    result = _cli("baseline", path, "--json")
    out = json.loads(result.stdout)
    assert out["constant_predictions"] == ["valid", "test"] and out["val_ic"] == out["test_ic"] == 0.0
    assert (f"baseline: LightGBM predicted one value on every date of valid and test, so its IC there is 0 "
            f"and no model's: no tree split its {out['rows']['train']} train rows.") in result.stderr
    assert "set baseline.params: {lambda_l1: 0, lambda_l2: 0}" in result.stderr
    study = optuna.load_study(study_name="tiny", storage=load_config(path).study.resolved_storage)
    assert study.user_attrs["baseline"]["constant_predictions"] == ["valid", "test"]
    from sweeper.inspect.printing import baseline_lines
    assert baseline_lines(study.user_attrs["baseline"])[-1] == \
        "  baseline: one value a date on valid and test (no tree split): no model IC"
    result = _cli("baseline", path, "--json", "--set", "baseline.params={lambda_l1: 0, lambda_l2: 0}")
    out = json.loads(result.stdout)
    assert out["constant_predictions"] == [] and out["val_ic"] != 0.0
    assert "predicted one value" not in result.stderr


@pytest.mark.slow
def test_claimed_once_and_a_failure_is_recorded(study_file):
    path = study_file({"baseline": {"params": {"objective": "no-such-objective"}}})
    _cli("db", "init", path)
    cfg = load_config(path)
    study = optuna.load_study(study_name=cfg.study.name, storage=cfg.study.resolved_storage)
    assert claim(study, NullLock(), Identity("h1", 1, "d1")) is True
    assert claim(study, NullLock(), Identity("h2", 1, "d2")) is False
    assert study.user_attrs["baseline_state"]["host"] == "h1"
    config = path.parent / "resolved.json"
    from sweeper.config import to_dict

    config.write_text(json.dumps(to_dict(cfg)))
    code = job.main(["--config", str(config), "--storage", cfg.study.resolved_storage,
                     "--run-dir", str(layout.run_dir(cfg)), "--host", "h1", "--driver", "d1"])
    assert code == 1
    state = study.user_attrs["baseline_state"]
    assert state["state"] == "failed" and "no-such-objective" in state["error"]
    assert "baseline" not in study.user_attrs
    assert "baseline: failed on h1: ConfigError: baseline.params {'objective': 'no-such-objective'}: LightGBM " \
           "refuses them (Unknown objective type name: no-such-objective)" in _cli("status", path).stdout
    # asked for by name: one line, exit 2 (a LightGBMError traceback, exit 1, before)
    assert _cli("baseline", path, code=2).output.splitlines()[-1] == (
        "Error: baseline.params {'objective': 'no-such-objective'}: LightGBM refuses them (Unknown objective "
        "type name: no-such-objective)")


def test_the_slot_threads_override_params_num_threads():
    assert lgb_params(BaselineConfig(params={"num_threads": 99, "max_depth": 3}), 2, 0)["num_threads"] == 2
    assert lgb_params(BaselineConfig(params={"max_depth": 3}), 2, 0)["max_depth"] == 3


def _sweep_counts(cfg):
    study = optuna.load_study(study_name=cfg.study.name, storage=cfg.study.resolved_storage)
    return study, sorted(t.state.name for t in study.get_trials())


@pytest.mark.slow
def test_a_sweep_computes_it_once_and_a_resume_does_not_again(study_file):
    path = study_file({"study": {"n_trials": 3}, "report": {"baseline": "lightgbm"}})  # the default
    _cli("run", path)
    cfg = load_config(path)
    study, states = _sweep_counts(cfg)
    assert states == ["COMPLETE"] * 3
    state, attr = study.user_attrs["baseline_state"], study.user_attrs["baseline"]
    assert state["state"] == "done" and attr["rows"]["train"] > 0
    log = layout.logs_dir(layout.run_dir(cfg)) / f"{state['host']}.baseline.log"
    assert log.read_text().count("baseline: val ic") == 1
    raw = yaml.safe_load(path.read_text())
    raw["study"]["n_trials"] = 4
    path.write_text(yaml.safe_dump(raw))
    _cli("resume", path)
    study, states = _sweep_counts(cfg)
    assert states == ["COMPLETE"] * 4
    assert study.user_attrs["baseline"]["finished"] == attr["finished"]  # not computed again
    assert study.user_attrs["baseline_state"] == state
    assert log.read_text().count("baseline: val ic") == 1


@pytest.mark.slow
def test_a_failing_baseline_never_ends_the_sweep(study_file):
    path = study_file({"study": {"n_trials": 3}, "report": {"baseline": "lightgbm"},
                       "baseline": {"params": {"objective": "no-such-objective"}}})
    said = [line for line in _cli("run", path).stderr.splitlines() if "baseline job" in line]
    assert len(said) == 1 and said[0].startswith(  # in the run's output: it said nothing before
        "sweeper: the baseline job exited with code 1; the sweep goes on without it (see runs/tiny/logs/")
    study, states = _sweep_counts(load_config(path))
    assert states == ["COMPLETE"] * 3
    state = study.user_attrs["baseline_state"]
    assert state["state"] == "failed" and "no-such-objective" in state["error"]
    assert "baseline" not in study.user_attrs


@pytest.mark.slow
def test_report_baseline_null_computes_none(study_file):
    path = study_file({"study": {"n_trials": 2}, "report": {"baseline": None}})
    _cli("run", path)
    study, states = _sweep_counts(load_config(path))
    assert states == ["COMPLETE"] * 2
    assert "baseline_state" not in study.user_attrs and "baseline" not in study.user_attrs
    assert not layout.baseline_files(layout.run_dir(load_config(path))).folder.exists()


def test_a_write_cut_short_leaves_no_half_written_file(tmp_path, monkeypatch):
    """A full disk left baseline/predictions_valid.parquet half written ("magic bytes not found")."""
    frame = pd.DataFrame({"date": pd.to_datetime(["2020-01-02"] * 2), "asset": ["a", "b"],
                          "pred": [0.1, 0.2], "label": [0.0, 1.0]})
    daily = pd.DataFrame({"date": ["2020-01-02"], "ic": [1.0], "rank_ic": [1.0]})
    result = job.BaselineResult(scores={}, predictions={"valid": frame}, daily={"valid": daily},
                                best_iteration=1, elapsed_s=0.0, lightgbm_version="", params={},
                                rows={}, n_features=1, model_text="tree")

    def cut_short(self, path, **kw):
        with open(path, "wb") as out:
            out.write(b"PAR1 half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", cut_short)
    with pytest.raises(DiskFull, match=r"^no space left on device writing .*/predictions_valid.parquet"):
        job.write_files(result, tmp_path)
    assert [p.name for p in (tmp_path / "baseline").iterdir()] == []
