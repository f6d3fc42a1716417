"""No repeated params: a resumed study, and every driver of a shared study, samples as one sampler.

Optuna alone repeats itself: a sampler seeded alike draws the same start-up
params in every process (3 + 3 trials of a resumed seed-7 study gave the same
3 learning rates twice).
"""
from __future__ import annotations

import os
import subprocess
import sys
import uuid

import optuna
import pytest
from optuna.trial import TrialState

from sweeper.config import load_config
from sweeper.dispatch.live import NullView
from sweeper.dispatch.run import run
from sweeper.store import NullLock, open_storage
from sweeper.study.open import open_study
from sweeper.study.samplers import driver_seed
from sweeper.study.space import suggest

SEEDED = {"study": {"sampler": {"name": "random", "seed": 7}}}


def _ask(study, cfg, n):
    out = []
    for _ in range(n):
        trial = study.ask()
        out.append(suggest(trial, cfg)["train.lr"])
        study.tell(trial, 0.0)
    return out


def _open(url, cfg, driver_id):
    storage = open_storage(url)
    return open_study(storage, cfg, attrs={"config": {"study": {"direction": "maximize"}, "data": {}},
                                           "data_fingerprint": "x", "study_uuid": uuid.uuid4().hex,
                                           "model_fingerprint": None},
                      lock=NullLock(), force=True, must_exist=False, driver_id=driver_id)


def test_driver_seed_depends_on_seed_trials_and_driver():
    assert driver_seed(None, 3, "a") is None
    assert driver_seed(7, 3, "a") == driver_seed(7, 3, "a")
    assert len({driver_seed(7, 3, "a"), driver_seed(7, 3, "b"), driver_seed(7, 4, "a"), driver_seed(8, 3, "a")}) == 4


def test_fresh_study_is_reproducible_and_resumes_without_repeats(study_file):
    cfg = load_config(study_file(SEEDED))
    first, created = _open("sqlite:///one.db", cfg, "driver-1")
    again, created_again = _open("sqlite:///two.db", cfg, "driver-2")
    assert created and created_again
    lrs = _ask(first, cfg, 3)
    assert _ask(again, cfg, 3) == lrs  # the creator samples with study.sampler.seed itself
    resumed, created = _open("sqlite:///one.db", cfg, "driver-3")
    assert not created
    more = _ask(resumed, cfg, 3)
    assert len(set(lrs + more)) == 6


def test_two_drivers_joining_at_the_same_count_draw_different_params(study_file):
    cfg = load_config(study_file(SEEDED))
    first, _ = _open("sqlite:///s.db", cfg, "creator")
    lrs = _ask(first, cfg, 3)
    b, _ = _open("sqlite:///s.db", cfg, "host-b")
    c, _ = _open("sqlite:///s.db", cfg, "host-c")
    assert len(set(lrs + _ask(b, cfg, 3) + _ask(c, cfg, 3))) == 9


@pytest.mark.slow
def test_two_drivers_resuming_a_seeded_study_run_nine_distinct_param_sets(study_file):
    path = study_file({**SEEDED, "study": {**SEEDED["study"], "n_trials": 3}, "devices": {"cpu_workers": 1}})
    cfg = load_config(path)
    assert run(cfg, view=NullView()).exit_code == 0
    cmd = [sys.executable, "-m", "sweeper.cli", "run", str(path), "--set", "study.n_trials=9"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "SWEEPER_HOST_ID": f"host-{k}"}) for k in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    study = optuna.load_study(study_name=cfg.study.name, storage=cfg.study.resolved_storage)
    finished = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
    assert len(finished) == 9
    assert len({tuple(sorted(t.params.items())) for t in finished}) == 9


def test_every_sampler_offered_samples_past_its_start_up_trials():
    """cmaes passed validate and crashed the sweep after trial 0: Optuna's CmaEsSampler imports the cmaes
    package only once it samples (now a dependency)."""
    from sweeper.config import SamplerConfig
    from sweeper.study.samplers import SAMPLERS, build_sampler

    import inspect

    for name, cls in SAMPLERS.items():  # 2 start-up trials where it has them (TPE's and GP's own: 10)
        startup = {"n_startup_trials": 2} if "n_startup_trials" in inspect.signature(cls).parameters else {}
        sampler = build_sampler(SamplerConfig(name=name, seed=3, options=startup))
        study = optuna.create_study(sampler=sampler)
        study.optimize(lambda t: (t.suggest_float("x", 0, 1) - 0.3) ** 2 + t.suggest_float("y", 0, 1), n_trials=4)
        # trials 2 and 3 are the sampler's own draws (CMA-ES's through the cmaes package), past its start-up
        assert len(study.trials) == 4 and all(t.state == TrialState.COMPLETE for t in study.trials), name


@pytest.mark.parametrize("section, raw, message", [
    ("pruner", {"name": "median", "options": {"n_warmup_steps": -1}},
     "study.pruner.options: Number of warmup steps cannot be negative, but got n_warmup_steps=-1."),
    ("pruner", {"name": "percentile", "options": {"percentile": 150}},
     "study.pruner.options: Percentile must be between 0 and 100 inclusive, but got percentile=150."),
    ("sampler", {"name": "tpe", "options": {"group": True, "multivariate": False}},
     "study.sampler.options: ``group`` option can only be enabled when ``multivariate`` is enabled.")])
def test_an_option_value_the_sampler_or_pruner_refuses_is_one_line(section, raw, message):
    # a ValueError of Optuna's was a traceback, exit 1, from validate and run alike
    from sweeper.config import PrunerConfig, SamplerConfig
    from sweeper.errors import ConfigError
    from sweeper.study.samplers import build_pruner, check_sampler

    with pytest.raises(ConfigError) as err:
        build_pruner(PrunerConfig(**raw)) if section == "pruner" else check_sampler(SamplerConfig(**raw))
    assert str(err.value) == message
