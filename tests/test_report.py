"""``sweeper report`` on a 500-trial study written straight into SQLite (no training):
every figure's plotly JSON, read back out of the HTML, holds the study's own numbers."""
from __future__ import annotations

import base64
import json
import math
import os
import re
import time
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
from click.testing import CliRunner
from optuna.trial import TrialState

import synthetic_study
from sweeper.cli import main
from sweeper.inspect.report import FIGURES
from sweeper.quant.selection import selection_summary
from sweeper.store import open_storage

N = 500


def figures_of(page: str) -> dict[str, dict]:
    """name -> plotly figure JSON, from the report's <script type="application/json"> tags."""
    found = re.findall(r'<script type="application/json" id="fig-(\w+)" class="fig">(.*?)</script>', page, re.S)
    return {name: json.loads(payload) for name, payload in found}


def arr(value) -> np.ndarray:
    """A plotly JSON array: a plain list, or a typed array ({dtype, bdata[, shape]})."""
    if isinstance(value, dict) and "bdata" in value:
        out = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        return out.reshape([int(k) for k in str(value["shape"]).split(",")]) if "shape" in value else out
    return np.asarray(value)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    study_file = synthetic_study.build(root, n=N, n_daily=60)
    run_dir = root / "runs" / "big"
    # two GPUs' telemetry, as the driver's Telemetry thread writes it (epoch seconds)
    t0 = time.time() - 60
    rows = [{"time": t0 + 5 * k, "index": g, "uuid": f"GPU-{g}", "util": 50 + g, "mem_used_mb": 1000 * (g + 1),
             "mem_total_mb": 80000, "n_procs": 1} for k in range(6) for g in (0, 1)]
    pd.DataFrame(rows).to_csv(run_dir / "devices.csv", index=False)
    out = root / "report.html"
    cwd = os.getcwd()
    os.chdir(root)  # the study's storage and run folder are relative, as a user's are
    try:
        started = time.perf_counter()
        result = CliRunner().invoke(main, ["report", study_file.name, "-o", str(out)], catch_exceptions=False)
        seconds = time.perf_counter() - started
    finally:
        os.chdir(cwd)
    assert result.exit_code == 0, result.output
    study = optuna.load_study(study_name="big", storage=open_storage(f"sqlite:///{run_dir / 'study.db'}", create=False))
    page = out.read_text()
    return {"root": root, "run_dir": run_dir, "study": study, "page": page, "figures": figures_of(page),
            "seconds": seconds, "output": result.output}


def complete(study):
    return [t for t in study.get_trials() if t.state == TrialState.COMPLETE]


def test_self_contained_with_every_figure(big):
    page = big["page"]
    assert list(big["figures"]) == [*FIGURES, "telemetry"]
    tags = re.findall(r"<(?:script|link|img)\b[^>]*>", page[:200] + page[page.index("</head>"):])
    assert not [t for t in tags if re.search(r"\b(src|href)=", t)]  # nothing fetched: works offline
    assert page.count('<script type="application/json"') == len(big["figures"])
    assert len(page) > 3_000_000 and "Plotly.newPlot" in page and "plotly.js v" in page[:100_000]
    assert f"{N + 1} trials" in big["output"] and f"{len(FIGURES) + 1} figures" in big["output"]  # + telemetry
    assert big["seconds"] < 60  # a sanity bound only; benchmarks/report.py measures it


def test_history_has_every_complete_trial(big):
    fig = big["figures"]["history"]
    done = complete(big["study"])
    points, best_line = fig["data"]
    assert len(done) == 420
    assert arr(points["x"]).tolist() == [t.number for t in done]
    assert np.allclose(arr(points["y"]), [t.value for t in done])
    assert np.allclose(arr(best_line["y"]), np.maximum.accumulate([t.value for t in done]))


def test_importances_are_pedanova_on_the_study(big):
    fig = big["figures"]["importance"]
    expected = optuna.importance.get_param_importances(
        big["study"], evaluator=optuna.importance.PedAnovaImportanceEvaluator())
    bar = fig["data"][0]
    assert list(bar["y"]) == list(expected)[::-1]
    assert np.allclose(arr(bar["x"]), list(expected.values())[::-1])
    assert set(bar["y"]) == set(synthetic_study.DISTRIBUTIONS)


def test_parallel_coordinates(big):
    fig = big["figures"]["parallel"]
    dims = fig["data"][0]["dimensions"]
    done = complete(big["study"])
    labels = [d["label"] for d in dims]
    assert labels == ["log10(train.lr)", "model.d_model", "model.num_layers", "model.dropout", "val_ic"]
    assert all(len(arr(d["values"])) == len(done) for d in dims)
    assert np.allclose(arr(dims[0]["values"]), [math.log10(t.params["train.lr"]) for t in done])
    assert dims[1]["ticktext"] == ["32", "64", "128"]
    assert np.allclose(arr(dims[-1]["values"]), [t.value for t in done])


