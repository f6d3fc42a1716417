"""Issue 42, daily use without surprises, items 2-6 from the outside: ``predict`` says which
weights scored and refuses to fall back silently from a refit to train-split weights; a figure
of ``best``, ``--json`` and the report says which dates it covers where its neighbour covers
others; ``status`` tells a dead trial from a running one; ``validate`` shows the split under
every scheme; and the smaller things (params' precision, figure 7's legend, too little history).

One walk-forward sweep (3 trials of the TINY study, 3 folds) for the module, through the CLI
in this process; a test that writes (a refit) works on its own copy of the study's folder.
"""
from __future__ import annotations

import json
import re
import shutil
import signal
import time
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml
from optuna.trial import TrialState

from conftest import TINY, backdate_heartbeat, merge, sweeper_cli, swept_study
from sweeper.config import load_config
from sweeper.data import synthetic_frame
from sweeper.store import open_storage
from sweeper.store import optuna_private as private

SYNTH = TINY["data"]["synthetic"]
LOOKBACK = TINY["data"]["lookback"]
WALK = merge(TINY, {"study": {"n_trials": 3}, "validation": {"scheme": "walk_forward", "folds": 3}})


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    return swept_study(tmp_path_factory.mktemp("daily_use"), WALK)


@pytest.fixture
def here(swept, tmp_path) -> Path:
    """A copy of the swept study's folder, for a test that writes in it."""
    return Path(shutil.copytree(swept, tmp_path / "study"))


def stored(root: Path) -> optuna.Study:
    return optuna.load_study(study_name="tiny", storage=open_storage(f"sqlite:///{root}/runs/tiny/study.db"))


def cli(root: Path, *args: str, code: int = 0) -> str:
    return sweeper_cli(root, *args, code=code).output


def new_dates(root: Path, dates: int) -> str:
    """new.parquet: the last ``dates`` dates of a longer synthetic panel, after the study's, with
    ``lookback - 1`` dates of history before them and no label (what a live day looks like);
    returns the first date to score."""
    frame, _ = synthetic_frame(SYNTH["assets"], SYNTH["dates"] + 40, SYNTH["features"], SYNTH["seed"])
    days = sorted(frame["date"].unique())
    keep = frame[frame["date"] >= days[-dates - (LOOKBACK - 1)]].drop(columns=["label"])
    keep.to_parquet(root / "new.parquet", index=False)
    return str(days[-dates])[:10]


def span(dates: list[str]) -> str:
    return " to ".join(dates)


# ------------------------------------------------------------- 2. predict never silently downgrades

