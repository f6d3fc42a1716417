"""study.constraints (issue 21, item 4): the valid-split figures a trial is judged on, Optuna's
constraint values, the one order (store.studies.ranked) that leaves infeasible trials out, and a
real sweep where the trial with the highest val IC breaks its turnover bound."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
import yaml
from click.testing import CliRunner
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from conftest import TINY, merge, sweeper_cli
from sweeper.cli import main
from sweeper.config.long_sweeps import Bound
from sweeper.quant.ensemble import ensemble
from sweeper.store import open_storage
from sweeper.store.studies import best_in, feasible, n_infeasible, ranked
from sweeper.worker.constraints import UNDEFINED, constraint_values, record, valid_figures, violation

LRS = (0.001, 0.0015, 0.0025, 0.004, 0.006, 0.01)  # the enqueued sets: both runs train the same trials


def test_violation_is_the_distance_outside_the_bound():
    assert violation(0.7, Bound(max=0.5)) == pytest.approx(0.2)
    assert violation(0.3, Bound(max=0.5)) == pytest.approx(-0.2)
    assert violation(0.5, Bound(max=0.5)) == 0.0  # on the bound: feasible (<= 0)
    assert violation(0.5, Bound(min=1.0)) == pytest.approx(0.5)
    assert violation(2.0, Bound(min=1.0)) == pytest.approx(-1.0)
    assert violation(0.2, Bound(min=0.0, max=1.0)) == pytest.approx(-0.2)  # the nearer end
    assert violation(1.5, Bound(min=0.0, max=1.0)) == pytest.approx(0.5)
    assert violation(None, Bound(max=0.5)) == UNDEFINED == 1.0  # undefined: not shown feasible
    figures = {"valid_top_turnover": 0.6, "valid_long_short_sharpe": 0.5}
    bounds = {"top_turnover": Bound(max=0.5), "long_short_sharpe": Bound(min=1.0)}
    want = {"long_short_sharpe": 0.5, "top_turnover": 0.1}
    assert constraint_values(figures, bounds) == pytest.approx(want)
    assert list(constraint_values(figures, bounds)) == ["long_short_sharpe", "top_turnover"]  # sorted
    assert constraint_values(figures, {}) == {}


def test_valid_figures_by_hand():
    # q=2 buckets of 2 assets, every date (h=1); the bottom bucket's labels are 0, so ls = the top's
    tops = [("a", "b"), ("a", "c"), ("a", "c")]  # turnover: 1 - 1/2, then 1 - 2/2: mean 0.25
    ls = [1.0, 2.0, 3.0]  # mean 2, std 1: Sharpe 2 * sqrt(252)
    rows = []
    for day, (top, value) in enumerate(zip(tops, ls)):
        for asset in "abcd":
            up = asset in top
            rows.append({"date": pd.Timestamp("2020-01-01") + pd.Timedelta(days=day), "asset": asset,
                         "pred": 1.0 if up else -1.0, "label": value if up else 0.0})
    figures = valid_figures(pd.DataFrame(rows), horizon=1, quantiles=2)
    want = {"valid_top_turnover": 0.25, "valid_long_short_sharpe": 2 * math.sqrt(252)}
    assert figures == pytest.approx(want)
    few = pd.DataFrame(rows[:3])  # no date with 2q rows: both undefined
    assert valid_figures(few, horizon=1, quantiles=2) == {"valid_top_turnover": None,
                                                           "valid_long_short_sharpe": None}


def _sqlite_study(tmp_path: Path) -> optuna.Study:
    return optuna.create_study(study_name="c", direction="maximize",
                               storage=open_storage(f"sqlite:///{tmp_path}/c.db"))


def test_record_sets_optunas_constraints_before_the_tell(tmp_path):
    study = _sqlite_study(tmp_path)
    bounds = {"top_turnover": Bound(max=0.5)}
    for turnover, value in ((0.7, 0.9), (0.4, 0.2), (None, 0.95)):
        trial = study.ask()
        attrs = record(trial, {"valid_top_turnover": turnover, "valid_long_short_sharpe": 1.5}, bounds)
        assert attrs == {"valid_top_turnover": turnover, "valid_long_short_sharpe": 1.5,
                         "feasible": turnover == 0.4}
        study.tell(trial, value)
    trials = study.get_trials()
    assert [t.constraints for t in trials] == [{"top_turnover": pytest.approx(0.2)},
                                               {"top_turnover": pytest.approx(-0.1)}, {"top_turnover": 1.0}]
    assert trials[0].system_attrs["constraints:top_turnover"] == pytest.approx(0.2)  # Optuna 5's key
    assert [feasible(t) for t in trials] == [False, True, False]
    assert study.best_trial.number == 1  # Optuna reads the same values: its best is feasible too
    assert best_in(trials, maximize=True).number == 1
    trial = study.ask()  # no bounds: the figures only, no constraint and no feasible mark
    assert record(trial, {"valid_top_turnover": 0.7, "valid_long_short_sharpe": None}, {}) == {
        "valid_top_turnover": 0.7, "valid_long_short_sharpe": None}
    study.tell(trial, 0.99)
    assert study.get_trials()[-1].constraints == {}


def _done(number: int, value: float, constraints: dict[str, float] | None = None,
          state: TrialState = TrialState.COMPLETE):
    trial = create_trial(state=state, value=value if state == TrialState.COMPLETE else None,
                         params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)},
                         constraints=constraints)
    trial.number = number
    return trial


def test_ranked_leaves_infeasible_trials_out():
    trials = [
        _done(0, 0.10, {"top_turnover": -0.1}),
        _done(1, 0.30, {"top_turnover": 0.05}),  # the highest value, but infeasible
        _done(2, 0.20),  # no constraint values: feasible (a study from before the constraints)
        _done(3, 0.20, {"top_turnover": 0.0, "long_short_sharpe": -1.0}),  # on the bound: feasible
        _done(4, 0.25, {"top_turnover": -0.2, "long_short_sharpe": 0.3}),  # one of two broken
        _done(5, 0.50, {"top_turnover": 0.4}, state=TrialState.PRUNED),  # not COMPLETE: never ranked
        _done(6, 0.90, state=TrialState.FAIL),
    ]
    assert [t.number for t in ranked(trials, maximize=True)] == [2, 3, 0]
    assert [t.number for t in ranked(trials, maximize=False)] == [0, 2, 3]
    assert best_in(trials, maximize=True).number == 2
    assert n_infeasible(trials) == 2  # trials 1 and 4; the PRUNED one is not counted
    assert best_in([trials[1], trials[4]], maximize=True) is None


# --- a real sweep ----------------------------------------------------------------------------

def _cli(root: Path, monkeypatch, *args: str) -> str:
    monkeypatch.chdir(root)
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _sweep(root: Path, constraints: dict | None) -> optuna.Study:
    """The TINY study, with the six LRS sets enqueued (both runs train the same six trials)."""
    root.mkdir()
    study = {"name": "feas", "n_trials": len(LRS), "start_from_config": False}
    if constraints:
        study["constraints"] = constraints
    (root / "study.yaml").write_text(yaml.safe_dump(merge(TINY, {"study": study})))
    (root / "sets.yaml").write_text(yaml.safe_dump([{"train.lr": lr} for lr in LRS]))
    sweeper_cli(root, "run", "study.yaml", "--enqueue", "sets.yaml")
    found = optuna.load_study(study_name="feas", storage=open_storage(f"sqlite:///{root}/runs/feas/study.db"))
    assert [t.state for t in found.get_trials()] == [TrialState.COMPLETE] * len(LRS)
    return found


@pytest.fixture(scope="module")
def constrained(tmp_path_factory):
    """Run once unbounded to read the trials' own turnovers; then bound top_turnover between
    the 3rd and 4th lowest, so that half of the same six trials break it."""
    base = tmp_path_factory.mktemp("constraints")
    free = _sweep(base / "free", None)
    turnovers = sorted(t.user_attrs["valid_top_turnover"] for t in free.get_trials())
    assert turnovers[2] < turnovers[3], turnovers  # a bound can split the trials 3 / 3
    bound = (turnovers[2] + turnovers[3]) / 2
    study = _sweep(base / "bound", {"top_turnover": {"max": bound}})
    return {"root": base / "bound", "free": free, "study": study, "bound": bound}


@pytest.mark.slow
def test_the_worker_records_the_figures_and_optunas_constraints(constrained, monkeypatch):
    study, bound = constrained["study"], constrained["bound"]
    free = {t.params["train.lr"]: t for t in constrained["free"].get_trials()}
    for t in study.get_trials():
        turnover = t.user_attrs["valid_top_turnover"]
        twin = free[t.params["train.lr"]]  # the same trial, trained without the bound
        assert turnover == twin.user_attrs["valid_top_turnover"] and t.value == twin.value
        assert t.user_attrs["valid_long_short_sharpe"] == twin.user_attrs["valid_long_short_sharpe"]
        assert t.constraints == {"top_turnover": pytest.approx(turnover - bound)}
        assert t.user_attrs["feasible"] is (turnover <= bound)
        assert twin.constraints == {} and "feasible" not in twin.user_attrs
        # the figure is sweeper's own long-short view of the trial's valid predictions
        _cli(constrained["root"], monkeypatch, "predict", "study.yaml", "--trial", str(t.number),
             "-o", f"v{t.number}.parquet")
        frame = pd.read_parquet(constrained["root"] / f"v{t.number}.parquet")
        assert valid_figures(frame.astype({"pred": "float64", "label": "float64"}), 2, 5)[
            "valid_top_turnover"] == pytest.approx(turnover, abs=1e-12)


@pytest.mark.slow
def test_best_picks_the_best_feasible_trial(constrained, monkeypatch):
    study, bound, root = constrained["study"], constrained["bound"], constrained["root"]
    trials = study.get_trials()
    good = sorted((t for t in trials if t.user_attrs["valid_top_turnover"] <= bound), key=lambda t: -t.value)
    bad = [t for t in trials if t.user_attrs["valid_top_turnover"] > bound]
    assert len(good) == len(bad) == 3
    assert max(t.value for t in bad) > good[0].value  # an infeasible trial has the higher val IC
    best = json.loads(_cli(root, monkeypatch, "best", "study.yaml", "--json"))
    assert best["trial"] == good[0].number == study.best_trial.number  # Optuna agrees
    assert best["value"] == good[0].value
    assert best["infeasible"] == 3
    assert best["constraints"] == {"top_turnover": {"max": bound,
                                                    "best": good[0].user_attrs["valid_top_turnover"]}}
    assert best["ensemble"]["trials"] == [good[0].number, good[1].number, good[2].number]
    text = _cli(root, monkeypatch, "best", "study.yaml")
    assert (f"constraints (valid split): top_turnover <= {bound:g} (best "
            f"{good[0].user_attrs['valid_top_turnover']:.4f}); infeasible: 3 completed trials, "
            "not ranked") in text
    free = json.loads(_cli(root.parent / "free", monkeypatch, "best", "study.yaml", "--json"))
    assert free["infeasible"] == 0 and "constraints" not in free
    assert free["trial"] == max(constrained["free"].get_trials(), key=lambda t: t.value).number


@pytest.mark.slow
def test_predict_best_and_topk_use_feasible_trials_only(constrained, monkeypatch):
    study, bound, root = constrained["study"], constrained["bound"], constrained["root"]
    good = sorted((t for t in study.get_trials() if t.user_attrs["valid_top_turnover"] <= bound),
                  key=lambda t: -t.value)
    out = _cli(root, monkeypatch, "predict", "study.yaml", "--trial", "best", "-o", "best.parquet")
    assert f"wrote best.parquet: trial {good[0].number}, split valid" in out
    out = _cli(root, monkeypatch, "predict", "study.yaml", "--trial", "top2", "-o", "top2.parquet")
    assert f"top2.parquet: top2 ensemble of trials {good[0].number}, {good[1].number}, split valid" in out
    members = []
    for t in good[:2]:
        name = f"m{t.number}.parquet"
        _cli(root, monkeypatch, "predict", "study.yaml", "--trial", str(t.number), "-o", name)
        members.append(pd.read_parquet(root / f"m{t.number}.parquet"))
    pd.testing.assert_frame_equal(pd.read_parquet(root / "best.parquet"), members[0])
    top2 = pd.read_parquet(root / "top2.parquet")
    assert len(top2) == len(members[0]) > 0
    np.testing.assert_allclose(top2["pred"], ensemble(members)["pred"], rtol=1e-6, atol=1e-9)


@pytest.mark.slow
def test_what_optuna_dashboard_shows(constrained):
    """optuna-dashboard 0.21 reads only the old list key ``constraints``, so it shows these trials
    as feasible and its Best Trial card ignores the bounds; it does show the user attributes
    (docs/inspect.md, "Feasible trials"). An upgrade that reads ``constraints:<name>`` fails here."""
    from optuna_dashboard._serializer import serialize_frozen_trial

    study, bound = constrained["study"], constrained["bound"]
    storage = open_storage(f"sqlite:///{constrained['root']}/runs/feas/study.db")
    study_id = storage.get_study_id_from_name("feas")
    for t in study.get_trials():
        shown = serialize_frozen_trial(study_id, storage.get_trial(t._trial_id), {})
        assert shown["constraints"] == []
        attrs = {a["key"]: a["value"] for a in shown["user_attrs"]}
        assert attrs["feasible"] == str(t.user_attrs["valid_top_turnover"] <= bound)
        assert attrs["valid_top_turnover"] == str(t.user_attrs["valid_top_turnover"])
    card = storage.get_best_trial(study_id)  # what the dashboard's Best Trial card shows
    assert card.number == max(study.get_trials(), key=lambda t: t.value).number
    assert not feasible(card)


def test_best_when_every_trial_is_infeasible(study_file, workdir):
    path = study_file({"study": {"constraints": {"top_turnover": {"max": 0.1}}}})
    (workdir / "runs" / "tiny").mkdir(parents=True)
    study = optuna.create_study(study_name="tiny", direction="maximize",
                                storage=open_storage(f"sqlite:///{workdir}/runs/tiny/study.db"))
    study.add_trial(create_trial(value=0.2, params={"train.lr": 0.005},
                                 distributions={"train.lr": FloatDistribution(1e-3, 1e-2, log=True)},
                                 constraints={"top_turnover": 0.3}))
    none = "study 'tiny' has no completed feasible trial yet: every completed trial with a value (1) is outside " \
           "study.constraints"
    # best, predict and refit say so alike (predict and refit said there was no completed trial at all)
    for args in (["best"], ["predict", "-o", str(workdir / "p.parquet")], ["refit"]):
        result = CliRunner().invoke(main, [args[0], str(path), *args[1:]], catch_exceptions=False)
        assert result.exit_code == 2, result.output
        assert result.output.strip().splitlines()[-1] == "Error: " + none


def test_changing_the_constraints_of_a_study_is_drift():
    from conftest import TINY, merge
    from sweeper.config import drift, to_dict, validate_config

    before = to_dict(validate_config(TINY, "tiny"))
    after = to_dict(validate_config(merge(TINY, {"study": {"constraints": {"top_turnover": {"max": 0.5}}}}),
                                    "tiny"))
    # a resume with other bounds is refused unless --force (which GP would then refuse to mix)
    # the bound alone: the empty section it replaced is no key (it read "({} -> '<unset>')", backwards)
    assert drift(before, after) == ["study.constraints.top_turnover.max ('<unset>' -> 0.5)"]
    assert drift(after, before) == ["study.constraints.top_turnover.max (0.5 -> '<unset>')"]
    assert drift(after, after) == []
