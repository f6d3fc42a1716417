"""``sweeper refit``: the production model on every label known by ``--until``, and
``predict --data`` with it (docs/refit.md).

One real sweep for the module (2 trials of the TINY study on a Parquet panel, through
``sweeper run`` in a subprocess); each test works on its own copy of the study's folder,
with the CLI in-process.
"""
from __future__ import annotations

import json
import math
import shutil
import statistics
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from optuna.trial import TrialState

from conftest import TINY, merge, swept_study
from sweeper.cli import main
from sweeper.config import DataConfig
from sweeper.core import train
from sweeper.data import synth, write_synthetic
from sweeper.errors import ConfigError
from sweeper.refit import Refit, Window, parse_until, refit_epochs, refit_panel, refit_window
from sweeper.store import open_storage

SYNTH = {"assets": 24, "dates": 160, "features": 3, "seed": 1}
LOOKBACK, HORIZON = 5, 2  # TINY's data.lookback and DataConfig's default horizon (embargo 0)
STUDY = merge(TINY, {"study": {"n_trials": 2}})
STUDY["data"] = {"path": "panel.parquet", "lookback": LOOKBACK}


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("refit")
    write_synthetic(root / "panel.parquet", **SYNTH)
    return swept_study(root, STUDY)


@pytest.fixture
def study(swept, tmp_path, monkeypatch) -> optuna.Study:
    """A copy of the swept study's folder as the working directory; the study in it."""
    here = tmp_path / "study"
    shutil.copytree(swept, here)
    monkeypatch.chdir(here)
    return optuna.load_study(study_name="tiny", storage=open_storage("sqlite:///runs/tiny/study.db"))