@pytest.mark.slow
def test_predict_refuses_an_unrefit_best_while_another_trial_has_a_refit(here):
    """The refit trial was the best when it was refit; then another trial became the best (here:
    the refit is of the second-best trial, which is the same state of the study)."""
    study = stored(here)
    best = study.best_trial.number
    other = next(t.number for t in study.trials if t.number != best)
    cli(here, "refit", "study.yaml", "--trial", str(other))
    record = json.loads((here / f"runs/tiny/trials/{other}/refit/refit.json").read_text())
    start = new_dates(here, 20)
    train = study.user_attrs["fold_dates"][-1]["train"]  # the model run's: the last fold's

    refused = cli(here, "predict", "study.yaml", "--data", "new.parquet", "--start", start, "-o", "p.parquet",
                  code=2)
    assert refused == (
        f"Error: the best trial, {best}, has no refit, but trial {other} has one (trained to {record['until']}): "
        f"trial {best}'s own weights saw only its train window ({span(train)}). Refit it (`sweeper refit "
        f"study.yaml`), use trial {other}'s refit (--trial {other}), or pass --allow-unrefit to score with "
        f"trial {best}'s own weights\n")
    assert not (here / "p.parquet").exists()

    # the old behaviour, asked for: the best's own weights, and the dates they saw
    out = cli(here, "predict", "study.yaml", "--data", "new.parquet", "--start", start, "--allow-unrefit",
              "-o", "p.parquet")
    valid = study.user_attrs["fold_dates"][-1]["valid"]
    assert (f"note: using trial {best}'s own weights, trained on the last fold's train window ({span(train)}), "
            f"early-stopped on its valid block ({span(valid)})\n") in out
    frame = pd.read_parquet(here / "p.parquet")
    last = str(frame["date"].max())[:10]
    # live dates: no label yet, so no IC line (it used to say `IC nan ... over 0 dates`)
    assert out.endswith(f"wrote p.parquet: trial {best}, split all of new.parquet ({start} to {last}), "
                        f"{len(frame)} rows, no label yet: no IC\n")

    out = cli(here, "predict", "study.yaml", "--data", "new.parquet", "--start", start, "--trial", str(other),
              "-o", "p.parquet")
    assert (f"note: using the refit of trial {other}, trained to {record['until']} (target dates "
            f"{record['first_target']} to {record['last_target']})\n") in out
    cli(here, "refit", "study.yaml")  # a fresh refit of the best: nothing to refuse
    out = cli(here, "predict", "study.yaml", "--data", "new.parquet", "--start", start, "-o", "p.parquet")
    assert f"note: using the refit of trial {best}, trained to {record['until']}" in out
    assert "in-sample" not in out  # dates after the refit's window
    # the refit's own window given as --data: its IC there is in-sample, and a note says so (it did not)
    whole, _ = synthetic_frame(SYNTH["assets"], SYNTH["dates"] + 40, SYNTH["features"], SYNTH["seed"])
    whole.to_parquet(here / "all.parquet", index=False)
    out = cli(here, "predict", "study.yaml", "--data", "all.parquet", "-o", "p.parquet")
    last = json.loads((here / f"runs/tiny/trials/{best}/refit/refit.json").read_text())["last_target"]
    assert re.search(rf"note: \d+ of the \d+ dates scored are on or before {last}, the last target date a "
                     r"refit trained on: their IC is in-sample \(score later dates, or --start after it\)", out), out


@pytest.mark.slow
def test_too_little_history_says_how_many_dates_are_needed_and_there_are(swept, tmp_path):
    frame, _ = synthetic_frame(SYNTH["assets"], SYNTH["dates"] + 40, SYNTH["features"], SYNTH["seed"])
    days = sorted(frame["date"].unique())[-3:]
    frame[frame["date"] >= days[0]].to_parquet(tmp_path / "short.parquet", index=False)
    best = stored(swept).best_trial.number
    out = cli(swept, "predict", "study.yaml", "--data", str(tmp_path / "short.parquet"), "--split", "all",
              "-o", str(tmp_path / "p.parquet"), code=2)
    assert out == (f"Error: {tmp_path / 'short.parquet'}: no rows to predict in the all split (trial {best}, "
                   f"lookback {LOOKBACK}: a row needs {LOOKBACK} dates, its own and the {LOOKBACK - 1} before it; "
                   f"the data has 3, {str(days[0])[:10]} to {str(days[-1])[:10]})\n")


@pytest.mark.slow
def test_a_start_whose_first_dates_have_too_little_history_says_which_are_not_predicted(here):
    """--start at a new file's first date: its first lookback - 1 dates cannot be predicted (too little
    history). They were left out without a word, a live signal silently missing days."""
    first = new_dates(here, 5)
    days = sorted(pd.read_parquet(here / "new.parquet")["date"].unique())
    start = str(days[0])[:10]
    out = cli(here, "predict", "study.yaml", "--data", "new.parquet", "--start", start, "--allow-unrefit",
              "-o", "p.parquet")
    assert (f"note: --start {start}: the {LOOKBACK - 1} dates {start} to {str(days[LOOKBACK - 2])[:10]} have too "
            f"little history in the data to predict (a row needs {LOOKBACK} dates, its own and the "
            f"{LOOKBACK - 1} before it)\n") in out
    predicted = pd.read_parquet(here / "p.parquet")
    assert str(predicted["date"].min())[:10] == first and predicted["date"].nunique() == 5
    out = cli(here, "predict", "study.yaml", "--data", "new.parquet", "--start", first, "--allow-unrefit",
              "-o", "p.parquet")
    assert "too little history" not in out


