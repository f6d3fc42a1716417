"""Optuna samplers and pruners built from the study config.

Shared by both sides: the driver samples with the sampler, and each worker
needs the same pruner to answer ``trial.should_prune()``.
"""
from __future__ import annotations

import optuna

from sweeper.config import PrunerConfig, SamplerConfig
from sweeper.errors import ConfigError


def build_sampler(cfg: SamplerConfig) -> optuna.samplers.BaseSampler:
    opts = dict(cfg.options)
    if cfg.name == "tpe":
        return optuna.samplers.TPESampler(seed=cfg.seed, **opts)  # constant_liar=True is Optuna 5's default
    if cfg.name == "random":
        return optuna.samplers.RandomSampler(seed=cfg.seed, **opts)
    if cfg.name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=cfg.seed, **opts)
    if cfg.name == "gp":
        return optuna.samplers.GPSampler(seed=cfg.seed, **opts)
    return optuna.samplers.QMCSampler(seed=cfg.seed, **opts)


def build_pruner(cfg: PrunerConfig) -> optuna.pruners.BasePruner:
    opts = dict(cfg.options)
    builders = {
        "median": lambda: optuna.pruners.MedianPruner(**{"n_startup_trials": 4, "n_warmup_steps": 1, **opts}),
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
