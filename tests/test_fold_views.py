"""Walk-forward fold figures wherever a user looks: ``best`` (text and --json), ``status``,
``export``, the report's figure 13 and its selection panel, and optuna-dashboard, on studies
written straight into SQLite through Optuna with the attrs and files a walk-forward trial
leaves (docs/inspect.md, "Walk-forward folds"). No training: every value is set here."""
from __future__ import annotations

import json
import math
from pathlib import Path
from wsgiref.util import setup_testing_defaults

import numpy as np
import optuna
import pandas as pd
import pytest
import yaml
from click.testing import CliRunner
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from conftest import sweeper_cli
from sweeper.cli import main
from sweeper.inspect.report import FIGURES
from sweeper.quant.selection import expected_max, fold_blocks, fold_standard_error, pbo, selection_summary
from sweeper.store import layout, open_storage
from test_report import figures_of

FOLDS, PER_FOLD, SEED = 4, 16, 7  # 16 valid target dates per fold; train.seed 7
DATES = pd.bdate_range("2021-01-04", periods=40 + FOLDS * PER_FOLD)
LR = {"train.lr": FloatDistribution(1e-3, 1e-2, log=True)}
# 12 complete trials (trial k's folds: a level and a tilt), one pruned after 2 folds
FOLD_ICS = {k: [round(0.01 + 0.003 * (k % 5) + 0.002 * (k % 3) * (f - 1.5) + 0.001 * ((k * f) % 4), 6)
                for f in range(FOLDS)] for k in range(12)}
FOLD_ICS[12] = [0.001, -0.004]  # pruned in fold 2


def fold_dates() -> list[dict[str, list[str]]]:
    out = []
    for f in range(FOLDS):
        start = 40 + f * PER_FOLD
        ends = (DATES[0], DATES[start - 3], DATES[start], DATES[start + PER_FOLD - 1])
        day = [d.date().isoformat() for d in ends]
        out.append({"train": day[:2], "valid": day[2:]})
    return out