def test_learning_curves_by_state(big):
    fig = big["figures"]["curves"]
    trials = big["study"].get_trials()
    for trace in fig["data"]:
        state = trace["name"].split()[0].upper()
        mine = [t for t in trials if t.state.name == state]
        y = arr(trace["y"])
        gaps = np.flatnonzero(np.isnan(y))
        assert len(gaps) == len(mine)  # one curve per trial, each ended by a gap
        assert len(y) == sum(len(t.intermediate_values) + 1 for t in mine)
        assert trace["line"]["color"] == {"COMPLETE": "#1f77b4", "PRUNED": "#ff7f0e", "FAIL": "#d62728",
                                          "RUNNING": "#2ca02c"}[state]
    assert fig["layout"]["meta"]["trials_by_state"] == {"RUNNING": 1, "COMPLETE": 420, "PRUNED": 70, "FAIL": 10}


def test_timeline_and_utilisation(big):
    fig = big["figures"]["timeline"]
    trials = big["study"].get_trials()
    assert sum(len(trace["y"]) for trace in fig["data"]) == len(trials)
    use = fig["layout"]["meta"]["utilisation"]
    # each slot runs its trials back to back with 0.5-3 s gaps (the builder's clock), so
    # busy = the trials' durations, plus the running trial up to now
    now = datetime.now()
    busy = sum(((t.datetime_complete or now) - t.datetime_start).total_seconds() for t in trials)
    span = (now - min(t.datetime_start for t in trials)).total_seconds()
    assert use["slots"] == 4
    assert use["busy_s"] == pytest.approx(busy, abs=30)
    assert use["span_s"] == pytest.approx(span, abs=30)
    assert use["fraction"] == pytest.approx(busy / (4 * span), abs=0.01)
    assert 0.85 < use["fraction"] < 1.0
    assert use["runs"] == 1 and use["capacity_s"] == pytest.approx(4 * use["span_s"])
    assert f"Utilisation {use['fraction']:.1%}" in big["page"]
    assert big["figures"]["telemetry"]["layout"]["meta"]["samples"] == 12
    assert [t["name"] for t in big["figures"]["telemetry"]["data"]][:2] == ["GPU 0 util %", "GPU 0 memory MB"]


def _span(number, slot, start_s, end_s, driver, host="h"):
    t0 = datetime(2024, 1, 1, 9)
    return optuna.trial.FrozenTrial(
        number=number, trial_id=number, state=TrialState.COMPLETE, value=0.0, values=None,
        datetime_start=t0 + timedelta(seconds=start_s), datetime_complete=t0 + timedelta(seconds=end_s),
        params={}, distributions={}, user_attrs={"device": slot, "driver_id": driver, "host": host},
        system_attrs={}, intermediate_values={})


def test_utilisation_counts_each_run_with_its_own_slots(tmp_path):
    from sweeper.inspect.report import StudyData, utilisation

    trials = [
        # run a: 2 slots for 100 s; cpu0 busy 0-100, cpu1 busy 0-40
        _span(0, "cpu0", 0, 100, "a"), _span(1, "cpu1", 0, 40, "a"),
        # an hour later, run b: 1 slot for 50 s, busy 30 s of it
        _span(2, "cpu0", 3600, 3620, "b"), _span(3, "cpu0", 3630, 3640, "b"), _span(4, "cpu0", 3645, 3650, "b"),
    ]
    use = utilisation(StudyData("s", "val_ic", True, trials, tmp_path, study=None))
    assert use["runs"] == 2 and use["slots"] == 2
    assert use["busy_s"] == pytest.approx(100 + 40 + 35)
    assert use["capacity_s"] == pytest.approx(2 * 100 + 1 * 50)
    assert use["span_s"] == pytest.approx(150)
    assert use["fraction"] == pytest.approx(175 / 250)
    assert use["per_slot"] == pytest.approx({"cpu0": 135 / 150, "cpu1": 40 / 100})
    # two hosts' gpu0 are two slots
    both = [_span(0, "gpu0", 0, 10, "a", host="x"), _span(1, "gpu0", 0, 10, "b", host="y")]
    use = utilisation(StudyData("s", "val_ic", True, both, tmp_path, study=None))
    assert sorted(use["per_slot"]) == ["x/gpu0", "y/gpu0"] and use["fraction"] == pytest.approx(1.0)


def test_valid_vs_test_ic(big):
    fig = big["figures"]["overfit"]
    done = complete(big["study"])
    points = fig["data"][0]
    assert np.allclose(arr(points["x"]), [t.user_attrs["val_ic"] for t in done])
    assert np.allclose(arr(points["y"]), [t.user_attrs["test_ic"] for t in done])
    best = big["study"].best_trial
    assert fig["data"][1]["name"] == f"best (trial {best.number})"
    assert fig["data"][1]["x"][0] == pytest.approx(best.user_attrs["val_ic"])


