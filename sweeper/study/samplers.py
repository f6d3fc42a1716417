"""Optuna samplers and pruners built from the study config.

Shared by both sides: the driver samples with the sampler, and each worker
needs the same pruner to answer ``trial.should_prune()``.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable

import optuna

from sweeper.config import PrunerConfig, SamplerConfig, StudyConfig
from sweeper.errors import ConfigError


def build_sampler(cfg: SamplerConfig, seed: int | None = None) -> optuna.samplers.BaseSampler:
    """The configured sampler, seeded with ``seed`` when given, else with ``study.sampler.seed``.

    ``study.constraints`` needs nothing here: each worker stores its trial's constraint values
    with ``Trial.set_constraint`` (:mod:`sweeper.worker.constraints`), and Optuna 5's TPE and GP
    samplers read them from the stored trials. Their ``constraints_func`` (deprecated in 5.0)
    would not run anyway: Optuna calls it in the process that tells, the worker, whose study has
    the default sampler, not this one."""
    kinds: dict[str, Callable[..., optuna.samplers.BaseSampler]] = {
        "tpe": optuna.samplers.TPESampler,  # constant_liar=True is Optuna 5's default
        "random": optuna.samplers.RandomSampler, "cmaes": optuna.samplers.CmaEsSampler,
        "gp": optuna.samplers.GPSampler, "qmc": optuna.samplers.QMCSampler}
    return kinds[cfg.name](seed=cfg.seed if seed is None else seed, **cfg.options)


def driver_seed(seed: int | None, n_trials: int, driver_id: str) -> int | None:
    """The sampler seed of a driver that joins or resumes a study.

    A sampler seeded alike draws the same start-up params: a resumed study would repeat the
    params it already tried, and two hosts would repeat each other's. Mixing in the trials
    already in the study and the driver's own id makes each driver's stream its own, while
    ``seed`` still decides it (None stays None: an unseeded sampler is already unique)."""
    if seed is None:
        return None
    digest = hashlib.sha256(f"{seed}:{n_trials}:{driver_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


# the finished trials a sampler draws at random before it models them, and a pruner waits for before it
# prunes: Optuna's defaults (TPE, GP: 10; CMA-ES: 1; percentile: 5) and build_pruner's own (median: 4)
SAMPLER_STARTUP = {"tpe": 10, "gp": 10, "cmaes": 1}
PRUNER_STARTUP = {"median": 4, "percentile": 5}


def startup_trials(cfg: StudyConfig) -> int:
    """How many trials must finish before the sampler and the pruner both learn from the study's own."""
    return max(int(cfg.sampler.options.get("n_startup_trials", SAMPLER_STARTUP.get(cfg.sampler.name, 0))),
               int(cfg.pruner.options.get("n_startup_trials", PRUNER_STARTUP.get(cfg.pruner.name, 0))))


def build_pruner(cfg: PrunerConfig) -> optuna.pruners.BasePruner:
    opts = dict(cfg.options)
    builders = {
        "median": lambda: optuna.pruners.MedianPruner(
            **{"n_startup_trials": PRUNER_STARTUP["median"], "n_warmup_steps": 1, **opts}),
        "percentile": lambda: optuna.pruners.PercentilePruner(**{"percentile": 25.0, **opts}),
        "asha": lambda: optuna.pruners.SuccessiveHalvingPruner(**opts),
        "hyperband": lambda: optuna.pruners.HyperbandPruner(**opts),
        "wilcoxon": lambda: optuna.pruners.WilcoxonPruner(**opts),
        "none": lambda: optuna.pruners.NopPruner(),
    }
    try:
        return builders[cfg.name]()
    except TypeError as exc:
        raise ConfigError(f"study.pruner.options: {exc}") from None


def check_sampler(cfg: SamplerConfig) -> None:
    try:
        build_sampler(cfg)
    except TypeError as exc:
        raise ConfigError(f"study.sampler.options: {exc}") from None
