"""Claim and fail races: nothing between ask() and a worker's start leaves a RUNNING
trial behind, failing a finished trial is a no-op, and shutdown stops every worker."""
from __future__ import annotations

import copy
import types

import optuna
import pytest
from optuna.trial import TrialState

from sweeper.config import load_config
from sweeper.dispatch import claim as claim_module
from sweeper.dispatch import driver as driver_module
from sweeper.dispatch.claim import claim
from sweeper.dispatch.driver import Driver
from sweeper.dispatch.handle import Running
from sweeper.dispatch.live import NullView
from sweeper.errors import FailReason, StopRequested
from sweeper.store import NullLock, open_storage
from sweeper.store import optuna_private as private
from sweeper.store.identity import Identity


@pytest.fixture
def setup(study_file, workdir):
    cfg = load_config(study_file())
    storage = open_storage(cfg.study.resolved_storage, heartbeat_interval=1, grace_period=4)
    study = optuna.create_study(study_name=cfg.study.name, storage=storage, direction="maximize")
    return cfg, study


def _driver(cfg, study, workdir):
    return Driver(cfg, study, [], storage_url=cfg.study.resolved_storage, run_dir=workdir / "runs",
                  artifacts=str(workdir / "runs"), view=NullView(), ident=Identity.current(), lock=NullLock())


def test_an_error_after_ask_fails_the_claimed_trial(setup, workdir, monkeypatch):
    cfg, study = setup

    def broken(trial, cfg):
        raise RuntimeError("store went away")

    monkeypatch.setattr(claim_module, "suggest", broken)
    with pytest.raises(RuntimeError, match="store went away"):
        claim(study, cfg, NullLock(), Identity.current(), workdir / "runs")
    [trial] = study.get_trials()
    assert trial.state == TrialState.FAIL
    assert trial.user_attrs["fail_reason"] == "crash"
    assert trial.user_attrs["error"] == "claim broke off: RuntimeError: store went away"


def test_ctrl_c_inside_a_claim_fails_the_trial_as_interrupted(setup, workdir, monkeypatch):
    cfg, study = setup

    def interrupted(trial, cfg):
        raise KeyboardInterrupt

    monkeypatch.setattr(claim_module, "suggest", interrupted)
    with pytest.raises(KeyboardInterrupt):
        claim(study, cfg, NullLock(), Identity.current(), workdir / "runs")
    assert [(t.state, t.user_attrs["fail_reason"]) for t in study.get_trials()] == [(TrialState.FAIL, "interrupted")]


def test_failing_a_trial_another_process_finished_is_a_no_op(setup, workdir, monkeypatch):
    cfg, study = setup
    driver = _driver(cfg, study, workdir)
    trial = study.ask()
    study.tell(trial, 0.25)  # finished elsewhere first
    run = Running({trial.number: private.trial_id(trial)}, started=0.0)
    (trial_id,) = run.trials.values()
    driver._fail(trial_id, FailReason.CRASH, "worker exited with code -9")
    # the race proper: the state read says RUNNING, the write finds it finished
    storage = private.backend(study)
    stale = copy.deepcopy(storage.get_trial(trial_id))
    stale.state = TrialState.RUNNING
    monkeypatch.setattr(storage, "get_trial", lambda trial_id: stale)
    driver._fail(trial_id, FailReason.TIMEOUT, "trial exceeded train.max_minutes=1")
    monkeypatch.undo()
    [done] = study.get_trials()
    assert (done.state, done.value, done.user_attrs) == (TrialState.COMPLETE, 0.25, {})


class _Worker:
    """A stand-in worker handle that records what shutdown did to it."""

    def __init__(self, label, fail=False):
        self.slot = types.SimpleNamespace(label=label)
        self.running, self.fail, self.calls = None, fail, []
        self.ready = False

    @property
    def idle(self):
        return self.ready and self.running is None

    def _act(self, name):
        self.calls.append(name)
        if self.fail:
            raise OSError("pipe broken")

    def kill(self):
        self._act("kill")

    def request_close(self):
        self._act("request_close")

    def close(self, deadline=None):
        self._act("close")


def test_shutdown_stops_every_worker_even_when_one_fails(setup, workdir, capsys):
    cfg, study = setup
    driver = _driver(cfg, study, workdir)
    bad, good = _Worker("cpu0", fail=True), _Worker("cpu1")
    driver.workers = [bad, good]
    driver.shutdown()
    assert bad.calls == ["kill", "close"] and good.calls == ["kill", "close"]
    assert "stopping the worker on cpu0 failed: OSError: pipe broken" in capsys.readouterr().err


def test_a_stop_request_while_claiming_starts_nothing(setup, workdir, monkeypatch):
    cfg, study = setup
    driver = _driver(cfg, study, workdir)

    def waiting_for_the_lock(*args, **kwargs):
        raise StopRequested()  # Ctrl-C while the lock or the store was awaited

    monkeypatch.setattr(driver_module, "claim", waiting_for_the_lock)
    worker = _Worker("cpu0")
    worker.ready = True
    driver.workers = [worker]
    driver._start_trials()  # the wait ends without an error, and the loop goes on to drain
    assert worker.running is None and worker.calls == [] and not driver.rule.exhausted
    assert study.get_trials() == []
