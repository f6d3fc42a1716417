"""Inspecting a real sweep: optuna-dashboard (HTTP API, headless Chromium, reading
while the sweep writes), predict, export, status/best and the report.

One sweep for the whole module: a real ``sweeper run`` subprocess (8 trials, 2 CPU
workers, one SQLite file) while a real ``sweeper dashboard`` subprocess serves the
same file and a thread polls its API. The other tests read the finished study.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
import torch
import yaml
from click.testing import CliRunner
from optuna.trial import TrialState

from conftest import TESTS, TINY, merge, real_env
from pg_server import skip_unless_required
from sweeper.cli import main
from sweeper.quant.ic import ic_report
from sweeper.quant.selection import selection_summary

pytestmark = pytest.mark.slow  # every test here starts a real process

ARTIFACTS = {"config.yaml", "metrics.csv", "train.log", "weights.pt", "daily_ic_valid.csv", "daily_ic_test.csv"}
SWEEP = merge(TINY, {"study": {"name": "live", "n_trials": 8}, "train": {"epochs": 3},
                     "devices": {"cpu_workers": 2}})
# sleeps 50 ms a training step (12 steps a trial), so the dashboard reads while trials run
SWEEP["model"] = {"name": "fault_models:Slow", "step_sleep": 0.05, "hidden": 8}
BAD = ("database is locked", "OperationalError", "StorageInternalError", "Traceback")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 30) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, response.read()


def get_json(url: str) -> dict:
    status, body = get(url)
    assert status == 200
    return json.loads(body)


class Poller(threading.Thread):
    """Reads the study through the dashboard's API, as its web page does, until stopped."""

    def __init__(self, base: str, study_id: int) -> None:
        super().__init__(daemon=True)
        self.urls = [f"{base}/api/studies/{study_id}?after=0", f"{base}/api/studies"]
        self.stop = threading.Event()
        self.statuses: list[object] = []
        self.running_seen = 0

    def run(self) -> None:
        while not self.stop.is_set():
            for url in self.urls:
                try:
                    status, body = get(url)
                except Exception as exc:  # noqa: BLE001 - every failure is a finding
                    self.statuses.append(repr(exc))
                    continue
                self.statuses.append(status)
                if "?after=0" in url:
                    trials = json.loads(body)["trials"]
                    self.running_seen += any(t["state"] == "Running" for t in trials)
            time.sleep(0.05)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    root = tmp_path_factory.mktemp("live")
    (root / "study.yaml").write_text(yaml.safe_dump(SWEEP))
    env = real_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    # the study exists before the dashboard starts, so that it sees the whole sweep
    from sweeper.store import open_storage

    optuna.create_study(study_name="live", direction="maximize",
                        storage=open_storage(f"sqlite:///{root}/runs/live/study.db"))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    dash_log = (root / "dashboard.log").open("wb")
    dash = subprocess.Popen([sys.executable, "-m", "sweeper.cli", "dashboard", "study.yaml", "--port", str(port)],
                            cwd=root, env=env, stdout=dash_log, stderr=subprocess.STDOUT)
    try:
        _wait_for(f"{base}/api/meta", dash)
        study_id = get_json(f"{base}/api/studies")["study_summaries"][0]["study_id"]
        poller = Poller(base, study_id)
        poller.start()
        sweep = subprocess.run([sys.executable, "-m", "sweeper.cli", "run", "study.yaml"], cwd=root, env=env,
                               capture_output=True, text=True, timeout=300)
        time.sleep(0.3)  # a last read of the finished study
        poller.stop.set()
        poller.join(timeout=30)
        study = optuna.load_study(study_name="live", storage=open_storage(f"sqlite:///{root}/runs/live/study.db"))
        yield {"root": root, "base": base, "study_id": study_id, "poller": poller, "sweep": sweep,
               "study": study, "dashboard": dash, "dash_log": root / "dashboard.log"}
    finally:
        dash.terminate()
        dash.wait(timeout=30)
        dash_log.close()


def _wait_for(url: str, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the dashboard exited at start-up"
        try:
            if get(url, timeout=2)[0] == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"the dashboard did not answer {url} within {timeout} s")


@pytest.fixture
def inside(live, monkeypatch):
    """In-process CLI calls from the sweep's folder, with tests/ importable (the Slow model)."""
    monkeypatch.chdir(live["root"])
    monkeypatch.syspath_prepend(str(TESTS))
    return live