def write_daily(folder, ics: list[float], with_fold: bool = True) -> None:
    """The folds' valid blocks end to end; each fold's days average to exactly its IC."""
    rows = []
    for f, ic in enumerate(ics):
        for d in range(PER_FOLD):
            day = DATES[40 + f * PER_FOLD + d].date().isoformat()
            noise = 0.01 * (1 if d % 2 else -1) * (1 + (d // 2) % 3)
            fold = {"fold": f + 1} if with_fold else {}
            rows.append({"date": day, "ic": ic + noise, "rank_ic": ic, **fold})
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(folder / "daily_ic_valid.csv", index=False)


def fold_attrs(ics: list[float], repeats: int) -> dict:
    attrs = {"val_ic": float(np.mean(ics)), "test_ic": float(np.mean(ics)) * 0.5, "fold_val_ic": ics,
             "val_ic_se": fold_standard_error(ics), "worst_fold_val_ic": min(ics), "fold_dates": fold_dates(),
             "fold_best_epoch": [2 + f for f in range(len(ics))], "folds_run": len(ics), "best_epoch": 3,
             "device": "cpu0", "host": "h",
             "fold_val_rank_ic": [2 * v for v in ics], "val_rank_ic_se": 0.0645}  # metric val_rank_ic
    if repeats > 1:
        attrs.update(seed_val_ic_sd=0.0025, seed_ensemble_val_ic=float(np.mean(ics)) + 0.001,
                     fold_seed_ensemble_val_ic=[v + 0.001 for v in ics])
    return attrs


@pytest.fixture
def wf(study_file, workdir):
    """A walk_forward study (4 folds, 2 seed repeats): 12 complete trials, 1 pruned, 1 running."""
    # one run at a time (train.max_stack 1): the steps name a fold, seed and epoch each
    path = study_file({"validation": {"scheme": "walk_forward", "folds": FOLDS, "repeats": 2},
                       "train": {"seed": SEED, "max_stack": 1}})
    (workdir / "runs/tiny").mkdir(parents=True)
    storage = open_storage(f"sqlite:///{workdir}/runs/tiny/study.db")
    study = optuna.create_study(study_name="tiny", direction="maximize", storage=storage)
    study.set_user_attr("fold_dates", fold_dates())
    for k, ics in FOLD_ICS.items():
        state = TrialState.PRUNED if k == 12 else TrialState.COMPLETE
        study.add_trial(create_trial(state=state, value=float(np.mean(ics)) if k < 12 else None,
                                     params={"train.lr": 0.001 * (1 + k % 9)}, distributions=LR,
                                     user_attrs=fold_attrs(ics, 2),
                                     intermediate_values={1: 0.01} if k == 12 else None))
        write_daily(layout.trial_files(workdir / "runs/tiny", k).folder, ics)
    running = study.ask()  # train.epochs 2, repeats 2: step 7 = fold 2, seed 2, epoch 1
    running.set_user_attr("device", "cpu1")
    running.report(0.02, 7)
    return {"path": path, "study": study, "root": workdir}


@pytest.fixture
def holdout(study_file, workdir):
    path = study_file()
    (workdir / "runs/tiny").mkdir(parents=True)
    study = optuna.create_study(study_name="tiny", direction="maximize",
                                storage=open_storage(f"sqlite:///{workdir}/runs/tiny/study.db"))
    study.set_user_attr("fold_dates", [])
    for k in range(6):
        study.add_trial(create_trial(value=0.01 * k, params={"train.lr": 0.001 * (1 + k)}, distributions=LR,
                                     user_attrs={"val_ic": 0.01 * k, "test_ic": 0.005 * k, "device": "cpu0"}))
        write_daily(layout.trial_files(workdir / "runs/tiny", k).folder, [0.01 * k] * FOLDS, with_fold=False)
    return {"path": path, "study": study}


def cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def best_of(study: optuna.Study) -> optuna.trial.FrozenTrial:
    return max(study.get_trials(states=(TrialState.COMPLETE,)), key=lambda t: (t.value, -t.number))


# ------------------------------------------------------------------ best


def test_best_json_has_the_fold_keys(wf):
    out = json.loads(cli("best", str(wf["path"]), "--json"))
    best = best_of(wf["study"])
    ics = FOLD_ICS[best.number]
    assert out["trial"] == best.number
    assert out["validation"] == {"scheme": "walk_forward", "folds": 4, "window": "expanding",
                                 "train_dates": None, "valid_dates": None, "repeats": 2, "aggregate": "mean"}
    assert out["fold_val_ic"] == ics
    assert out["val_ic_se"] == pytest.approx(np.std(ics, ddof=1) / 2, rel=1e-12)
    assert out["worst_fold_val_ic"] == min(ics)
    assert out["seed_val_ic_sd"] == 0.0025
    assert out["seed_ensemble_val_ic"] == pytest.approx(np.mean(ics) + 0.001, rel=1e-12)
    assert out["fold_dates"] == fold_dates()
    assert out["fold_best_epoch"] == [2, 3, 4, 5] and out["folds_run"] == 4
    assert out["test_model"] == {"fold": 4, "repeat": 1, "seed": SEED, "members": 2}  # the seed ensemble


def test_best_text_names_each_fold_and_how_the_objective_aggregates(wf):
    text = cli("best", str(wf["path"]))
    best = best_of(wf["study"])
    ics, dates = FOLD_ICS[best.number], fold_dates()
    assert ("validation: walk_forward, 4 folds (expanding window), 2 seed repeats; "
            "objective = mean over folds of val_ic") in text
    for k in range(FOLDS):
        train, valid = dates[k]["train"], dates[k]["valid"]
        assert (f"fold {k + 1}: val_ic {ics[k]:.4f}  (train {train[0]} to {train[1]}, "
                f"valid {valid[0]} to {valid[1]})") in text
    worst = int(np.argmin(ics))
    assert (f"val_ic over 4 folds: mean {np.mean(ics):.4f}  se {np.std(ics, ddof=1) / 2:.4f}  "
            f"worst {ics[worst]:.4f} (fold {worst + 1})") in text
    assert f"seeds: val_ic sd 0.0025 within a fold, seed-ensemble val_ic {np.mean(ics) + 0.001:.4f}" in text
    assert f"test IC: the seed ensemble of 2 seeds (train.seed {SEED}..{SEED + 1}, fold 4)" in text
    assert "standard errors from the fold ICs" in text and "PBO's blocks cut along the folds" in text


def test_the_baseline_per_fold_beside_the_best(wf):
    theirs = [0.01, 0.02, 0.03, 0.04]
    wf["study"].set_user_attr("baseline", {"val_ic": 0.02, "test_ic": 0.01, "fold_val_ic": theirs})
    ics = FOLD_ICS[best_of(wf["study"]).number]
    diff = ", ".join(f"{a - b:+.4f}" for a, b in zip(ics, theirs))
    assert f"baseline val_ic per fold: 0.0100, 0.0200, 0.0300, 0.0400; best - baseline per fold: {diff}" in \
        cli("best", str(wf["path"]))


def test_another_metric_shows_its_own_folds(wf):
    raw = yaml.safe_load(wf["path"].read_text())
    raw["study"]["metric"] = "val_rank_ic"
    wf["path"].write_text(yaml.safe_dump(raw))
    ics = FOLD_ICS[best_of(wf["study"]).number]
    out = json.loads(cli("best", str(wf["path"]), "--json"))
    assert out["fold_val_rank_ic"] == [2 * v for v in ics] and out["val_rank_ic_se"] == 0.0645
    want = ", ".join(f"{2 * v:.4f}" for v in ics)
    assert f"val_rank_ic per fold: {want}  se 0.0645" in cli("best", str(wf["path"]))


def test_lcb_is_named_in_the_text(wf):
    raw = yaml.safe_load(wf["path"].read_text())
    raw["validation"]["aggregate"] = "lcb"
    wf["path"].write_text(yaml.safe_dump(raw))
    assert "objective = mean - 1 se over folds of val_ic" in cli("best", str(wf["path"]))
    # the report called a trial's value val_ic, beside the valid IC (the mean over folds) it is not
    cli("report", str(wf["path"]), "-o", "r.html")
    page, best = (wf["root"] / "r.html").read_text(), best_of(wf["study"])
    assert f"best: trial {best.number}, lcb(val_ic) {best.value:.4f}, valid IC" in page
    figures = figures_of(page)
    assert figures["history"]["layout"]["yaxis"]["title"]["text"] == "lcb(val_ic)"
    assert figures["folds"]["data"][0]["name"] == f"trial {best.number} (lcb(val_ic) {best.value:.4f})"
    assert figures["curves"]["layout"]["yaxis"]["title"]["text"] == "val_ic"  # each epoch reports val_ic


@pytest.mark.parametrize("scheme", ["walk_forward", "holdout"])
def test_the_valid_oracle_is_left_out_under_walk_forward(scheme, request):
    """The stored oracle covers data.split's valid block, and a walk-forward val_ic the folds' own
    blocks: under walk-forward best, its text and the report say nothing of a valid oracle (they
    showed the fraction of one), and keep the test one; holdout keeps both."""
    at = request.getfixturevalue("wf" if scheme == "walk_forward" else "holdout")
    at["study"].set_user_attr("oracle_ic", {"train": 0.1, "valid": 0.05, "test": 0.08})
    ua, folded = best_of(at["study"]).user_attrs, scheme == "walk_forward"
    out = json.loads(cli("best", str(at["path"]), "--json"))
    assert out["oracle_val_ic"] == (None if folded else 0.05) and out["oracle_test_ic"] == 0.08
    assert out.get("val_ic_oracle_fraction") == (None if folded else ua["val_ic"] / 0.05)
    assert out["test_ic_oracle_fraction"] == ua["test_ic"] / 0.08
    text = cli("best", str(at["path"]))
    assert ("oracle valid IC 0.0500" in text) is not folded and "oracle test IC 0.0800" in text
    cli("report", str(at["path"]), "-o", "r.html")
    page = Path("r.html").read_text()
    assert ("of the oracle 0.0500" in page) is not folded and "of the oracle 0.0800" in page


def test_holdout_best_and_status_unchanged(holdout):
    out = json.loads(cli("best", str(holdout["path"]), "--json"))
    assert out["trial"] == 5
    for key in ("validation", "fold_val_ic", "val_ic_se", "worst_fold_val_ic", "fold_dates", "test_model"):
        assert key not in out, key
    assert not {"se_from", "best_val_ic_se", "n_folds", "pbo_blocks"} & set(out["selection"])
    text = cli("best", str(holdout["path"]))
    assert "validation:" not in text and "fold" not in text
    status = json.loads(cli("status", str(holdout["path"]), "--json"))
    assert "validation" not in status and "fold_dates" not in status
    assert "validation:" not in cli("status", str(holdout["path"]))


def test_holdout_with_seed_repeats_shows_the_seeds(study_file, workdir):
    path = study_file({"validation": {"repeats": 3}})
    (workdir / "runs/tiny").mkdir(parents=True)
    study = optuna.create_study(study_name="tiny", direction="maximize",
                                storage=open_storage(f"sqlite:///{workdir}/runs/tiny/study.db"))
    study.set_user_attr("fold_dates", [])
    attrs = {"val_ic": 0.03, "test_ic": 0.02, "fold_val_ic": [0.03], "val_ic_se": 0.004,
             "seed_val_ic_sd": 0.007, "seed_ensemble_val_ic": 0.035, "fold_best_epoch": [2], "folds_run": 1}
    study.add_trial(create_trial(value=0.03, params={"train.lr": 0.002}, distributions=LR, user_attrs=attrs))
    out = json.loads(cli("best", str(path), "--json"))
    assert out["validation"]["scheme"] == "holdout" and out["validation"]["repeats"] == 3
    assert out["fold_val_ic"] == [0.03] and out["val_ic_se"] == 0.004 and out["seed_val_ic_sd"] == 0.007
    assert "fold_dates" not in out and "worst_fold_val_ic" not in out
    assert out["test_model"] == {"fold": 1, "repeat": 1, "seed": 0, "members": 3}
    text = cli("best", str(path))
    assert "validation: holdout, 3 seed repeats; objective = mean over seeds of val_ic" in text
    assert "val_ic over 3 seeds: mean 0.0300  se 0.0040\n" in text and "fold 1:" not in text
    assert "seeds: val_ic sd 0.0070 within a fold, seed-ensemble val_ic 0.0350" in text
    assert "test IC: the seed ensemble of 3 seeds (train.seed 0..2)" in text


# ------------------------------------------------------------------ selection


def test_selection_standard_errors_come_from_the_fold_ics(wf):
    sel = json.loads(cli("best", str(wf["path"]), "--json"))["selection"]
    best = best_of(wf["study"])
    ics = FOLD_ICS[best.number]
    assert sel["se_from"] == "folds" and sel["n_folds"] == 4 and sel["pbo_blocks"] == "folds"
    assert sel["best_val_ic_se"] == pytest.approx(np.std(ics, ddof=1) / math.sqrt(4), rel=1e-12)
    assert sel["best_val_ic"] == pytest.approx(np.mean(ics), rel=1e-12)
    # N = every finished trial with a daily file (the pruned one too): 13
    ses = [np.std(v, ddof=1) / math.sqrt(len(v)) for v in FOLD_ICS.values()]
    assert sel["n_trials"] == 13
    assert sel["expected_max_null_ic"] == pytest.approx(np.median(ses) * expected_max(13), rel=1e-12)
    assert sel["deflated_ic"] == pytest.approx(np.mean(ics) - np.median(ses) * expected_max(13), rel=1e-12)
    # PBO on the 12 trials that cover the best's dates (the pruned one has half), 16 blocks in the folds
    files = [layout.trial_files(wf["root"] / "runs/tiny", k).daily_ic("valid") for k in range(12)]
    matrix = np.column_stack([pd.read_csv(f)["ic"].to_numpy() for f in files])
    blocks = fold_blocks(np.repeat(np.arange(1, 5), PER_FOLD))
    assert sel["pbo"] == pytest.approx(pbo(matrix, blocks=blocks), abs=1e-12)


def test_fold_blocks_never_mix_two_folds():
    folds = np.repeat([1, 2, 3, 4], 16)
    blocks = fold_blocks(folds)
    assert len(blocks) == 16 and all(len(set(folds[b])) == 1 and len(b) == 4 for b in blocks)
    assert np.array_equal(np.concatenate(blocks), np.arange(64))
    assert len(fold_blocks(np.repeat([1, 2, 3, 4, 5], 20))) == 10  # 15 is odd: 2 per fold
    assert len(fold_blocks(np.repeat([1, 2, 3], 20))) == 12
    assert fold_blocks(np.repeat(np.arange(1, 10), 20)) is None  # 9 folds: no even count <= 16
    assert fold_blocks(np.repeat([1, 2], 3)) is None  # blocks shorter than 4 dates
    # the same blocks as array_split gives the same PBO as n_blocks
    m = np.random.default_rng(0).normal(size=(64, 5))
    assert pbo(m, blocks=blocks) == pbo(m, n_blocks=16)


def test_selection_summary_with_folds_exact():
    daily = {0: np.array([0.1, -0.1, 0.3, 0.1]), 1: np.array([0.0, 0.2, 0.0, 0.2])}
    fold_ics = {0: [0.0, 0.2], 1: [0.1, 0.1, float("nan")]}
    out = selection_summary(daily, 0, fold_ics=fold_ics)
    se0 = np.std([0.0, 0.2], ddof=1) / math.sqrt(2)
    assert out["best_val_ic_se"] == pytest.approx(se0, rel=1e-12)
    assert out["expected_max_null_ic"] == pytest.approx(np.median([se0, 0.0]) * expected_max(2), rel=1e-12)
    assert out["best_val_ic"] == pytest.approx(0.1) and out["pbo_blocks"] == "dates" and out["pbo"] is None


# ------------------------------------------------------------------ status


def test_status_shows_the_scheme_the_layout_and_the_running_fold(wf):
    out = json.loads(cli("status", str(wf["path"]), "--json"))
    assert out["validation"]["scheme"] == "walk_forward" and out["fold_dates"] == fold_dates()
    (run,) = out["running"]
    assert (run["fold"], run["seed"], run["epoch"]) == (2, 2, 1)
    text = cli("status", str(wf["path"]))
    assert text.count("validation: walk_forward, 4 folds (expanding window)") == 1  # not again under best
    d = fold_dates()[3]
    train, valid = d["train"], d["valid"]
    assert f"fold 4: train {train[0]} to {train[1]}, valid {valid[0]} to {valid[1]}" in text
    assert "fold" in text.split("running")[1] and "seed" in text.split("running")[1]


def test_a_stacked_trials_step_is_its_stack_and_epoch():
    """In stacks of 4 of 4 folds x 2 seeds and 2 epochs, step 3 is the second stack's (fold 3, seed
    1: its first run) first epoch; the one-by-one grid reads the same step as fold 1, seed 2, epoch 1."""
    from sweeper.validation.grid import RunGrid

    stacked, alone = RunGrid(4, 2, 2, stack=4), RunGrid(4, 2, 2)
    assert stacked.position(3) == (2, 0, 1) and alone.position(3) == (0, 1, 1)
    assert [stacked.step(f, r, 2) for f in range(4) for r in range(2)] == [2, 2, 2, 2, 4, 4, 4, 4]
    assert stacked.stacks() == [[(0, 0), (0, 1), (1, 0), (1, 1)], [(2, 0), (2, 1), (3, 0), (3, 1)]]
    assert stacked.step_of_row({"fold": "4", "repeat": "2", "epoch": "1"}) == 3


# ------------------------------------------------------------------ export


@pytest.mark.parametrize("name", ["trials.parquet", "trials.csv"])
def test_export_spreads_fold_lists_over_columns(wf, name):
    cli("export", str(wf["path"]), "-o", name)
    frame = pd.read_parquet(name) if name.endswith(".parquet") else pd.read_csv(name)
    rows = frame.set_index("number")
    for k, ics in FOLD_ICS.items():
        got = [rows.loc[k, f"user_attrs.fold_val_ic_{f}"] for f in range(1, 5)]
        assert got[:len(ics)] == ics and all(math.isnan(v) for v in got[len(ics):])
        assert json.loads(rows.loc[k, "user_attrs.fold_val_ic"]) == ics
    assert [rows.loc[0, f"user_attrs.fold_best_epoch_{f}"] for f in range(1, 5)] == [2, 3, 4, 5]
    columns = list(frame.columns)
    at = columns.index("user_attrs.fold_val_ic")
    assert columns[at + 1:at + 5] == [f"user_attrs.fold_val_ic_{f}" for f in range(1, 5)]
    assert "user_attrs.fold_dates_1" not in columns  # a list of dicts stays JSON text only


# ------------------------------------------------------------------ report


def test_report_figure_of_the_top_trials_fold_ics(wf):
    cli("report", str(wf["path"]), "-o", "r.html")
    page = (wf["root"] / "r.html").read_text()
    figures = figures_of(page)
    assert list(figures) == [*FIGURES, "folds"]
    fig = figures["folds"]
    ranked = sorted((t for t in wf["study"].get_trials(states=(TrialState.COMPLETE,))),
                    key=lambda t: (-t.value, t.number))[:10]
    meta = fig["layout"]["meta"]
    assert meta["trials"] == [t.number for t in ranked]
    assert meta["fold_val_ic"] == {str(t.number): FOLD_ICS[t.number] for t in ranked}
    assert meta["fold_dates"] == fold_dates()
    assert [tr["name"].split(" (")[0] for tr in fig["data"]] == [f"trial {t.number}" for t in ranked]
    d = fold_dates()
    assert fig["data"][0]["x"] == [f"fold {k + 1}<br>{' to '.join(d[k]['valid'])}" for k in range(4)]
    assert fig["data"][0]["y"] == FOLD_ICS[ranked[0].number]
    ics = FOLD_ICS[ranked[0].number]
    assert (f"valid IC per fold {', '.join(f'{v:.4f}' for v in ics)} (se {np.std(ics, ddof=1) / 2:.4f})"
            in page)
    sel = figures["selection"]["layout"]["meta"]["selection"]
    assert sel["se_from"] == "folds"
    assert sel["best_val_ic_se"] == pytest.approx(np.std(FOLD_ICS[ranked[0].number], ddof=1) / 2, rel=1e-12)


def test_report_of_a_holdout_study_says_it_has_no_folds(holdout):
    cli("report", str(holdout["path"]), "-o", "r.html")
    figures = figures_of(Path("r.html").read_text())
    assert list(figures) == list(FIGURES)  # no figure 13: the page is as it was
    assert "se_from" not in figures["selection"]["layout"]["meta"]["selection"]


# ------------------------------------------------------------------ dashboard


def test_dashboard_shows_the_fold_attrs(wf):
    from sweeper.config import load_config
    from sweeper.inspect.dashboard import app

    study_id = open_storage(f"sqlite:///{wf['root']}/runs/tiny/study.db").get_study_id_from_name("tiny")
    env: dict = {"PATH_INFO": f"/api/studies/{study_id}", "QUERY_STRING": "after=0"}
    setup_testing_defaults(env)
    status: list[str] = []
    body = b"".join(app(load_config(wf["path"]))(env, lambda s, h, *a: status.append(s)))
    assert status == ["200 OK"]
    detail = json.loads(body)
    study_attrs = {a["key"]: a["value"] for a in detail["user_attrs"]}
    assert json.loads(study_attrs["fold_dates"]) == fold_dates()
    for shown in detail["trials"]:
        if shown["number"] in FOLD_ICS:
            attrs = {a["key"]: a["value"] for a in shown["user_attrs"]}
            assert json.loads(attrs["fold_val_ic"]) == FOLD_ICS[shown["number"]]
            assert float(attrs["worst_fold_val_ic"]) == min(FOLD_ICS[shown["number"]])
    sortable = {a["key"]: a["sortable"] for a in detail["union_user_attrs"]}
    assert sortable["val_ic_se"] is True and sortable["fold_val_ic"] is False


# ------------------------------------------------------------------ a real sweep


@pytest.mark.slow
def test_a_real_walk_forward_sweep_shows_its_folds(study_file, workdir):
    """The worker's own attrs and files, read back by best, export and the report."""
    path = study_file({"validation": {"scheme": "walk_forward", "folds": 3, "repeats": 2},
                       "study": {"n_trials": 2}})
    sweeper_cli(workdir, "run", str(path))
    study = optuna.load_study(study_name="tiny", storage=open_storage(f"sqlite:///{workdir}/runs/tiny/study.db"))
    best = best_of(study)
    out = json.loads(cli("best", str(path), "--json"))
    assert out["trial"] == best.number and out["fold_dates"] == study.user_attrs["fold_dates"]
    for key in ("fold_val_ic", "val_ic_se", "worst_fold_val_ic", "seed_val_ic_sd"):
        assert out[key] == best.user_attrs[key], key
    ics = best.user_attrs["fold_val_ic"]
    assert len(ics) == 3 and out["selection"]["se_from"] == "folds"
    assert out["selection"]["best_val_ic_se"] == pytest.approx(np.std(ics, ddof=1) / math.sqrt(3), rel=1e-12)
    cli("export", str(path), "-o", "t.parquet")
    frame = pd.read_parquet("t.parquet").set_index("number")
    assert [frame.loc[best.number, f"user_attrs.fold_val_ic_{f}"] for f in (1, 2, 3)] == ics
    cli("report", str(path), "-o", "r.html")
    meta = figures_of(Path("r.html").read_text())["folds"]["layout"]["meta"]
    assert meta["trials"][0] == best.number and meta["fold_val_ic"][str(best.number)] == ics


def test_a_young_walk_forward_study_gets_a_placeholder(study_file, workdir):
    path = study_file({"validation": {"scheme": "walk_forward", "folds": FOLDS}})
    (workdir / "runs/tiny").mkdir(parents=True)
    study = optuna.create_study(study_name="tiny", direction="maximize",
                                storage=open_storage(f"sqlite:///{workdir}/runs/tiny/study.db"))
    study.set_user_attr("fold_dates", fold_dates())
    cli("report", str(path), "-o", "r.html")
    figures = figures_of(Path("r.html").read_text())
    empty = figures["folds"]["layout"]["meta"]
    assert empty == {"empty": "no complete trial with fold ICs (fold_val_ic) yet"}
    out = json.loads(cli("status", str(path), "--json"))
    assert out["fold_dates"] == fold_dates() and out["best"] is None and out["running"] == []
