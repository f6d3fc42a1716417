"""Which models a study can build: its own, every ``model.name`` it may sample, and each combination of the
categorical model choices in its search space, checked before the sweep (a combination the model cannot
take, ``nhead`` not dividing ``d_model``, would otherwise surface only when a trial samples it): the invalid
ones are named in one warning; a study none of whose shapes builds is refused."""

import itertools
import math
from typing import Any, cast

from sweeper import config as C
from sweeper.errors import ConfigError
from sweeper.models.check import ChildRun, Job, check_models, python_child
from sweeper.models.check_cache import checks_folder

MAX_SHAPES = 64  # each custom shape is a constructor call and a forward pass in the check
SHOWN = 8  # invalid shapes named in the warning; the rest are counted


def shape_combinations(cfg: C.SweeperConfig, limit: int = MAX_SHAPES) -> list[dict[str, Any]] | None:
    """Every distinct set of model choices a trial can sample, in file order (keys whose ``when``
    fails left out, as :func:`sweeper.study.space.suggest` does); None for more than ``limit``."""
    # the categorical model.* keys, except lists of fractions (a dropout rate builds like any other)
    keys = [key for key, spec in cfg.search_space.items()
            if key.startswith("model.") and spec.type == "categorical"
            and not all(isinstance(c, float) and not c.is_integer() for c in spec.choices or [])]
    choices = [cfg.search_space[k].choices or [] for k in keys]
    # numeric keys the file does not set join each shape at their low bound, and a user model's own (the
    # file's value where the range holds it, else the low, as drawn: a float range on an int size gives
    # floats): a typo (model.hiden), or a built-in's field the user model lacks, fails here, not in a trial
    unset = {k: _drawn(s, cfg.model.custom_kwargs().get(k[6:])) for k, s in cfg.search_space.items()
             if k.startswith("model.") and s.type != "categorical"
             and (cfg.model.is_custom or C.config_value(cfg, k, None) is None)}
    # conditions can only shrink the count so much
    if not keys or math.prod(map(len, choices)) > limit * limit:
        return None if keys else [_active(cfg, unset)] if unset else []
    seen: dict[tuple, dict[str, Any]] = {}
    for values in itertools.product(*choices):
        combo = _active(cfg, {**unset, **dict(zip(keys, values))})
        seen.setdefault(tuple(combo.items()), combo)
    return list(seen.values()) if len(seen) <= limit else None


def _drawn(spec: C.ParamSpec, value: Any) -> Any:
    """``value`` (a number in the range; else its low) as drawn: a float range makes an int a float."""
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and cast(float, spec.low) <= value <= cast(float, spec.high) else spec.low
    return float(cast(float, number)) if spec.type == "float" else int(cast(float, number))


def _active(cfg: C.SweeperConfig, combo: dict[str, Any]) -> dict[str, Any]:
    # as the sampler sees it: a condition reads the value chosen for its key, or else the
    # study file's value; settled in passes, since one condition can depend on another
    active = dict(combo)
    for _ in range(len(combo)):
        kept = {k: v for k, v in combo.items() if C.condition_met(cfg.search_space[k], cfg, active)}
        if kept == active:
            break
        active = kept
    return active


def check_study_models(cfg: C.SweeperConfig, n_features: int, lookback: int,
                       child: ChildRun = python_child, *, builtins_in_child: bool = False) -> list[str]:
    """Import every model the study names and build its own (errors raise ConfigError), then each
    model shape its search space can sample. Returns the lines to show (a warning naming the
    shapes that cannot be built, or a note that there were too many to try); raises ConfigError
    when none builds. User models are checked in a child (:func:`check_models`), built-in ones here
    or, with ``builtins_in_child``, in a child too (forked ready-made: this process needs no torch)."""
    cache = checks_folder(cfg.data)
    spec = cfg.search_space.get("model.name")
    names = sorted({str(c) for c in (spec.choices or [])} - {cfg.model.name}) if spec is not None else []
    jobs = [Job(n) for n in names if ":" in n] + [Job(cfg.model.name, cfg.model.section())]
    if (combos := shape_combinations(cfg)) is None:
        check_models(jobs, n_features, lookback, cache, child, builtins_in_child=builtins_in_child)
        return [f"note: search_space: more than {MAX_SHAPES} combinations of model choices; "
                "they are not each built in advance"]
    combos = [c for c in combos if c]  # {}: every model key is off, so it is cfg.model, built above
    labels = [", ".join(f"{k}={v}" for k, v in combo.items()) for combo in combos]
    errors: dict[str, str | None] = dict.fromkeys(labels)
    built = []
    for label, combo in zip(labels, combos):
        try:
            shaped = C.with_overrides(cfg, combo, "search_space")
        except ConfigError as exc:  # refused by the schema, like nhead not dividing d_model
            errors[label] = str(exc).removeprefix("search_space: ").removeprefix("model: ")
            continue
        built.append(label)
        jobs.append(Job(shaped.model.name, shaped.model.section(), fatal=False))
    results = check_models(jobs, n_features, lookback, cache, child, builtins_in_child=builtins_in_child)
    errors.update(zip(built, results[len(jobs) - len(built):]))
    if not (bad := [f"{label}: {error}" for label, error in errors.items() if error]):
        return []
    listed = "; ".join(bad[:SHOWN]) + (f"; and {len(bad) - SHOWN} more" if len(bad) > SHOWN else "")
    if len(bad) == len(labels):
        raise ConfigError(f"search_space: none of the {len(labels)} model shapes can be built: {listed}")
    return [f"warning: search_space: {len(bad)} of {len(labels)} model shapes cannot be built: {listed}"]