def cli(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result.output


# ------------------------------------------------------------------ dashboard


def test_dashboard_reads_a_live_sweep_without_disturbing_it(live):
    sweep, poller, study = live["sweep"], live["poller"], live["study"]
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 8
    assert len(study.get_trials()) == 8  # nothing failed, nothing re-run
    assert len(poller.statuses) >= 20
    assert set(poller.statuses) == {200}, [s for s in poller.statuses if s != 200][:5]
    assert poller.running_seen >= 1  # the reads really overlapped running trials
    logs = {p: Path(p).read_text(errors="replace") for p in glob.glob(str(live["root"] / "runs/live/logs/*.log"))}
    logs["dashboard"] = live["dash_log"].read_text(errors="replace")
    logs["sweep"] = sweep.stdout + sweep.stderr
    assert len(logs) >= 4  # two slot logs, the dashboard's, the driver's
    for name, text in logs.items():
        for bad in BAD:
            assert bad not in text, f"{bad!r} in {name}"
    assert not re.search(r'" 5\d\d ', logs["dashboard"])  # no HTTP 5xx served


def test_dashboard_api_shows_trials_curves_attributes_and_artifacts(live):
    base, sid = live["base"], live["study_id"]
    assert get_json(f"{base}/api/meta")["artifact_is_available"] is True
    names = [s["study_name"] for s in get_json(f"{base}/api/studies")["study_summaries"]]
    assert names == ["live"]
    stored = {t.number: t for t in live["study"].get_trials()}
    # optuna-dashboard caches a study's trials for 2 s: the poller's last read during the
    # sweep may still be served, so wait for the dashboard to show the finished study
    deadline = time.monotonic() + 15
    while True:
        detail = get_json(f"{base}/api/studies/{sid}?after=0")
        # a trial's attributes are set after its last intermediate value, and its files uploaded after
        # them (under load the dashboard can read a trial between the two): wait for all three
        done = [t for t in detail["trials"]
                if len(t["intermediate_values"]) == len(stored[t["number"]].intermediate_values)
                and {a["key"] for a in t["user_attrs"]} >= set(stored[t["number"]].user_attrs)
                and {a["filename"] for a in t["artifacts"]} >= ARTIFACTS]
        if len(done) == len(stored) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert detail["name"] == "live" and detail["has_intermediate_values"] is True
    # the axes and the value column name the study's metric, not "Objective 0" (issue 42)
    assert live["study"].metric_names == ["val_ic"] and detail["objective_names"] == ["val_ic"]
    assert sorted(t["number"] for t in detail["trials"]) == sorted(stored)
    for trial in detail["trials"]:
        t = stored[trial["number"]]
        curve = {p["step"]: p["value"] for p in trial["intermediate_values"]}
        assert curve == pytest.approx(t.intermediate_values) and sorted(curve) == [1, 2, 3]
        attrs = {a["key"]: a["value"] for a in trial["user_attrs"]}
        assert float(attrs["val_ic"]) == pytest.approx(t.user_attrs["val_ic"], rel=1e-12)
        assert attrs["device"] == t.user_attrs["device"] and attrs["device"] in ("cpu0", "cpu1")
        files = {a["filename"]: a["artifact_id"] for a in trial["artifacts"]}
        assert set(files) == ARTIFACTS
        folder = live["root"] / "runs/live/trials" / str(t.number)
        for name in ("config.yaml", "metrics.csv", "weights.pt"):
            status, body = get(f"{base}/artifacts/{sid}/{trial['trial_id']}/{files[name]}")
            assert status == 200 and body == (folder / name).read_bytes(), name


def _chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def test_browser_renders_the_study_page(live, tmp_path):
    browser = _chromium()
    if browser is None:
        skip_unless_required("no chromium on PATH (Debian: apt-get install chromium); .ci/run installs it")
    url = f"{live['base']}/dashboard/studies/{live['study_id']}"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=15000", "--dump-dom"]
    dom = subprocess.run([browser, *flags, url], capture_output=True, text=True, timeout=120).stdout
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", re.sub(r"<(style|script)\b.*?</\1>", " ", dom, flags=re.S)))
    best = live["study"].best_trial
    assert f"live (id={live['study_id']})" in text  # the study page, rendered by the React app
    assert f"Best Trial (number={best.number})" in text
    assert str(best.value) in text
    assert "Objective 0" not in text  # the study names its metric (Study.set_metric_names): val_ic
    for number in range(8):  # the intermediate-values plot's legend names every trial
        assert f"trial #{number}" in text


# ------------------------------------------------------------------ predict


def test_predict_reproduces_the_stored_ic(inside):
    study = inside["study"]
    best = study.best_trial
    out = cli("predict", "study.yaml", "-o", "preds.parquet")
    assert f"trial {best.number}, split valid" in out
    frame = pd.read_parquet("preds.parquet")
    assert list(frame.columns) == ["date", "asset", "pred", "label"]
    assert ic_report(frame)["ic"] == pytest.approx(best.user_attrs["val_ic"], abs=1e-6)
    other = next(t for t in study.get_trials() if t.number != best.number)
    cli("predict", "study.yaml", "--trial", str(other.number), "--split", "test", "-o", "test.parquet")
    report = ic_report(pd.read_parquet("test.parquet"))
    assert report["ic"] == pytest.approx(other.user_attrs["test_ic"], abs=1e-6)
    assert report["rank_ic"] == pytest.approx(other.user_attrs["test_rank_ic"], abs=1e-6)


def test_predict_on_another_parquet_file(inside):
    from sweeper.data import write_synthetic

    best = inside["study"].best_trial
    synth = SWEEP["data"]["synthetic"]
    write_synthetic("same.parquet", **synth)  # the study's panel, as a file
    cli("predict", "study.yaml", "--data", "same.parquet", "-o", "same.parquet.preds.parquet")
    frame = pd.read_parquet("same.parquet.preds.parquet")
    assert ic_report(frame)["ic"] == pytest.approx(best.user_attrs["val_ic"], abs=1e-6)

    # the latest dates' labels are not known yet: they are still predicted, with a NaN label
    panel = pd.read_parquet("same.parquet")
    last = sorted(panel["date"].unique())[-5:]
    panel.loc[panel["date"].isin(last), "label"] = np.nan
    panel.to_parquet("new.parquet", index=False)
    cli("predict", "study.yaml", "--data", "new.parquet", "--split", "all", "-o", "all.csv")
    frame = pd.read_csv("all.csv", parse_dates=["date"])
    lookback = SWEEP["data"]["lookback"]
    dates = sorted(panel["date"].unique())
    assert set(frame["date"]) == set(pd.to_datetime(dates[lookback - 1:]))
    assert len(frame) == int(panel["date"].isin(dates[lookback - 1:]).sum())
    latest = frame[frame["date"].isin(pd.to_datetime(last))]
    assert len(latest) > 0 and latest["label"].isna().all() and latest["pred"].notna().all()


def test_predict_refuses_what_it_cannot_do(inside):
    assert "has no trial 99" in cli("predict", "study.yaml", "--trial", "99", "-o", "x.parquet", code=2)
    # weights that the model's code no longer builds (a layer added since): one line, not a traceback
    weights = Path(f"runs/live/trials/{inside['study'].best_trial.number}/weights.pt")
    kept = weights.read_bytes()
    torch.save({"fc2.weight": torch.zeros(1)}, weights)
    try:
        said = cli("predict", "study.yaml", "-o", "x.parquet", code=2)
    finally:
        weights.write_bytes(kept)
    assert f"trial {inside['study'].best_trial.number}'s weights do not fit the model " in said
    assert "builds now (was its code changed?): Error(s) in loading state_dict" in said and "Traceback" not in said
    assert "no such file" in cli("predict", "study.yaml", "--data", "nope.parquet", "-o", "x.parquet", code=2)
    assert "expected a .parquet or .csv" in cli("export", "study.yaml", "-o", "x.xlsx", code=2)
    assert not Path("x.parquet").exists() and not Path("x.xlsx").exists()


# ------------------------------------------------------------------ export


def _expected_table(study: optuna.Study) -> pd.DataFrame:
    df = study.trials_dataframe(multi_index=False)
    assert study.metric_names == ["val_ic"]  # Optuna names the value's column after it: export says value
    renamed = {c: c.replace("params_", "params.", 1).replace("user_attrs_", "user_attrs.", 1) for c in df.columns}
    renamed["value_val_ic"] = "value"
    df = df.rename(columns=renamed)
    df["duration_s"] = df.pop("duration").dt.total_seconds()
    columns = ["number", "state", "value", "datetime_start", "datetime_complete", "duration_s"]
    columns += sorted(c for c in df if c.startswith("params.")) + sorted(c for c in df if c.startswith("user_attrs."))
    return df[columns]


@pytest.mark.parametrize("name", ["trials.parquet", "trials.csv"])
def test_export_round_trips(inside, name):
    from sweeper.inspect.export import read_table

    out = cli("export", "study.yaml", "-o", name)
    expected = _expected_table(inside["study"])
    assert f"{len(expected)} trials, {expected.shape[1]} columns" in out
    back = read_table(name)
    assert list(back.columns) == list(expected.columns)
    assert (back["state"] == "COMPLETE").all()
    for column in expected:
        left, right = back[column], expected[column]
        if pd.api.types.is_datetime64_any_dtype(right):
            assert (left.astype("datetime64[us]") == right.astype("datetime64[us]")).all(), column
        elif pd.api.types.is_float_dtype(right):
            assert np.allclose(left, right, rtol=1e-12, equal_nan=True), column
        else:  # CSV cannot tell an empty string from a missing value
            assert list(map(_text, left)) == list(map(_text, right)), column


def test_export_of_a_study_whose_trials_all_still_run():
    # the duration column is all None then (object dtype): export raised AttributeError on `.dt`
    from sweeper.inspect.export import trials_frame

    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), direction="maximize")
    study.ask({"train.lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)})
    frame = trials_frame(study)
    assert list(frame["state"]) == ["RUNNING"] and frame["duration_s"].isna().all()
    assert frame["duration_s"].dtype == "float64" and list(frame.columns)[-1] == "params.train.lr"


def _text(value: object) -> str:
    if isinstance(value, (dict, list)):  # a dict or list attribute (stack_rates) is exported as JSON text
        return json.dumps(value, default=str)
    return "" if value is None or (isinstance(value, float) and np.isnan(value)) else str(value)


# ------------------------------------------------------------------ status, best, report


def test_trials_that_never_trained_are_not_counted_as_files_study_keep_removed(tmp_path):
    """A config the model refused is PRUNED with fail_reason config and never had a daily IC file: it was
    counted among the trials study.keep left out ("the bias is understated")."""
    from optuna.trial import create_trial

    from sweeper.inspect.results import selection_report

    study = optuna.create_study(direction="maximize")
    rng = np.random.default_rng(0)
    daily = {}
    for n in range(3):
        study.add_trial(create_trial(state=TrialState.COMPLETE, value=0.01 * n, user_attrs={"val_ic": 0.01 * n}))
        daily[n] = pd.Series(rng.normal(0.01 * n, 0.05, 40), index=pd.bdate_range("2021-01-04", periods=40))
    study.add_trial(create_trial(state=TrialState.PRUNED, user_attrs={"fail_reason": "config"}))
    study.add_trial(create_trial(state=TrialState.PRUNED, user_attrs={"val_ic": 0.0}))  # its file removed
    trials = study.get_trials()
    report = selection_report(study, tmp_path, trials[2], trials, 1, daily)
    assert report is not None and report["trials_without_files"] == 1


def test_best_and_status_show_oracle_fraction_and_deflated_ic(inside):
    study = inside["study"]
    best = study.best_trial
    report = json.loads(cli("best", "study.yaml", "--json"))
    oracle = study.user_attrs["oracle_ic"]
    assert report["val_ic_oracle_fraction"] == pytest.approx(best.user_attrs["val_ic"] / oracle["valid"])
    assert report["test_ic_oracle_fraction"] == pytest.approx(best.user_attrs["test_ic"] / oracle["test"])
    daily = {t.number: pd.read_csv(f"runs/live/trials/{t.number}/daily_ic_valid.csv")["ic"].to_numpy()
             for t in study.get_trials()}
    expected = selection_summary(daily, best.number, horizon=SWEEP["data"].get("horizon", 2))
    # every finished trial has its daily file here: none left out (study.keep would)
    assert report["selection"] == pytest.approx({**expected, "trials_without_files": 0}, rel=1e-12)
    assert report["selection"]["n_trials"] == 8
    text = cli("best", "study.yaml")
    assert f"oracle valid IC {oracle['valid']:.4f}: {report['val_ic_oracle_fraction']:.0%} reached" in text
    assert f"deflated val IC {expected['deflated_ic']:.4f}" in text
    assert f"no-signal best val IC {expected['expected_max_null_ic']:.4f}" in text
    status = json.loads(cli("status", "study.yaml", "--json"))
    assert status["best"]["selection"] == report["selection"]
    assert "deflated val IC" in cli("status", "study.yaml")


def test_report_of_the_real_sweep(inside):
    from test_report import arr, figures_of

    cli("report", "study.yaml", "-o", "report.html")
    figures = figures_of(Path("report.html").read_text())
    assert list(figures) == ["history", "importance", "parallel", "curves", "timeline", "overfit", "daily",
                             "selection", "buckets", "longshort", "ic_time", "baseline"]
    # (no devices.csv: a CPU sweep has no GPU telemetry)
    assert figures["curves"]["layout"]["meta"]["trials_by_state"] == {"COMPLETE": 8}
    use = figures["timeline"]["layout"]["meta"]["utilisation"]
    assert use["slots"] == 2 and 0 < use["fraction"] <= 1
    best = inside["study"].best_trial.number
    valid = pd.read_csv(f"runs/live/trials/{best}/daily_ic_valid.csv")
    assert np.allclose(arr(figures["daily"]["data"][0]["y"]), valid["ic"])
    assert figures["selection"]["layout"]["meta"]["selection"]["n_trials"] == 8
