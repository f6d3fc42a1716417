"""Warm starts (issue 22): study.warm_start, --enqueue and study.start_from_config, on real
SQLite studies with real sweeps (``sweeper run`` in this process, its workers forked)."""
from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml
from click.testing import CliRunner
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from conftest import sweeper_cli
from sweeper.cli import main
from sweeper.config import load_config
from sweeper.errors import StopRequested

pytestmark = pytest.mark.slow  # every test here starts a real process

REPO = Path(__file__).resolve().parent.parent
MARK = "warm_start_from"


def _sweeper(*args: object, code: int = 0) -> str:
    # in process (the warm start is the driver's decision, not a process's): its stdout and stderr
    return sweeper_cli(Path.cwd(), *map(str, args), code=code).output


def _trials(path: Path, storage: str | None = None) -> list[optuna.trial.FrozenTrial]:
    cfg = load_config(path)
    study = optuna.load_study(study_name=cfg.study.name, storage=storage or cfg.study.resolved_storage)
    return sorted(study.get_trials(), key=lambda t: t.number)


def _best_first(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    return sorted(done, key=lambda t: (-t.value, t.number))  # val_ic: maximize


def test_warm_start_runs_the_sources_best_first_once(study_file):
    a = study_file({"study": {"name": "a", "n_trials": 5, "start_from_config": False}}, name="a.yaml")
    _sweeper("run", a)
    best = _best_first(_trials(a))[:3]
    assert len(best) == 3 and all(MARK not in t.user_attrs for t in _trials(a))

    # no storage: this study's default, one database per study name, so study a's own (runs/a/study.db); it
    # was runs/b/study.db, which never holds a, so the key's documented default could not work
    warm = {"study": "a", "top_k": 3}
    b = study_file({"study": {"name": "b", "n_trials": 4, "warm_start": warm}}, name="b.yaml")
    out = _sweeper("run", b)
    assert f"enqueued 4 parameter sets ahead of the sampler's: a#{best[0].number}, a#{best[1].number}, " \
           f"a#{best[2].number}, the study file's own values (config)\n" in out
    trials = _trials(b)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    assert [t.params for t in trials[:3]] == [t.params for t in best]
    assert [t.user_attrs[MARK] for t in trials] == [f"a#{t.number}" for t in best] + ["config"]
    assert trials[3].params == {"train.lr": 0.001}  # the study file's own value, after the warm start

    Path("runs/a/study.db").unlink()  # a resume does not read the source again, nor enqueue its sets
    out = _sweeper("run", b, "--set", "study.n_trials=6")
    assert "enqueued" not in out
    trials = _trials(b)
    assert len(trials) == 6 and [t.state for t in trials] == [TrialState.COMPLETE] * 6
    assert [MARK in t.user_attrs for t in trials] == [True] * 4 + [False] * 2


def _source_study(url: str) -> None:
    """A finished study (maximize) with params this search space only partly takes."""
    study = optuna.create_study(storage=url, study_name="src", direction="maximize")
    lr, wide = FloatDistribution(1e-4, 1.0, log=True), FloatDistribution(0.0, 1.0)
    for value, params in ((0.1, {"train.lr": 0.004}), (0.3, {"train.lr": 0.002, "train.momentum": 0.9}),
                          (0.2, {"train.lr": 0.5, "train.momentum": 0.5})):
        dists = {"train.lr": lr, "train.momentum": wide}
        study.add_trial(create_trial(value=value, params=params, distributions={k: dists[k] for k in params}))


def test_enqueue_past_a_warm_start_cut_to_the_budget_is_told_the_budget_that_runs_all(study_file):
    # 3 warm-start sets and the config's, cut to n_trials 2: it said add n_trials=3, then refused again
    _source_study("sqlite:///src.db")
    warm = {"study": "src", "storage": "sqlite:///src.db", "top_k": 3}
    path = study_file({"study": {"name": "b", "n_trials": 2, "warm_start": warm}})
    Path("one.yaml").write_text("- {train.lr: 0.002}\n")
    out = _cli("run", path, "--enqueue", "one.yaml", code=2)
    assert ("study 'b' has 2 trials finished or queued ahead of its sets (study.n_trials 2), so 1 of its 1 set(s) "
            "would never run; add --set study.n_trials=4") in out and not Path("runs/b").exists()


def test_warm_start_drops_what_this_space_cannot_take(study_file):
    _source_study("sqlite:///src.db")
    warm = {"study": "src", "storage": "sqlite:///src.db", "top_k": 3}
    b = study_file({"study": {"name": "b", "n_trials": 3, "warm_start": warm}})
    out = _sweeper("run", b)
    assert "warm start: dropped train.momentum (not in this search space) from trial 1 of study 'src'" in out
    assert "warm start: dropped train.lr=0.5 (outside [0.001, 0.01]) from trial 2 of study 'src'" in out
    assert "warm start: dropped train.momentum (not in this search space) from trial 2 of study 'src'" in out
    assert ("warm start: skipped trial 2 of study 'src': none of its parameters is in this search space"
            in out)
    trials = _trials(b)
    assert [(t.params, t.user_attrs[MARK]) for t in trials] == [
        ({"train.lr": 0.002}, "src#1"), ({"train.lr": 0.004}, "src#0"), ({"train.lr": 0.001}, "config")]


def test_start_from_config_is_left_out_when_a_warm_start_set_equals_it(study_file):
    _source_study("sqlite:///src.db")
    warm = {"study": "src", "storage": "sqlite:///src.db", "top_k": 1}
    b = study_file({"study": {"name": "b", "n_trials": 2, "warm_start": warm}, "train": {"lr": 0.002}})
    out = _sweeper("run", b)
    assert "enqueued 1 parameter set ahead of the sampler's: src#1\n" in out
    trials = _trials(b)
    assert trials[0].params == {"train.lr": 0.002} and trials[0].user_attrs[MARK] == "src#1"
    assert MARK not in trials[1].user_attrs


def test_trial_0_of_transformer_ic_is_the_study_files_own_values(workdir):
    path = REPO / "studies" / "transformer_ic.yaml"
    # the study file's relative paths (--set's too) are taken from its folder: here, this test's
    tiny = {"study.storage": f"sqlite:///{workdir}/t.db", "study.artifacts": f"{workdir}/runs",
            "study.n_trials": 1, "data.synthetic.assets": 40, "data.synthetic.dates": 150, "train.epochs": 1,
            "train.samples_per_epoch": 512, "devices.gpus": "none", "devices.cpu_workers": 1}
    sets = [a for key, value in tiny.items() for a in ("--set", f"{key}={value}")]
    _sweeper("run", path, *sets)
    (trial,) = _trials(path, f"sqlite:///{workdir}/t.db")
    raw = yaml.safe_load(path.read_text())
    own = {key: raw[key.split(".")[0]][key.split(".")[1]] for key in raw["search_space"]}
    assert trial.params == own == {"train.lr": 0.003, "model.d_model": 32, "model.dropout": 0.0,
                                   "train.batch_size": 256, "train.weight_decay": 0.01}
    assert trial.state == TrialState.COMPLETE and trial.user_attrs[MARK] == "config"


def _cli(*args: object, code: int) -> str:
    result = CliRunner().invoke(main, list(map(str, args)), catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result.output


def test_a_create_stopped_once_its_config_was_stored_still_runs_the_files_values_once(study_file, monkeypatch):
    """Ctrl-C (or kill -9, or the store away) just after a new study's ``config`` attribute was stored left
    a study that looked created, and no later run enqueued the file's own values: they come first now."""
    path = study_file()
    real = optuna.Study.set_user_attr

    def stopped_after_config(self, key, value):
        real(self, key, value)
        if key == "config":
            raise StopRequested()

    monkeypatch.setattr(optuna.Study, "set_user_attr", stopped_after_config)
    assert CliRunner().invoke(main, ["db", "init", str(path)]).exit_code != 0
    monkeypatch.undo()
    _cli("db", "init", path, code=0)
    assert [t.user_attrs["warm_start_from"] for t in _trials(path)] == ["config"]


def test_enqueue_files(study_file):
    path = study_file({"study": {"n_trials": 3, "start_from_config": False}})
    Path("bad.yaml").write_text(yaml.safe_dump([{"train.lr": 0.005}, {"train.lr": 0.5}]))
    Path("unknown.yaml").write_text(yaml.safe_dump({"train": {"lr": 0.005, "momentum": 0.9}}))
    Path("broken.yaml").write_text("- train.lr: [0.005\n")
    out = _cli("run", path, "--enqueue", "bad.yaml", code=2)
    assert "bad.yaml: entry #1: train.lr=0.5 is outside [0.001, 0.01]" in out
    out = _cli("run", path, "--enqueue", "unknown.yaml", code=2)
    assert "unknown.yaml: entry #0: train.momentum is not a search_space key (the search space has: " \
           "train.lr)" in out
    assert "broken.yaml: line 2, column 1: YAML syntax error" in _cli("run", path, "--enqueue", "broken.yaml",
                                                                      code=2)
    assert "missing.yaml: --enqueue file not found" in _cli("run", path, "--enqueue", "missing.yaml", code=2)
    assert not Path("runs").exists()  # nothing written

    # a list, nested or dotted keys; YAML 1.1 reads 4e-3 as text, taken as the number it is
    Path("good.yaml").write_text("- {train.lr: 0.005}\n- train: {lr: 4e-3}\n")
    _sweeper("run", path, "--enqueue", "good.yaml", "--set", "study.n_trials=2")
    trials = _trials(path)
    assert [(t.params, t.user_attrs.get(MARK)) for t in trials] == [
        ({"train.lr": 0.005}, "good.yaml#0"), ({"train.lr": 0.004}, "good.yaml#1")]

    out = _cli("run", path, "--enqueue", "bad.yaml", code=2)  # an existing study is left untouched
    assert "entry #1" in out and len(_trials(path)) == 2
    Path("one.yaml").write_text(yaml.safe_dump({"train.lr": 0.003}))  # given again: applied again
    _sweeper("run", path, "--enqueue", "one.yaml")
    trials = _trials(path)
    assert len(trials) == 3 and (trials[2].params, trials[2].user_attrs[MARK]) == ({"train.lr": 0.003},
                                                                                  "one.yaml#0")
    # the budget is used: a set would wait for good (it did, with exit 0); refused, with what to add
    out = _cli("run", path, "--enqueue", "one.yaml", code=2)
    assert out.strip() == ("Error: --enqueue: study 'tiny' has 3 trials finished or queued ahead of its sets "
                           "(study.n_trials 3), so 1 of its 1 set(s) would never run; add --set study.n_trials=4")
    assert len(_trials(path)) == 3
    # room for one of two: the second waited for good, exit 0, and the run said nothing (nor for a new study)
    Path("two.yaml").write_text("- {train.lr: 0.002}\n- {train.lr: 0.001}\n")
    out = _cli("run", path, "--enqueue", "two.yaml", "--set", "study.n_trials=4", code=2)
    assert "so 1 of its 2 set(s) would never run; add --set study.n_trials=5" in out and len(_trials(path)) == 3
    out = _cli("run", path, "--enqueue", "two.yaml", "--set", "study.n_trials=2", "--set", "study.name=new",
               "--set", "study.start_from_config=true", code=2)
    assert ("study 'new' has 1 trials finished or queued ahead of its sets (study.n_trials 2), so 1 of its 2 set(s) "
            "would never run; add --set study.n_trials=3") in out and not Path("runs/new").exists()  # its config's


def test_an_enqueue_entry_whose_own_values_never_draw_one_of_its_keys_is_refused(study_file):
    # a trial would have dropped train.lr (its when is not met) and drawn nothing in its place, silently
    path = study_file({"study": {"n_trials": 3}, "search_space": {
        "train.loss": {"type": "categorical", "choices": ["mse", "ic"]},
        "train.lr": {"type": "float", "low": 1e-3, "high": 1e-2, "when": {"train.loss": "ic"}}}})
    Path("off.yaml").write_text("- {train.loss: ic, train.lr: 0.005}\n- {train.loss: mse, train.lr: 0.005}\n")
    out = _cli("run", path, "--enqueue", "off.yaml", code=2)
    assert out.strip() == ("Error: off.yaml: entry #1: train.lr is drawn only when {'train.loss': 'ic'}, which this "
                           "entry (or the study's own values) never meets: a trial would drop it")
    assert not Path("runs").exists()
    # a key whose condition the sampler draws is the trial's to judge
    from sweeper.study.warm_start import read_enqueue_file
    Path("drawn.yaml").write_text("- {train.lr: 0.005}\n")
    assert [s.params for s in read_enqueue_file("drawn.yaml", load_config(path))] == [{"train.lr": 0.005}]


def test_a_missing_source_is_an_error_before_anything_is_written(study_file):
    _source_study("sqlite:///src.db")
    for warm, message in (
        ({"study": "src", "storage": "sqlite:///nowhere.db"},
         "study.warm_start.storage: storage sqlite:///nowhere.db: no such database file nowhere.db"),
        ({"study": "gone", "storage": "sqlite:///src.db"},
         "study.warm_start.study: no study 'gone' in sqlite:///src.db (it holds: src)"),
    ):
        path = study_file({"study": {"warm_start": warm}})
        assert message in _cli("run", path, code=2)
        assert not Path("runs").exists()


def test_a_source_whose_completed_trials_all_break_its_constraints_says_so(study_file):
    # it said "has no completed trial to start from" beside 2 completed trials, both infeasible
    study = optuna.create_study(storage="sqlite:///src.db", study_name="src", direction="maximize")
    for value in (0.1, 0.2):
        study.add_trial(create_trial(value=value, params={"train.lr": 0.004}, constraints={"top_turnover": 0.1},
                                     distributions={"train.lr": FloatDistribution(1e-4, 1.0, log=True)}))
    path = study_file({"study": {"warm_start": {"study": "src", "storage": "sqlite:///src.db"}}})
    assert ("Error: study.warm_start.study: study 'src' has no completed feasible trial yet: every completed "
            "trial with a value (2) is outside study.constraints, to start from") in _cli("run", path, code=2)
    from sweeper.inspect.trials import top_trials
    from sweeper.errors import StudyNotFound

    with pytest.raises(StudyNotFound) as err:  # predict --trial top2: it said "0 completed trials"
        top_trials(study, 2)
    assert str(err.value) == "study 'src' has 0 completed trials within study.constraints; top2 needs 2"


def test_db_init_applies_the_warm_start_once(study_file):
    _source_study("sqlite:///src.db")
    warm = {"study": "src", "storage": "sqlite:///src.db", "top_k": 2}
    path = study_file({"study": {"name": "b", "warm_start": warm}})
    out = _cli("db", "init", path, code=0)
    assert "enqueued 2 parameter sets ahead of the sampler's: src#1, the study file's own values (config)\n" in out
    assert "enqueued" not in _cli("db", "init", path, code=0)  # already there: nothing enqueued again
    trials = _trials(path)
    # the top 2 are trials 1 and 2; nothing of trial 2 fits this space
    assert [(t.state, t.user_attrs[MARK]) for t in trials] == [(TrialState.WAITING, "src#1"),
                                                               (TrialState.WAITING, "config")]


def test_a_study_filled_by_hand_first_runs_what_it_holds(study_file):
    _source_study("sqlite:///src.db")
    warm = {"study": "src", "storage": "sqlite:///src.db", "top_k": 2}
    path = study_file({"study": {"name": "b", "warm_start": warm}})
    Path("runs/b").mkdir(parents=True)
    by_hand = optuna.create_study(study_name="b", storage="sqlite:///runs/b/study.db", direction="maximize")
    by_hand.enqueue_trial({"train.lr": 0.007})
    # --enqueue counts what it holds, not the warm-start and config sets it will not get (it counted
    # those 2, and 1 set past its budget of 3 would have waited for good)
    Path("two.yaml").write_text("- {train.lr: 0.002}\n- {train.lr: 0.001}\n")
    for _ in range(2):
        by_hand.enqueue_trial({"train.lr": 0.003})
    out = _cli("run", path, "--enqueue", "two.yaml", "--set", "study.n_trials=4", code=2)
    assert "study 'b' has 3 trials finished or queued ahead of its sets (study.n_trials 4), so 1 of its 2" in out
    assert "add --set study.n_trials=5" in out
    assert "enqueued" not in _cli("db", "init", path, code=0)
    assert [(t.state, t.user_attrs) for t in _trials(path)] == [(TrialState.WAITING, {})] * 3


SEARCHED_ONLY = '''from torch import nn


class Net(nn.Module):
    def __init__(self, n_features, lookback, depth=1, act="relu"):
        super().__init__()
        hidden = [nn.Tanh() if act == "tanh" else nn.ReLU(), nn.Linear(4, 4)] * (depth - 1)
        self.net = nn.Sequential(nn.Linear(n_features, 4), *hidden, nn.Linear(4, 1))

    def forward(self, x):
        return self.net(x[:, -1]).squeeze(-1)
'''


def test_a_user_models_argument_that_only_the_search_space_names_is_the_samplers(study_file):
    # depth and act are the constructor's, named only in search_space (act only when depth > 1):
    # the study file's own set leaves them to the sampler, as an --enqueue set's left-out keys
    Path("searched.py").write_text(SEARCHED_ONLY)
    space = {"train.lr": {"type": "float", "low": 1e-3, "high": 1e-2, "log": True},
             "model.depth": {"type": "int", "low": 1, "high": 3},
             "model.act": {"type": "categorical", "choices": ["relu", "tanh"],
                           "when": {"model.depth": [2, 3]}}}
    path = study_file({"study": {"n_trials": 3}, "model": {"name": "searched:Net"}, "train": {"lr": 0.004},
                       "search_space": space}, replace=("model", "search_space"))
    assert _cli("validate", path, code=0).startswith(f"{path}: ok\n")
    out = _sweeper("run", path)
    assert "enqueued 1 parameter set ahead of the sampler's: the study file's own values (config)\n" in out
    assert "start from config" not in out
    trials = _trials(path)
    assert [(t.state, t.user_attrs.get(MARK)) for t in trials] == [
        (TrialState.COMPLETE, "config"), (TrialState.COMPLETE, None), (TrialState.COMPLETE, None)]
    assert trials[0].params["train.lr"] == 0.004
    for t in trials:  # act is sampled exactly where its condition on the sampled depth holds
        act = {"model.act"} if t.params["model.depth"] > 1 else set()
        assert set(t.params) == {"train.lr", "model.depth"} | act
