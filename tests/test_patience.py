"""study.patience_trials: the count over stored trials (pure), and a real sweep that stops on it."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from conftest import sweeper_cli
from sweeper.config import load_config
from sweeper.dispatch.stopping import Ending, StopRule, patience
from sweeper.interrupt import StopToken
from sweeper.store.studies import FINISHED

T0 = dt.datetime(2024, 1, 1)


def _trial(number, state, value=None, at=None):
    """A stored-looking trial that finished ``at`` seconds after T0 (default: its number)."""
    t = create_trial(state=state, value=value)
    t.number = number
    t.datetime_complete = T0 + dt.timedelta(seconds=number if at is None else at)
    return t


C, P, F = TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL


def test_counts_finished_trials_since_the_last_new_best():
    trials = [_trial(0, C, 0.01), _trial(1, C, 0.005), _trial(2, P), _trial(3, C, 0.02), _trial(4, C, 0.02),
              _trial(5, P), _trial(6, F)]
    got = patience(trials, maximize=True, min_improvement=0.0)
    # 3 is the last new best; 4 (equal, not better), 5 (pruned) count; a FAIL is not finished
    assert (got.count, got.best.number) == (2, 3)


def test_min_improvement_is_a_margin_the_best_must_beat():
    trials = [_trial(0, C, 0.010), _trial(1, C, 0.0149), _trial(2, C, 0.0151), _trial(3, C, 0.0199)]
    got = patience(trials, maximize=True, min_improvement=0.005)
    # 1 beats 0 by 0.0049 (no new best); 2 by 0.0051 (new best); 3 beats 2 by 0.0048 (no new best)
    assert (got.count, got.best.number) == (1, 2)
    assert patience(trials, maximize=True, min_improvement=0.0).count == 0


def test_direction_minimize():
    trials = [_trial(0, C, 1.0), _trial(1, C, 0.9), _trial(2, C, 1.1), _trial(3, C, 0.95)]
    got = patience(trials, maximize=False, min_improvement=0.0)
    assert (got.count, got.best.number) == (2, 1)
    got = patience(trials, maximize=True, min_improvement=0.0)
    assert (got.count, got.best.number) == (1, 2)


def test_ordered_by_completion_not_number():
    # trial 2 finished first, then 0, then 1: 2 is the first best, 0 worse, 1 better
    trials = [_trial(0, C, 0.01, at=20), _trial(1, C, 0.03, at=30), _trial(2, C, 0.02, at=10)]
    got = patience(trials, maximize=True, min_improvement=0.0)
    assert (got.count, got.best.number) == (0, 1)
    trials[1].datetime_complete = T0 + dt.timedelta(seconds=5)  # now 1 first: 2 and 0 add one each
    got = patience(trials, maximize=True, min_improvement=0.0)
    assert (got.count, got.best.number) == (2, 1)


def test_no_complete_trial_counts_every_finished_one():
    trials = [_trial(0, P), _trial(1, P), _trial(2, C, float("inf")), _trial(3, TrialState.RUNNING)]
    got = patience(trials, maximize=True, min_improvement=0.0)
    assert (got.count, got.best) == (3, None)


@pytest.fixture
def rule(study_file):
    def make(**study):
        cfg = load_config(study_file({"study": study}))
        return StopRule(cfg.study, StopToken(), Path("runs/tiny"))
    return make


def test_stop_rule_stops_done_with_one_line(rule):
    r = rule(patience_trials=2, min_improvement=0.001)
    r.seen([_trial(0, C, 0.01), _trial(1, C, 0.0105)])
    assert not r.stopping()
    r.seen([_trial(0, C, 0.01), _trial(1, C, 0.0105), _trial(2, P)])
    assert r.stopping() and r.ending() is Ending.DONE
    # no best named: a trial running when the claim decided may end as one (the run's best line names it)
    assert r.message == ("stopped: no new best beyond study.min_improvement (0.001) in the last 2 finished "
                         "trials (study.patience_trials)")


def test_stop_rule_without_patience_never_stops_on_it(rule):
    r = rule()
    r.seen([_trial(n, P) for n in range(50)])
    assert not r.stopping()


def _finished_in_order(study):
    done = [t for t in study.get_trials() if t.state in FINISHED]
    return sorted(done, key=lambda t: (t.datetime_complete, t.number))


def _sweep(path):
    # in process: when to stop is the driver's decision (its stdout and stderr apart, as a process's)
    return sweeper_cli(Path.cwd(), "run", str(path))


@pytest.mark.slow
def test_a_sweep_stops_on_patience_study_wide(study_file):
    # one worker: each claim reads the study right after the previous trial ended, so the
    # sweep stops exactly when the count first reaches patience_trials
    path = study_file({"study": {"n_trials": 30, "patience_trials": 2}, "devices": {"cpu_workers": 1}})
    proc = _sweep(path)
    assert proc.exit_code == 0, proc.stdout + proc.stderr
    study = optuna.load_study(study_name="tiny", storage="sqlite:///runs/tiny/study.db")
    finished = _finished_in_order(study)
    assert 2 <= len(finished) < 30
    assert not study.get_trials(states=(TrialState.RUNNING, TrialState.FAIL))
    counts = [patience(finished[:k], maximize=True, min_improvement=0.0).count
              for k in range(1, len(finished) + 1)]
    assert counts[-1] == 2 and max(counts[:-1]) < 2
    line = "stopped: no new best beyond study.min_improvement (0) in the last 2 finished trials (study.patience_trials)"
    assert proc.stdout.count(line) + proc.stderr.count(line) == 1, proc.stdout + proc.stderr
    # another driver (a later run) reads the same stored trials: it stops before claiming any
    again = _sweep(path)
    assert again.exit_code == 0, again.stdout + again.stderr
    assert len(study.get_trials()) == len(finished)
    assert line in again.stdout + again.stderr
