"""The stall watchdog: a worker that makes no step and sends no event for study.stall_timeout
seconds is killed, its trial FAILs as ``stall`` and is retried like a crash; a slow trial that
keeps stepping is left alone."""
from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from conftest import PROBE
from sweeper.config import load_config
from sweeper.dispatch.live import NullView
from sweeper.dispatch.run import run

pytestmark = pytest.mark.slow  # every test here starts a real process


def _sweep(path):
    cfg = load_config(path)
    outcome = run(cfg, view=NullView())
    return outcome, optuna.load_study(study_name=cfg.study.name, storage=cfg.study.resolved_storage)


def test_a_model_that_hangs_once_fails_as_stall_and_its_retry_finishes(study_file, workdir):
    marker = workdir / "hung"
    path = study_file({
        "study": {"n_trials": 2, "retries": 1, "stall_timeout": 5},
        "model": {**PROBE, "kind": "hang_once", "marker": str(marker)},
        "devices": {"cpu_workers": 1},
    })
    outcome, study = _sweep(path)
    assert outcome.exit_code == 0 and marker.exists()
    hung, retry, third = study.get_trials()
    assert hung.state == TrialState.FAIL and hung.user_attrs["fail_reason"] == "stall"
    # killed 5 s after its last progress event (the loop looks every 0.2 s; the seconds are rounded)
    assert hung.user_attrs["error"] in {f"no training step and no event from its worker for {s} s "
                                        "(study.stall_timeout=5)" for s in (5, 6)}
    assert hung.user_attrs["exit_code"] == -9
    assert (retry.user_attrs["retry_of"], retry.user_attrs["crash_count"], retry.params) == (0, 1, hung.params)
    assert retry.state == third.state == TrialState.COMPLETE
    assert retry.user_attrs["pid"] != hung.user_attrs["pid"]  # the slot got a fresh worker


def test_a_slow_trial_that_keeps_stepping_is_not_a_stall(study_file):
    # the epoch (4 steps of 1.5 s) takes longer than the stall timeout; the progress events,
    # at most 1.25 s apart, keep it alive
    path = study_file({
        "study": {"n_trials": 1, "stall_timeout": 5},
        "model": {"name": "fault_models:Slow", "step_sleep": 1.5, "hidden": 8},
        "train": {"epochs": 1, "batch_size": 128, "samples_per_epoch": 512},
        "devices": {"cpu_workers": 1},
    }, replace=("model",))
    outcome, study = _sweep(path)
    assert outcome.exit_code == 0
    [trial] = study.get_trials()
    assert trial.state == TrialState.COMPLETE and trial.user_attrs["stop_reason"] == "epochs"
