"""Optuna samplers and pruners built from the study config.

Shared by both sides: the driver samples with the sampler, and each worker
needs the same pruner to answer ``trial.should_prune()``."""

import hashlib
import inspect
from collections.abc import Callable
from typing import Any

import optuna

from sweeper.config import PrunerConfig, SamplerConfig, StudyConfig
from sweeper.errors import ConfigError

SAMPLERS: dict[str, Callable[..., optuna.samplers.BaseSampler]] = {
    "tpe": optuna.samplers.TPESampler,  # constant_liar=True is Optuna 5's default
    "random": optuna.samplers.RandomSampler, "cmaes": optuna.samplers.CmaEsSampler,
    "gp": optuna.samplers.GPSampler, "qmc": optuna.samplers.QMCSampler}
MEDIAN_STARTUP = 4  # build_pruner's median pruner waits for 4 finished trials (Optuna's own: 5)
# name -> (what builds it, the options set unless given); "none" ignores any options
PRUNERS: dict[str, tuple[Callable[..., optuna.pruners.BasePruner], dict[str, Any]]] = {
    "median": (optuna.pruners.MedianPruner, {"n_startup_trials": MEDIAN_STARTUP, "n_warmup_steps": 1}),
    "percentile": (optuna.pruners.PercentilePruner, {"percentile": 25.0}),
    "asha": (optuna.pruners.SuccessiveHalvingPruner, {}), "hyperband": (optuna.pruners.HyperbandPruner, {}),
    "wilcoxon": (optuna.pruners.WilcoxonPruner, {}), "none": (lambda **_: optuna.pruners.NopPruner(), {})}


def build_sampler(cfg: SamplerConfig, seed: int | None = None) -> optuna.samplers.BaseSampler:
    """The configured sampler, seeded with ``seed`` when given, else with ``study.sampler.seed``.

    ``study.constraints`` needs nothing here: each worker stores its trial's constraint values with
    ``Trial.set_constraint`` (:mod:`sweeper.worker.constraints`), and Optuna 5's TPE and GP samplers read them
    from the stored trials. Their ``constraints_func`` (deprecated in 5.0) would not run anyway: Optuna calls
    it in the process that tells, the worker, whose study has the default sampler, not this one."""
    return SAMPLERS[cfg.name](seed=cfg.seed if seed is None else seed, **cfg.options)


def driver_seed(seed: int | None, n_trials: int, driver_id: str) -> int | None:
    """The sampler seed of a driver that joins or resumes a study.

    A sampler seeded alike draws the same start-up params: a resumed study would repeat the
    params it already tried, and two hosts would repeat each other's. Mixing in the trials
    already in the study and the driver's own id makes each driver's stream its own, while
    ``seed`` still decides it (None stays None: an unseeded sampler is already unique)."""
    if seed is None:
        return None
    return int.from_bytes(hashlib.sha256(f"{seed}:{n_trials}:{driver_id}".encode()).digest()[:4], "big")


def startup_trials(cfg: StudyConfig) -> int:
    """How many trials must finish before the sampler and the pruner both learn from the study's own:
    the larger ``n_startup_trials`` of the two as built (the options', else the class's own default:
    TPE's and GP's 10, CMA-ES's 1, the percentile pruner's 5, the median pruner's 4 from build_pruner;
    0 for those without one)."""
    sampler = cfg.sampler.options.get("n_startup_trials", _default(SAMPLERS[cfg.sampler.name]))
    build, defaults = PRUNERS[cfg.pruner.name]
    pruner = cfg.pruner.options.get("n_startup_trials", defaults.get("n_startup_trials", _default(build)))
    return max(int(sampler), int(pruner))


def _default(cls: Callable[..., object]) -> int:
    """``cls``'s own default ``n_startup_trials`` (read from its signature, so it follows Optuna's), or 0."""
    param = inspect.signature(cls).parameters.get("n_startup_trials")
    return 0 if param is None or param.default is inspect.Parameter.empty else int(param.default)


def build_pruner(cfg: PrunerConfig) -> optuna.pruners.BasePruner:
    build, defaults = PRUNERS[cfg.name]
    try:
        return build(**{**defaults, **cfg.options})
    except (TypeError, ValueError) as exc:  # an unknown option, or a value the pruner refuses
        raise ConfigError(f"study.pruner.options: {exc}") from None


def check_sampler(cfg: SamplerConfig) -> None:
    try:
        build_sampler(cfg)
    except (TypeError, ValueError) as exc:  # an unknown option, or a value the sampler refuses
        raise ConfigError(f"study.sampler.options: {exc}") from None