# ------------------------------------------------------------- 3. every figure says its dates

@pytest.mark.slow
def test_best_says_which_dates_each_figure_covers(swept):
    study = stored(swept)
    folds, split = study.user_attrs["fold_dates"], study.user_attrs["split_dates"]
    best = json.loads(cli(swept, "best", "study.yaml", "--json"))
    every = {"over": "all folds", "dates": [folds[0]["valid"][0], folds[-1]["valid"][1]]}
    last, test = {"over": "last fold", "dates": folds[-1]["valid"]}, {"over": "test", "dates": split["test"]}
    assert best["scored_on"] == {"metrics": {"valid": every, "test": test},
                                 "group_neutral": {"valid": last, "test": test},  # the model run's frames
                                 "portfolio": {"valid": last, "test": test},
                                 "ensemble": {"valid": last, "test": test}}
    # the ensemble beside its best member on the same rows: the last fold's valid block, and test
    ens, trial = best["ensemble"], study.best_trial
    alone = ens["alone"]
    assert alone["trial"] == trial.number == ens["trials"][0]
    assert alone["valid"]["ic"] == pytest.approx(trial.user_attrs["fold_val_ic"][-1], abs=1e-6)
    assert alone["test"]["ic"] == pytest.approx(trial.user_attrs["test_ic"], abs=1e-6)
    assert alone["valid"]["n_dates"] == ens["valid"]["n_dates"] and alone["test"]["n_dates"] == ens["test"]["n_dates"]
    assert trial.user_attrs["val_ic"] != pytest.approx(alone["valid"]["ic"])  # the mean over folds: other dates

    lines = cli(swept, "best", "study.yaml").splitlines()
    m = best["metrics"]
    assert lines[1] == (f"  valid: ic {m['val_ic']:.4f}  rank_ic {m['val_rank_ic']:.4f}  icir {m['val_icir']:.4f}  "
                        f"(mean over every fold's valid block, {span(every['dates'])})")
    assert lines[2] == f"  test:  ic {m['test_ic']:.4f}  rank_ic {m['test_rank_ic']:.4f}  icir {m['test_icir']:.4f}"
    assert ("  long-short, q=5 buckets, dates 2 apart (gross: equal weights, no costs); valid: the last fold's "
            f"valid block, {span(last['dates'])}:") in lines
    at = next(k for k, line in enumerate(lines) if line.startswith("  top3 ensemble (trials "))
    assert lines[at + 1] == f"    valid dates: the last fold's valid block, {span(last['dates'])}"
    # the ensemble's long-short lines sit under it, before its best member alone (they read as the member's)
    member = next(k for k in range(at, len(lines)) if "alone on the same dates" in lines[k])
    assert [line.split(":")[0] for line in lines[at + 2:member]] == ["      valid", "      test"]
    assert lines[member] == (
        f"    trial {trial.number} alone on the same dates: valid ic {alone['valid']['ic']:.4f}  rank_ic "
        f"{alone['valid']['rank_ic']:.4f}  test ic {alone['test']['ic']:.4f}  rank_ic {alone['test']['rank_ic']:.4f}")
    # item 6: params at 4 significant digits on the screen, every digit in --json
    assert f"  params: train.lr={trial.params['train.lr']:.4g}" in lines
    assert best["params"] == trial.params


@pytest.mark.slow
def test_the_report_labels_its_dates_and_keeps_figure_7s_right_axis_clear(swept, tmp_path):
    from test_report import figures_of

    cli(swept, "report", "study.yaml", "-o", str(tmp_path / "r.html"))
    page = (tmp_path / "r.html").read_text()
    figures = figures_of(page)
    last = stored(swept).user_attrs["fold_dates"][-1]["valid"]
    said = f"; valid: the last fold's valid block, {span(last)}"
    for name in ("buckets", "longshort"):
        assert figures[name]["layout"]["title"]["text"].endswith(said), name
    assert figures["overfit"]["layout"]["xaxis"]["title"]["text"] == "validation IC (mean over the folds)"
    daily = figures["daily"]
    assert [t["name"] for t in daily["data"]] == ["daily IC (valid, every fold)", "cumulative IC (valid, every fold)",
                                                  "daily IC (test)", "cumulative IC (test)"]
    # the legend under the plot, not over the right axis; the right margin holds its labels and title
    layout = daily["layout"]
    assert layout["yaxis2"]["side"] == "right"
    assert layout["legend"]["orientation"] == "h" and layout["legend"]["y"] < 0
    assert layout["margin"]["r"] >= 70 and layout["margin"]["b"] >= 100
    assert "(mean over folds)" in page