def test_best_trials_daily_and_cumulative_ic(big):
    fig = big["figures"]["daily"]
    best = big["study"].best_trial.number
    assert fig["layout"]["meta"] == {"trial": best, "days": {"valid": 120, "test": 120}}
    for split, (bars, line) in zip(("valid", "test"), (fig["data"][:2], fig["data"][2:])):
        daily = pd.read_csv(big["run_dir"] / "trials" / str(best) / f"daily_ic_{split}.csv")
        assert list(bars["x"]) == daily["date"].tolist()
        assert np.allclose(arr(bars["y"]), daily["ic"])
        assert np.allclose(arr(line["y"]), daily["ic"].cumsum())
        assert line["yaxis"] == "y2"


def test_selection_bias_panel_is_selection_summary(big):
    fig = big["figures"]["selection"]
    trials = big["study"].get_trials()
    daily = {}
    for t in trials:
        path = big["run_dir"] / "trials" / str(t.number) / "daily_ic_valid.csv"
        if path.exists() and t.state in (TrialState.COMPLETE, TrialState.PRUNED):
            daily[t.number] = pd.read_csv(path)["ic"].to_numpy()
    expected = selection_summary(daily, big["study"].best_trial.number, horizon=2)  # data.horizon: lag 1
    meta = fig["layout"]["meta"]["selection"]
    # and how many finished trials it left out for want of a daily file: the ones without one here
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert meta.keys() == {*expected, "trials_without_files"}
    assert meta["trials_without_files"] == len(finished) - len(daily)
    for key, value in expected.items():
        assert meta[key] == pytest.approx(value, rel=1e-12), key
    assert meta["n_trials"] == 59  # numbers 0..59 minus the FAIL (7) plus the best (134)
    lines = [s["x0"] for s in fig["layout"]["shapes"]]
    assert lines == pytest.approx([expected["expected_max_null_ic"], expected["best_val_ic"], expected["deflated_ic"]])
    assert f"{expected['n_trials']} trials" in fig["layout"]["title"]["text"]
    assert f"no-signal best val IC {expected['expected_max_null_ic']:.4f}" in big["page"]


def test_young_study_gives_placeholders_not_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(json.dumps(synthetic_study.study_config("young")))
    storage = open_storage("sqlite:///runs/young/study.db")
    study = optuna.create_study(study_name="young", storage=storage, direction="maximize")
    trial = study.ask()
    trial.set_user_attr("device", "cpu0")
    result = CliRunner().invoke(main, ["report", "s.yaml", "-o", "r.html"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    figures = figures_of((tmp_path / "r.html").read_text())
    assert list(figures) == list(FIGURES)
    for name in ("importance", "parallel", "overfit", "daily", "selection", "buckets", "longshort"):
        assert "empty" in figures[name]["layout"]["meta"], name
    assert figures["history"]["layout"]["meta"] == {"complete": 0}
    assert figures["timeline"]["layout"]["meta"]["utilisation"]["slots"] == 1
    study.tell(trial, state=TrialState.FAIL)


def test_long_short_sections_say_why_they_are_empty(big):
    # the written study has daily IC files but no weights: the figures say so instead of failing
    for name in ("buckets", "longshort"):
        message = big["figures"][name]["layout"]["meta"]["empty"]
        assert message.startswith("no long-short view:") and "config.yaml: missing" in message


def test_report_of_a_missing_study_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(json.dumps(synthetic_study.study_config("nothing")))
    result = CliRunner().invoke(main, ["report", "s.yaml", "-o", "r.html"])
    assert result.exit_code == 2 and "no such database file" in result.output
    assert not (tmp_path / "r.html").exists()


def test_the_best_so_far_and_the_best_trials_figures_keep_to_study_constraints(tmp_path, monkeypatch):
    """The history's best-so-far line followed infeasible trials, and with every complete trial
    infeasible the best trial's figures said "no complete trial yet" beside its complete trials."""
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    def figures(name, trials):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        Path("s.yaml").write_text(json.dumps(synthetic_study.study_config(name)))
        study = optuna.create_study(study_name=name, storage=open_storage(f"sqlite:///runs/{name}/study.db"),
                                    direction="maximize")
        for value, over in trials:
            study.add_trial(create_trial(value=value, params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)},
                                         constraints={"top_turnover": over}, user_attrs={"device": "cpu0"}))
        assert CliRunner().invoke(main, ["report", "s.yaml", "-o", "r.html"], catch_exceptions=False).exit_code == 0
        return figures_of(Path("r.html").read_text())

    some = figures("c", [(0.05, 0.1), (0.03, -0.1), (0.04, -0.2), (0.06, 0.3)])
    best_line = arr(some["history"]["data"][1]["y"]).astype(float)
    assert math.isnan(best_line[0]) and best_line[1:].tolist() == [0.03, 0.04, 0.04]
    none = figures("d", [(0.05, 0.1), (0.03, 0.2)])
    assert none["daily"]["layout"]["meta"]["empty"] == (
        "study 'd' has no completed feasible trial yet: every completed trial with a value (2) is outside "
        "study.constraints")
