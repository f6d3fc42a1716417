"""The search space: YAML ``search_space`` specs -> Optuna suggestions -> config overrides.

Parameter names in Optuna are the dotted config keys (``train.lr``), so the
params a user sees in the dashboard are the names they wrote."""

from typing import Any

import optuna

from sweeper.config import ParamSpec, SweeperConfig, condition_met


def ordered(space: dict[str, ParamSpec]) -> list[str]:
    """Unconditional parameters first, then each conditional one after what it depends on."""
    done: list[str] = []
    pending = dict(space)
    while pending:
        ready = ([k for k, s in pending.items() if all(c not in pending for c in (s.when or {}))]
                 or list(pending))  # none: a cycle: fall back to file order, conditions read defaults
        done += ready
        pending = {k: s for k, s in pending.items() if k not in ready}
    return done


def suggest(trial: optuna.Trial, cfg: SweeperConfig) -> dict[str, Any]:
    """Ask ``trial`` for every active parameter; returns the dotted overrides."""
    chosen: dict[str, Any] = {}
    for key in ordered(cfg.search_space):
        if condition_met(spec := cfg.search_space[key], cfg, chosen):
            chosen[key] = _suggest_one(trial, key, spec)
    return chosen


def _suggest_one(trial: optuna.Trial, key: str, spec: ParamSpec) -> Any:
    # the config validated each type's fields once (choices for categorical, low/high else)
    if spec.type == "categorical":
        assert spec.choices is not None
        return trial.suggest_categorical(key, spec.choices)
    assert spec.low is not None and spec.high is not None
    if spec.type == "int":
        return trial.suggest_int(key, int(spec.low), int(spec.high), step=int(spec.step or 1), log=spec.log)
    return trial.suggest_float(key, float(spec.low), float(spec.high), step=spec.step, log=spec.log)
