"""Time limits end trials, they don't destroy them: ``train.max_minutes`` is the core's own
deadline (the epoch ends, the trial is scored and COMPLETEs); the driver kills only a trial
that overstays it by the grace; ``study.timeout`` stops starting trials."""
from __future__ import annotations

import math
import time

import optuna
import pytest
from optuna.trial import TrialState

from conftest import PROBE
from sweeper.config import load_config
from sweeper.core import NullHook, train
from sweeper.dispatch.driver import TIMEOUT_GRACE_MIN_S, timeout_grace_s
from sweeper.dispatch.live import NullView
from sweeper.dispatch.run import run
from toy_panel import toy_config, toy_panel


def _sweep(path):
    cfg = load_config(path)
    outcome = run(cfg, view=NullView())
    return outcome, optuna.load_study(study_name=cfg.study.name, storage=cfg.study.resolved_storage)


class Counter(NullHook):
    def __init__(self):
        self.steps = self.ticks = 0

    def should_stop(self):
        self.steps += 1
        return False

    def tick(self):
        self.ticks += 1


def test_the_deadline_counts_from_the_given_start_and_evaluation_ticks():
    hook = Counter()
    # the trial began two minutes ago (say, a slow data load): one step, then validate and score
    result = train(toy_config(epochs=5, max_minutes=1), toy_panel(), hook=hook, started=time.monotonic() - 120)
    assert (result.stop_reason, result.metrics["epochs_run"], hook.steps) == ("time", 1, 1)
    assert math.isfinite(result.metrics["test_ic"])
    # eval batch 256 over 310 valid and 341 test windows: 2 batches each. The epoch's validation (2),
    # then the final scores: valid from that validation (a stack of one's best epoch: no batch), test
    # (2), and one tick per split once scored
    assert hook.ticks == 2 + (0 + 1) + (2 + 1)


def test_the_grace_is_a_fifth_of_the_limit_and_at_least_two_minutes(monkeypatch):
    monkeypatch.delenv("SWEEPER_FAKE_TIMEOUT_GRACE_S", raising=False)
    assert TIMEOUT_GRACE_MIN_S == 120
    assert timeout_grace_s(10) == 120 and timeout_grace_s(60) == 720
    monkeypatch.setenv("SWEEPER_FAKE_TIMEOUT_GRACE_S", "1")
    assert timeout_grace_s(0.02) == 1 and timeout_grace_s(60) == 720


@pytest.mark.slow
def test_trials_that_reach_max_minutes_complete_with_stop_reason_time(study_file):
    path = study_file({
        "study": {"n_trials": 2},
        "model": {"name": "fault_models:Slow", "step_sleep": 0.05, "hidden": 8},
        # patience past the 15 epochs the clock allows: the stop is the clock's, however the IC moves
        "train": {"epochs": 200, "batch_size": 128, "samples_per_epoch": 512, "max_minutes": 0.05, "patience": 100},
    }, replace=("model",))
    outcome, study = _sweep(path)
    assert outcome.exit_code == 0
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2
    for t in trials:
        ua = t.user_attrs
        assert ua["stop_reason"] == "time"
        assert 1 <= ua["epochs_run"] < 200 and 1 <= ua["best_epoch"] <= ua["epochs_run"]
        assert math.isfinite(ua["test_ic"]) and t.value == ua["val_ic"]
        assert sorted(t.intermediate_values) == list(range(1, ua["epochs_run"] + 1))
        log = open(f"runs/tiny/trials/{t.number}/train.log").read()
        assert f"done (time): best epoch {ua['best_epoch']}" in log


@pytest.mark.slow
@pytest.mark.parametrize("retry_timeouts", [False, True])
def test_a_trial_past_max_minutes_and_its_grace_is_killed(study_file, monkeypatch, retry_timeouts):
    # a hang the core's own deadline cannot end: the driver kills it at 1.2 s + 1 s grace
    monkeypatch.setenv("SWEEPER_FAKE_TIMEOUT_GRACE_S", "1")
    path = study_file({
        "study": {"n_trials": 3, "retries": 1, "retry_timeouts": retry_timeouts, "max_consecutive_failures": 2},
        "model": {**PROBE, "kind": "hang"},
        "train": {"max_minutes": 0.02},
        "devices": {"cpu_workers": 1},
    })
    outcome, study = _sweep(path)
    assert outcome.exit_code == 1
    assert outcome.message == ("stopped: the last 2 trials all failed (study.max_consecutive_failures); "
                               "see runs/tiny/logs")
    first, second = study.get_trials()
    for t in (first, second):
        assert t.state == TrialState.FAIL and t.user_attrs["fail_reason"] == "timeout"
        assert t.user_attrs["error"] == ("trial exceeded train.max_minutes=0.02 by more than its 1 s grace "
                                         "for scoring and writing results")
        assert t.user_attrs["exit_code"] == -9
    if retry_timeouts:  # retried once with the same params; then study.retries is used up
        assert (second.user_attrs["retry_of"], second.user_attrs["crash_count"]) == (0, 1)
        assert second.params == first.params
    else:
        assert "retry_of" not in second.user_attrs and second.params != first.params


@pytest.mark.slow
def test_study_timeout_stops_starting_trials(study_file):
    path = study_file({
        "study": {"n_trials": 50, "timeout": 12},
        "model": {"name": "fault_models:Slow", "step_sleep": 0.05, "hidden": 8},
        "train": {"epochs": 2, "batch_size": 128, "samples_per_epoch": 512},
        "devices": {"cpu_workers": 1},
    }, replace=("model",))
    started = time.monotonic()
    outcome, study = _sweep(path)
    assert outcome.exit_code == 0 and outcome.message == "study.timeout (12 s) reached"
    trials = study.get_trials()
    assert 1 <= len(trials) < 50
    assert all(t.state == TrialState.COMPLETE for t in trials)  # the running trial finished; none after
    assert time.monotonic() - started < 60