# ------------------------------------------------------------- 4. status tells the dead from the running

def test_status_marks_a_trial_whose_heartbeat_stopped_as_stale(tmp_path, monkeypatch):
    """Two RUNNING trials of a real SQLite study, one of whose heartbeat is older than the grace."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(merge(TINY, {"study": {"grace_period": 4}})))
    cfg = load_config(tmp_path / "study.yaml")
    storage = open_storage(cfg.study.resolved_storage, heartbeat_interval=1, grace_period=4)
    study = optuna.create_study(study_name="tiny", storage=storage, direction="maximize")
    dead, alive = study.ask(), study.ask()
    for trial in (dead, alive):
        storage.record_heartbeat(private.trial_id(trial))
    backdate_heartbeat(storage, private.trial_id(dead), 75)

    report = json.loads(cli(tmp_path, "status", "study.yaml", "--json"))
    rows = {r["trial"]: r for r in report["running"]}
    assert rows[dead.number]["stale"] and not rows[alive.number]["stale"]
    assert 75 <= rows[dead.number]["heartbeat_age_s"] < 100 and rows[alive.number]["heartbeat_age_s"] < 4
    assert report["stale"] == [dead.number] and report["reap"] == "sweeper run study.yaml"
    text = cli(tmp_path, "status", "study.yaml")
    age = rows[dead.number]["heartbeat_age_s"]
    assert "STALE" in text and " ago " in text
    line = next(x for x in text.splitlines() if x.startswith("stale: "))
    assert line.startswith(f"stale: trial {dead.number} (no heartbeat for ")
    assert int(line.split("(no heartbeat for ")[1].split(" s)")[0]) in range(int(age) - 2, int(age) + 20)
    assert line.endswith(", longer than study.grace_period (4 s): its driver or host is gone. "
                         "`sweeper run study.yaml` fails such a trial as interrupted and runs it again")


# ------------------------------------------------------------- 5. validate shows the split

@pytest.mark.parametrize("scheme", ["holdout", "walk_forward"])
def test_validate_shows_the_split_under_every_scheme(tmp_path, monkeypatch, scheme):
    from click.testing import CliRunner

    from sweeper.cli import main
    from sweeper.data import load_panel

    monkeypatch.chdir(tmp_path)
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(merge(TINY, {"validation": {"scheme": scheme, "folds": 3}})))
    done = CliRunner().invoke(main, ["validate", "study.yaml"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    days = pd.Series(load_panel(load_config(tmp_path / "study.yaml").data).dates)

    def dates(first: str, last: str) -> str:  # the count, from the panel's own dates
        return f"{first} to {last} ({int(days.between(pd.Timestamp(first), pd.Timestamp(last)).sum())} dates)"
    assert lines[2:4] == ["  features: 3 (f00, f01, f02)",
                          "  purge: 2 dates dropped before each valid block and before test (horizon 2 + embargo 0: "
                          "no label reaches into the next split); lookback 5"]
    if scheme == "holdout":
        assert lines[4:7] == [f"  train: {dates('2010-01-08', '2010-05-14')}",
                              f"  valid: {dates('2010-05-19', '2010-06-30')}",
                              f"  test: {dates('2010-07-05', '2010-08-13')}"]
        assert "(91 dates)" in lines[4]
    else:
        fold = f"  fold 1: train {dates('2010-01-08', '2010-02-22')}, valid {dates('2010-02-25', '2010-04-07')}"
        assert lines[4] == fold and lines[6].startswith("  fold 3: train 2010-01-08 to 2010-05-17 (92 dates)")
        assert lines[7] == f"  test: {dates('2010-07-05', '2010-08-13')}"


# ------------------------------------------------------------- 4. a driver killed with SIGKILL

@pytest.mark.slow
def test_status_marks_the_trials_of_a_driver_killed_with_sigkill_stale(study_file):
    from test_resume import SLOW, _start, _wait_for_checkpointed_running

    path = study_file(SLOW, replace=("model",))  # heartbeat 1 s, grace 3 s
    proc = _start(path)
    try:
        _, running = _wait_for_checkpointed_running(path)
        live = json.loads(cli(path.parent, "status", path.name, "--json"))
        assert live["running"] and not any(r["stale"] for r in live["running"]) and "stale" not in live
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    numbers = sorted(t.number for t in running)
    deadline, report = time.monotonic() + 30, {}
    while time.monotonic() < deadline and report.get("stale") != numbers:
        time.sleep(0.5)
        report = json.loads(cli(path.parent, "status", path.name, "--json"))
    assert report.get("stale") == numbers, report.get("running")
    assert all(r["heartbeat_age_s"] > 3 for r in report["running"])
    text = cli(path.parent, "status", path.name)
    assert f"stale: trial {numbers[0]} (no heartbeat for " in text
    assert f"`sweeper run {path.name}` fails such a trial as interrupted and runs it again" in text
    # status only reads: the trials stay RUNNING until a sweep reaps them
    assert sorted(t.number for t in stored(path.parent).get_trials(states=(TrialState.RUNNING,))) == numbers


def test_the_budget_line_of_one_sqlite_driver_counts_its_trials_in_words():
    from types import SimpleNamespace

    from sweeper.dispatch.driver import Driver

    driver = SimpleNamespace(cfg=SimpleNamespace(study=SimpleNamespace(n_trials=1)), storage_url="sqlite:///x.db")
    assert Driver._budget_line(driver) == "budget reached: study.n_trials=1 trial is finished"
    driver.cfg.study.n_trials = 3
    assert Driver._budget_line(driver) == "budget reached: study.n_trials=3 trials are finished"


@pytest.mark.slow
def test_predict_after_the_data_file_grew_scores_the_studys_own_dates(tmp_path):
    """A file that gained dates since the study ran: ``predict`` scores the split's stored dates
    with each trial's own statistics (as --data does), not splits recomputed on the longer file."""
    whole, _ = synthetic_frame(SYNTH["assets"], SYNTH["dates"] + 40, SYNTH["features"], SYNTH["seed"])
    days = sorted(whole["date"].unique())
    whole[whole["date"] < days[SYNTH["dates"]]].to_parquet(tmp_path / "panel.parquet", index=False)
    raw = merge(TINY, {"study": {"n_trials": 1}, "data": {"synthetic": None, "path": "panel.parquet"}})
    swept_study(tmp_path, raw)
    cli(tmp_path, "predict", "study.yaml", "--split", "test", "-o", "before.parquet")
    test_dates = stored(tmp_path).user_attrs["split_dates"]["test"]
    whole.to_parquet(tmp_path / "panel.parquet", index=False)  # 40 more dates
    out = cli(tmp_path, "predict", "study.yaml", "--split", "test", "-o", "after.parquet")
    assert "warning: the data differs from the data the study was run on (fingerprint changed)" in out
    assert ("note: the study's data file changed since the study ran: each split is its stored dates, "
            "normalised with each trial's own statistics, as --data scores a file") in out
    out = sweeper_cli(tmp_path, "baseline", "study.yaml", code=2).output  # it would move its split
    assert out == (f"Error: {tmp_path / 'panel.parquet'}: the data changed since the study ran (its fingerprint), so "
                   "a baseline would train and score on other dates than the study's trials; restore it\n")
    before, after = pd.read_parquet(tmp_path / "before.parquet"), pd.read_parquet(tmp_path / "after.parquet")
    assert [str(after["date"].min())[:10], str(after["date"].max())[:10]] == test_dates
    pd.testing.assert_frame_equal(before, after, rtol=1e-5)
