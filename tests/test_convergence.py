"""study.stop_when_converged: Optuna's Terminator judged on a real SQLite study's trials, whose
fold scores were reported with report_scores on real Trials (sweeper.study.convergence), and
the stop rule's one line."""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from conftest import sweeper_cli
from sweeper.config import StudyConfig, SweeperConfig
from sweeper.dispatch.stopping import Ending, StopRule
from sweeper.interrupt import StopToken
from sweeper.study.convergence import Watch, judge, min_trials, report_scores

LINE = re.compile(
    r"stopped: Optuna's Terminator judges the study converged after (\d+) complete trials: the regret "
    r"bound (\S+) is below the cross-validation error (\S+) of the best trial's scores \(trial (\d+)\) "
    r"\(study.stop_when_converged\)")


def _study(tmp_path, direction="maximize") -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", direction=direction,
                               sampler=optuna.samplers.RandomSampler(seed=0))


# how much easier or harder each fold's period is, for every config alike: walk-forward's large
# fold noise, which the trials' means do not see
FOLD_EFFECT = np.array([0.0, 0.04, -0.03, 0.02])


def _run(study: optuna.Study, n: int, signal, folds: float, noise: float = 1e-3, seed: int = 0) -> None:
    """``n`` trials over lr and dropout, each telling the mean of 4 fold scores: ``signal(i, lr)``
    plus ``folds`` x FOLD_EFFECT plus noise of sd ``noise``; report_scores before the tell, as
    the worker does."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        trial = study.ask()
        lr = trial.suggest_float("train.lr", 1e-4, 1e-2, log=True)
        trial.suggest_float("model.dropout", 0.0, 0.5)
        scores = [float(s) for s in signal(i, lr) + folds * FOLD_EFFECT + rng.normal(0.0, noise, 4)]
        report_scores(trial, scores)
        trial.set_user_attr("fold_val_ic", scores)
        study.tell(trial, float(np.mean(scores)))


def _flat(i, lr):  # tiny improvements: every config is alike to 2e-4
    return 0.03 + 1e-4 * math.log10(lr)


def _steady(i, lr):  # a strong dependence on lr that the study is still climbing
    return 0.2 * math.log10(lr) + 0.001 * i


def _cfg(**study) -> StudyConfig:
    return SweeperConfig.model_validate(
        {"study": {"name": "c", **study}, "validation": {"scheme": "walk_forward"},
         "data": {"synthetic": {"assets": 24, "dates": 160, "features": 3}}}).study


def _rule(tmp_path, **study) -> StopRule:
    return StopRule(_cfg(stop_when_converged=True, **study), StopToken(), tmp_path)


def _sd_error(scores: list[float]) -> float:
    # the Terminator's cross-validation error: sqrt((1/k + 1/(k-1)) * var(scores, ddof=0))
    k = len(scores)
    return math.sqrt((1 / k + 1 / (k - 1)) * float(np.var(scores)))


def test_noisy_flat_study_converges_with_one_line(tmp_path):
    study = _study(tmp_path)
    _run(study, 30, _flat, folds=1.0)
    trials = study.get_trials(deepcopy=False)
    got = judge(trials, maximize=True, min_n_trials=20)
    best = max((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: t.value)
    assert (got.complete, got.best) == (30, best.number)
    assert got.error == pytest.approx(_sd_error(best.user_attrs["fold_val_ic"]), rel=1e-12)
    assert got.converged and 0 < got.regret_bound < got.error

    rule = _rule(tmp_path)
    assert not rule.stopping()
    rule.seen(trials)
    assert rule.stopping() and rule.converged and rule.ending() is Ending.DONE
    m = LINE.fullmatch(rule.message)
    assert m, rule.message
    assert m.groups() == ("30", f"{got.regret_bound:.2g}", f"{got.error:.2g}", str(best.number))


def test_steady_improvement_and_small_noise_go_on(tmp_path):
    study = _study(tmp_path)
    _run(study, 30, _steady, folds=0.0, noise=1e-4)
    trials = study.get_trials(deepcopy=False)
    got = judge(trials, maximize=True, min_n_trials=20)
    assert got is not None and not got.converged and got.regret_bound > got.error
    rule = _rule(tmp_path)
    rule.seen(trials)
    assert not rule.stopping() and rule.message == ""


def test_too_few_trials_are_not_judged(tmp_path):
    # the same noisy flat study as the converging one, stopped at 19 trials: below Optuna's 20
    study = _study(tmp_path)
    _run(study, 19, _flat, folds=1.0)
    trials = study.get_trials(deepcopy=False)
    assert judge(trials, maximize=True, min_n_trials=20) is None
    rule = _rule(tmp_path)
    rule.seen(trials)
    assert not rule.stopping()
    # a sampler's start-up trials raise the floor
    assert min_trials({}) == 20 and min_trials({"n_startup_trials": 10}) == 20
    assert min_trials({"n_startup_trials": 35}) == 35
    rule = _rule(tmp_path, sampler={"name": "tpe", "options": {"n_startup_trials": 35}})
    assert rule.watch.min_n_trials == 35


def test_a_best_trial_without_scores_is_skipped(tmp_path):
    # trials from before scores were reported (or an enqueued one told by hand): the best of them
    # has no cv scores, so the Terminator cannot say how noisy it is: no judgement, no crash
    study = _study(tmp_path)
    _run(study, 30, _flat, folds=1.0)
    dist = {"train.lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True),
            "model.dropout": optuna.distributions.FloatDistribution(0.0, 0.5)}
    study.add_trial(optuna.trial.create_trial(params={"train.lr": 1e-3, "model.dropout": 0.1},
                                              distributions=dist, value=0.9))
    trials = study.get_trials(deepcopy=False)
    assert judge(trials, maximize=True, min_n_trials=20) is None
    rule = _rule(tmp_path)
    rule.seen(trials)
    assert not rule.stopping()


def test_minimize_judges_the_lowest_trial(tmp_path):
    study = _study(tmp_path, direction="minimize")
    _run(study, 30, lambda i, lr: 1.0 - _flat(i, lr), folds=1.0)
    trials = study.get_trials(deepcopy=False)
    got = judge(trials, maximize=False, min_n_trials=20)
    best = min((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: t.value)
    assert got.best == best.number and got.converged
    rule = _rule(tmp_path, metric="val_loss")
    rule.seen(trials)
    assert rule.converged and f"(trial {best.number})" in rule.message


def test_the_watch_judges_again_only_when_complete_trials_change(tmp_path):
    study = _study(tmp_path)
    _run(study, 25, _steady, folds=0.0, noise=1e-4)
    watch = Watch(maximize=True, min_n_trials=20)
    assert watch.converged(study.get_trials()) is None
    first = watch.last
    assert first is not None and watch.judged_at == 25
    # a claim that reads the same COMPLETE trials (one more RUNNING) fits no GP
    study.ask()
    assert watch.converged(study.get_trials()) is None and watch.last is first
    _run(study, 1, _steady, folds=0.0, noise=1e-4)
    watch.converged(study.get_trials())
    assert watch.judged_at == 26 and watch.last is not first


def test_off_by_default(tmp_path):
    assert StopRule(_cfg(), StopToken(), tmp_path).watch is None


@pytest.mark.slow
def test_a_walk_forward_sweep_stops_when_converged(study_file):
    # a learning rate that barely varies: every trial is alike but for its seedless noise, while
    # the tiny panel's folds differ a lot; one worker, so each claim reads the study right after
    # the previous trial ended and the sweep stops at the first judgement that says converged
    path = study_file({"study": {"n_trials": 30, "stop_when_converged": True}, "devices": {"cpu_workers": 1},
                       "validation": {"scheme": "walk_forward", "folds": 3},
                       "search_space": {"train.lr": {"type": "float", "low": 0.003, "high": 0.0031}}})
    proc = sweeper_cli(Path.cwd(), "run", str(path))  # in process: stopping is the driver's decision
    study = optuna.load_study(study_name="tiny", storage="sqlite:///runs/tiny/study.db")
    done = sorted(study.get_trials(states=(TrialState.COMPLETE,)),
                  key=lambda t: (t.datetime_complete, t.number))
    assert 20 <= len(done) < 30 and len(study.get_trials()) == len(done)
    for t in done:  # the worker reported each trial's fold scores to the Terminator
        assert t.system_attrs["terminator:cv_scores"] == t.user_attrs["fold_val_ic"]
        assert len(t.user_attrs["fold_val_ic"]) == 3
    verdicts = [judge(done[:k], maximize=True, min_n_trials=20) for k in range(20, len(done) + 1)]
    assert verdicts[-1].converged and not any(v.converged for v in verdicts[:-1])
    line = f"stopped: {verdicts[-1].reason()} (study.stop_when_converged)"
    assert (proc.stdout + proc.stderr).count(line) == 1, proc.stdout + proc.stderr