def cli(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result.output


def panel_dates() -> list[pd.Timestamp]:
    return sorted(pd.read_parquet("panel.parquet", columns=["date"])["date"].unique())


def refit_of(number: int) -> tuple[dict, dict]:
    folder = Path(f"runs/tiny/trials/{number}/refit")
    return (json.loads((folder / "refit.json").read_text()),
            torch.load(folder / "weights.pt", map_location="cpu", weights_only=True))


def future_file(path: str, history: int = 0) -> list[pd.Timestamp]:
    """The synthetic panel with 40 more dates, cut to the dates after the study's panel (and the
    last ``history`` dates of the panel before them), without the label; returns the new dates."""
    longer, _ = synth.synthetic_frame(SYNTH["assets"], SYNTH["dates"] + 40, SYNTH["features"], SYNTH["seed"])
    dates = panel_dates()
    keep = longer[longer["date"] > (dates[-history - 1] if history else dates[-1])]
    keep.drop(columns=["label"]).to_parquet(path, index=False)
    return sorted(d for d in keep["date"].unique() if d > dates[-1])


# ---------------------------------------------------------------- 1. refit, then predict --data

@pytest.mark.slow
def test_refit_then_predict_new_dates(study):
    best = study.best_trial
    out = cli("refit", "study.yaml")
    record, _ = refit_of(best.number)
    dates = panel_dates()
    assert record["trial"] == best.number and record["until"] == str(dates[-1])[:10]
    assert record["epochs"] == best.user_attrs["best_epoch"] and record["seed"] == 0
    assert f"refit trial {best.number}: {record['epochs']} epochs" in out and "replaced" not in out
    assert f"labels known by {record['until']}; seed 0, cpu, " in out
    assert record["first_target"] == str(dates[LOOKBACK - 1])[:10]

    new = future_file("new.parquet")  # only dates after the panel's: the first lookback - 1 are history
    out = cli("predict", "study.yaml", "--data", "new.parquet", "--split", "all", "-o", "new.preds.parquet")
    assert f"using the refit of trial {best.number}, trained to {record['until']}" in out
    frame = pd.read_parquet("new.preds.parquet")
    assert sorted(frame["date"].unique()) == new[LOOKBACK - 1:]
    assert frame["pred"].notna().all() and frame["label"].isna().all()

    new = future_file("live.parquet", history=LOOKBACK - 1)  # with the history a window needs
    start = str(new[0])[:10]
    cli("predict", "study.yaml", "--data", "live.parquet", "--start", start, "-o", "live.preds.parquet")
    live = pd.read_parquet("live.preds.parquet")
    assert sorted(live["date"].unique()) == new
    rows = pd.read_parquet("live.parquet", columns=["date"])["date"]
    assert len(live) == int((rows >= new[0]).sum())

    # the trial's own weights are not the refit's: without refit.json (an incomplete refit) they score it
    Path(f"runs/tiny/trials/{best.number}/refit/refit.json").unlink()
    out = cli("predict", "study.yaml", "--data", "live.parquet", "--start", start, "-o", "own.parquet")
    assert "using the refit" not in out
    own = pd.read_parquet("own.parquet")
    assert own[["date", "asset"]].equals(live[["date", "asset"]])
    assert not np.allclose(own["pred"], live["pred"])


@pytest.mark.slow
def test_an_ensemble_uses_the_refits_it_has_and_own_splits_never(study):
    best = study.best_trial.number
    other = next(t.number for t in study.trials if t.number != best)
    cli("refit", "study.yaml", "--trial", str(other), "--until", "2010-06-30")
    new = future_file("new.parquet")
    out = cli("predict", "study.yaml", "--trial", "top2", "--data", "new.parquet", "--split", "all",
              "-o", "top.parquet")
    assert (f"using the refits of 1 of the 2 trials (trial {other} trained to 2010-06-30); "
            f"trial {best} uses its own weights") in out
    assert sorted(pd.read_parquet("top.parquet")["date"].unique()) == new[LOOKBACK - 1:]
    # the study's own valid split: the trial's own weights, which give its stored val_ic
    out = cli("predict", "study.yaml", "--trial", str(other), "-o", "valid.parquet")
    assert f"trial {other} has a refit: the study's own dates are scored with the trial's own weights" in out
    from sweeper.quant.ic import ic_report

    stored = study.trials[other].user_attrs["val_ic"]
    assert ic_report(pd.read_parquet("valid.parquet"))["ic"] == pytest.approx(stored, abs=1e-6)


# ---------------------------------------------------------------- 2. no label later than --until

@pytest.mark.slow
def test_a_refit_to_until_never_reads_a_later_label(study):
    dates = panel_dates()
    until = dates[120]
    cli("refit", "study.yaml", "--until", str(until)[:10])
    record, weights = refit_of(study.best_trial.number)
    last = dates.index(pd.Timestamp(record["last_target"]))
    assert record["until"] == str(until)[:10] and last + HORIZON + 0 == 120  # the purge, exactly
    assert record["horizon"] == HORIZON and record["embargo"] == 0

    panel = pd.read_parquet("panel.parquet")
    later = panel["date"] > until
    panel.loc[later, "label"] = np.where(np.arange(later.sum()) % 2, np.nan, 1e6)
    panel.to_parquet("panel.parquet", index=False)
    out = cli("refit", "study.yaml", "--until", str(until)[:10])
    assert f"it replaced the refit trained to {record['until']}" in out
    again, same = refit_of(study.best_trial.number)
    assert again["last_target"] == record["last_target"] and again["rows"] == record["rows"]
    assert same.keys() == weights.keys() and all(torch.equal(same[k], weights[k]) for k in weights)

    # the last target's label is read: changing it changes the refit (the check above can fail)
    panel.loc[panel["date"] == dates[last], "label"] *= -1.0
    panel.to_parquet("panel.parquet", index=False)
    cli("refit", "study.yaml", "--until", str(until)[:10])
    _, moved = refit_of(study.best_trial.number)
    assert not all(torch.equal(moved[k], weights[k]) for k in weights)
    # its last 5 target dates without a label (a file whose labels stop early): the record and its line
    # said it trained to the window's last date (predict's in-sample note then judged by it)
    panel.loc[panel["date"].between(dates[last - 4], dates[last]), "label"] = np.nan
    panel.to_parquet("panel.parquet", index=False)
    out = cli("refit", "study.yaml", "--until", str(until)[:10])
    unlabelled, _ = refit_of(study.best_trial.number)
    assert (unlabelled["last_target"], unlabelled["target_dates"]) == (str(dates[last - 5])[:10],
                                                                       record["target_dates"] - 5)
    assert f"{record['target_dates'] - 5} target dates {record['first_target']} to {dates[last - 5]:%Y-%m-%d}" in out


# ---------------------------------------------------------------- 3. the epochs

@pytest.mark.parametrize(("attrs", "epochs"), [
    ({"fold_best_epoch": [3, 1, 4, 2], "best_epoch": 9}, 3),   # median 2.5, rounded half up; folds win
    ({"fold_best_epoch": [2, 5, 1], "best_epoch": 5}, 2),
    ({"fold_best_epoch": [1, 1], "best_epoch": 1}, 1),
    ({"best_epoch": 7}, 7),                                    # holdout: its single run's
])
def test_epochs_are_the_median_fold_best_epoch_or_the_best_epoch(attrs, epochs):
    trial = optuna.trial.create_trial(state=TrialState.COMPLETE, value=0.1, user_attrs=attrs)
    assert refit_epochs(trial)[0] == epochs


@pytest.mark.slow
def test_a_walk_forward_trial_refits_with_its_median_fold_best_epoch(study_file):
    path = study_file({"study": {"n_trials": 1}, "train": {"epochs": 4},
                       "validation": {"scheme": "walk_forward", "folds": 3}})
    cli("run", str(path))
    trial = optuna.load_study(study_name="tiny", storage=open_storage("sqlite:///runs/tiny/study.db")).trials[0]
    folds = trial.user_attrs["fold_best_epoch"]
    assert len(folds) == 3
    out = cli("refit", str(path))
    record, _ = refit_of(0)
    assert record["epochs"] == max(1, math.floor(statistics.median(folds) + 0.5))
    assert record["epochs_from"] == "the median best epoch of 3 fold(s)" and "of 3 fold(s)" in out
    # the synthetic panel's dates, all of them: the last target is the purge before its last date
    assert record["data"] == synth.describe(**SYNTH)
    assert record["target_dates"] == SYNTH["dates"] - (LOOKBACK - 1) - HORIZON


def test_a_trial_cut_short_by_time_says_so_in_its_epochs():
    """Its best epoch may be its last only because train.max_minutes stopped it (refit used to say nothing)."""
    cut = optuna.trial.create_trial(state=TrialState.COMPLETE, value=0.1,
                                    user_attrs={"best_epoch": 3, "stop_reason": "time"})
    assert refit_epochs(cut) == (3, "its best epoch, of a training cut short by train.max_minutes")
    cut.user_attrs.update(fold_best_epoch=[2, 3])
    assert refit_epochs(cut) == (3, "the median best epoch of 2 fold(s), of a training cut short by "
                                    "train.max_minutes")


def test_an_until_past_2262_is_the_data_s_last_date():
    """--until 9999-12-31 wrapped around in datetime64[ns]: 'refused: --until 1816-03-29: 0 target dates'."""
    dates = pd.bdate_range("2020-01-01", periods=60).to_numpy("datetime64[ns]")
    data = DataConfig(path="p.parquet", lookback=5, horizon=2)
    assert refit_window(dates, data, parse_until("9999-12-31")) == refit_window(dates, data, None)
    assert refit_window(dates, data, None) == Window(first=4, stop=58, until=59)  # the purge of 2 dates
    # stamped at the 15:00 close: --until 2020-03-24 (the last day) knows that day's label too
    assert refit_window(dates + np.timedelta64(15, "h"), data, parse_until("2020-03-24")) == Window(4, 58, 59)


def test_a_rolling_window_refits_on_as_many_dates_as_its_last_fold():
    """validation.window: rolling trained each fold on its last train_dates targets; the refit trained on
    every date from the first, with the epochs those short windows had found best."""
    dates = pd.bdate_range("2020-01-01", periods=60).to_numpy("datetime64[ns]")
    data = DataConfig(path="p.parquet", lookback=5, horizon=2)
    last_fold = ["2020-02-03", "2020-02-28"]  # 20 business days
    assert refit_window(dates, data, None) == Window(first=4, stop=58, until=59)  # expanding: from the first
    assert refit_window(dates, data, None, last_fold) == Window(first=38, stop=58, until=59)
    assert refit_window(dates + np.timedelta64(15, "h"), data, None, last_fold) == Window(38, 58, 59)
    assert refit_window(dates, data, parse_until("2020-03-02"), last_fold) == Window(22, 42, 43)


@pytest.mark.slow
def test_a_rolling_walk_forward_trial_refits_on_its_folds_length(study_file):
    path = study_file({"study": {"n_trials": 1}, "validation": {"scheme": "walk_forward", "folds": 2,
                                                                "window": "rolling", "train_dates": 40}})
    cli("run", str(path))
    cli("refit", str(path))
    record, _ = refit_of(0)
    assert record["target_dates"] == 40


def test_a_trial_without_a_best_epoch_is_refused():
    trial = optuna.trial.create_trial(state=TrialState.FAIL, user_attrs={"fail_reason": "nan"})
    with pytest.raises(ConfigError, match=r"has no best epoch .*best_epoch"):
        refit_epochs(trial)


def test_the_core_trains_exactly_the_epochs_and_keeps_the_last(workdir):
    from sweeper.config import validate_config

    cfg = validate_config(merge(TINY, {"train": {"epochs": 3, "patience": 1}}), "tiny")
    panel, _ = refit_panel(DataConfig(synthetic=SYNTH, lookback=LOOKBACK), None)
    result = train(cfg, panel, fixed_epochs=True)
    # patience 1 would stop the default path after epoch 2 (nothing validated is never better)
    assert result.metrics["epochs_run"] == 3 and [h["epoch"] for h in result.history] == [1, 2, 3]
    assert all(math.isnan(h["val_ic"]) for h in result.history) and result.daily == {}
    twice = train(cfg.model_copy(update={"train": cfg.train.model_copy(update={"epochs": 2})}), panel,
                  fixed_epochs=True)
    assert not all(torch.equal(result.best_state[k], twice.best_state[k]) for k in result.best_state)


# ---------------------------------------------------------------- 4. bad input

@pytest.mark.slow
def test_bad_input_exits_2_naming_the_key_and_writes_nothing(study):
    number = study.best_trial.number
    folder = Path(f"runs/tiny/trials/{number}/refit")
    assert "--until: cannot parse the date 'soon'" in cli("refit", "study.yaml", "--until", "soon", code=2)
    out = cli("refit", "study.yaml", "--until", "2010-01-20", code=2)
    assert "--until 2010-01-20: 7 target dates" in out and "the earliest --until is 2010-02-08" in out
    assert "--until 2009-06-01: 0 target dates" in cli("refit", "study.yaml", "--until", "2009-06-01", code=2)
    assert "--trial 9: study 'tiny' has no trial 9" in cli("refit", "study.yaml", "--trial", "9", code=2)
    out = cli("refit", "study.yaml", "--trial", "top2", code=2)
    assert "--trial top2: an ensemble is not one trial" in out
    assert "--trial: expected a trial number" in cli("refit", "study.yaml", "--trial", "last", code=2)
    failed = study.ask()
    study.tell(failed, state=TrialState.FAIL)
    out = cli("refit", "study.yaml", "--trial", str(failed.number), code=2)
    assert f"--trial {failed.number}: trial {failed.number} (FAIL) has no best epoch" in out
    assert "Traceback" not in out and not folder.exists()
    assert not Path(f"runs/tiny/trials/{failed.number}").exists()
    # the study's file emptied, or its labels all missing: the panel builder's words, not an IndexError
    full = pd.read_parquet("panel.parquet")
    full.iloc[:0].to_parquet("panel.parquet")
    assert "panel.parquet: no usable rows: the data has no rows" in cli("refit", "study.yaml", code=2)
    full.assign(label=np.nan).to_parquet("panel.parquet")
    assert f"column 'label': no usable rows: none of the {len(full)} rows has a finite label" in cli(
        "refit", "study.yaml", code=2)
    assert not folder.exists()
    full.to_parquet("panel.parquet")
    # an --until past the data's last date is its last date
    cli("refit", "study.yaml", "--until", "2030-01-01")
    assert refit_of(number)[0]["until"] == str(panel_dates()[-1])[:10]


class Roomy:
    """A MemoryReader with room for any batch: the batch probe runs as it does on a GPU."""

    base_bytes = 0

    def free_bytes(self) -> int:
        return 1 << 40

    def reset_peak(self) -> None:
        return None

    def peak_bytes(self) -> int:
        return 1 << 20


def test_batch_size_auto_is_probed_on_a_refit_panel(workdir):
    from sweeper.config import validate_config
    from sweeper.core import Member
    from sweeper.core.lanes import lane_batch_size
    from sweeper.core.loop import stack_step
    from sweeper.core.step import plan_stack

    cfg = validate_config(merge(TINY, {"train": {"batch_size": "auto"}}), "tiny")
    panel, _ = refit_panel(DataConfig(synthetic=SYNTH, lookback=LOOKBACK), None)
    # the stack of one that train sets up (sweeper.core.loop.stack_step) for the refit's run
    tc = cfg.train
    step = stack_step([Member(cfg, panel)], torch.device("cpu"))
    (lane,) = step.lanes
    plan = plan_stack(step, tc, lane_batch_size(tc, [lane]), Roomy(), 1)
    # every train row in one micro-batch; the empty valid and test splits probe no evaluation batch
    assert plan.batch_size == plan.micro_batch == lane.batcher.n_samples > 0
    assert plan.eval_batch_size == cfg.train.resolved_eval_batch_size and plan.note.startswith("probed micro-batch")


def test_the_refit_line_names_every_seed_it_trained():
    record = {"trial": 3, "epochs": 2, "epochs_from": "its best epoch", "target_dates": 90, "rows": 2000,
              "first_target": "2010-01-08", "last_target": "2010-05-14", "until": "2010-05-18", "seed": 0,
              "seeds": [0, 1, 2, 3], "device": "cpu", "duration_s": 4.04}
    head = ("refit trial 3: 2 epochs (its best epoch) on 90 target dates 2010-01-08 to 2010-05-14 (2000 rows), "
            "labels known by 2010-05-18; ")
    assert Refit(record, Path("r"), None).lines() == [
        head + "4 seeds (0, 1, 2, 3), cpu, 4.0 s",  # and each seed's weights file
        "wrote r/ (weights.pt, weights.seed-2.pt, weights.seed-3.pt, weights.seed-4.pt, norm_stats.json, refit.json)"]
    assert Refit({**record, "seeds": [0]}, Path("r"), None).lines() == [
        head + "seed 0, cpu, 4.0 s", "wrote r/ (weights.pt, norm_stats.json, refit.json)"]
    one = Refit({**record, "epochs": 1}, Path("r"), None).lines()[0]
    assert one.startswith("refit trial 3: 1 epoch (its best epoch) on 90 target dates")


@pytest.mark.slow
def test_a_seed_ensemble_refits_every_seed_and_predicts_with_their_mean(study_file):
    """validation.repeats 2: the refit trains both seeds (one weights file each) and ``predict
    --data`` scores new dates with the mean of their predictions."""
    path = study_file({"study": {"n_trials": 1}, "validation": {"repeats": 2}})
    cli("run", str(path))
    out = cli("refit", str(path))
    folder = Path("runs/tiny/trials/0/refit")
    record = json.loads((folder / "refit.json").read_text())
    assert f"labels known by {record['until']}; 2 seeds (0, 1), cpu, " in out  # each seed trained, each named
    assert record["seeds"] == [0, 1] and sorted(p.name for p in folder.glob("weights*.pt")) == [
        "weights.pt", "weights.seed-2.pt"]
    write_synthetic("new.parquet", **SYNTH)
    cli("predict", str(path), "--data", "new.parquet", "--split", "all", "-o", "both.parquet")
    # a seed's file missing is refused (it scored the first seed alone, as if it were the model)
    (folder / "weights.seed-2.pt").rename(folder / "aside.pt")
    out = cli("predict", str(path), "--data", "new.parquet", "--split", "all", "-o", "x.parquet", code=2)
    assert out == (f"Error: {folder}: weights.seed-2.pt missing; the model is the mean of its 2 seeds; run "
                   "`sweeper refit` again\n") and not Path("x.parquet").exists()
    trial_folder = Path("runs/tiny/trials/0")
    shutil.copy(trial_folder / "weights.seed-2.pt", trial_folder / "aside.pt")
    (trial_folder / "weights.seed-2.pt").unlink()  # the trial's own model on the study's dates, likewise
    out = cli("predict", str(path), "--split", "test", "-o", "x.parquet", code=2)
    assert out == f"Error: {trial_folder}: weights.seed-2.pt missing; the model is the mean of its 2 seeds\n"
    shutil.copy(folder / "weights.pt", folder / "weights.seed-2.pt")  # the first seed's twice: its own
    cli("predict", str(path), "--data", "new.parquet", "--split", "all", "-o", "first.parquet")
    shutil.copy(folder / "aside.pt", folder / "weights.pt")  # the second seed's twice
    shutil.copy(folder / "aside.pt", folder / "weights.seed-2.pt")
    cli("predict", str(path), "--data", "new.parquet", "--split", "all", "-o", "second.parquet")
    both, first, second = (pd.read_parquet(f"{n}.parquet") for n in ("both", "first", "second"))
    assert np.allclose(both["pred"], (first["pred"] + second["pred"]) / 2, rtol=0, atol=1e-6)
    assert not np.allclose(first["pred"], second["pred"])


@pytest.mark.slow
def test_a_trial_cut_short_before_its_seed_ensemble_predicts_with_its_first_seed(study_file):
    """Out of train.max_minutes after its first seed, a trial's model is that seed (its test_ic is that
    seed's): predict asked for every seed's weights and refused it."""
    path = study_file({"study": {"n_trials": 1}, "validation": {"repeats": 3},
                       "train": {"max_stack": 1, "max_minutes": 0.0001}})
    cli("run", str(path))
    trial = optuna.load_study(study_name="tiny", storage="sqlite:///runs/tiny/study.db").trials[0]
    assert trial.user_attrs["stop_reason"] == "time" and "seed_test_ic" not in trial.user_attrs
    assert [p.name for p in Path("runs/tiny/trials/0").glob("weights*.pt")] == ["weights.pt"]
    out = cli("predict", str(path), "--trial", "0", "--split", "test", "-o", "p.parquet")
    assert f"IC {trial.user_attrs['test_ic']:.4f}" in out


def test_a_rolling_window_is_read_from_the_trials_own_folds_and_a_holdout_study_has_none():
    """A holdout study with window: rolling (accepted, and in stored configs of before) made refit an
    IndexError; the folds are the trial's own (after a --force on grown data the study's moved)."""
    from types import SimpleNamespace

    from sweeper.config import validate_config
    from sweeper.refit import _rolling

    rolling = validate_config(merge(TINY, {"validation": {"window": "rolling"}}), "tiny")
    own = [{"train": ["2020-01-01", "2020-02-28"], "valid": ["2020-03-05", "2020-03-31"]}]
    study = SimpleNamespace(user_attrs={"fold_dates": [{"train": ["2019-01-01", "2019-02-28"]}]})
    trial = optuna.trial.create_trial(state=TrialState.COMPLETE, value=0.1, user_attrs={"fold_dates": own})
    assert _rolling(rolling, trial, study) == ["2020-01-01", "2020-02-28"]
    bare = optuna.trial.create_trial(state=TrialState.COMPLETE, value=0.1)
    assert _rolling(rolling, bare, study) == ["2019-01-01", "2019-02-28"]
    assert _rolling(rolling, bare, SimpleNamespace(user_attrs={})) is None  # holdout: no folds
