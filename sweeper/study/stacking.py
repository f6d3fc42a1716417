"""A study's stack size: how many of a trial's runs train as one stack, the same for every trial.

The pruner compares trials at the same step, and a trial's steps count its stacks' epochs
(:meth:`sweeper.validation.grid.RunGrid.step`), so every trial of a study stacks alike. A number in
``train.max_stack`` pins the size. ``auto`` (the default): the first trial to start measures it on its device
(:mod:`sweeper.core.stack_size`) and stores the choice, with the rates it was made on, in the study's
``stack_size`` attribute (with ``train.precision: auto`` on a CPU with native bf16, the precision measured
with it); every later trial, and a resumed study, uses it, so a timing blip cannot change a trial's numbers. A
study created before ``auto`` existed keeps the number it was created with. Resuming with a number other than
the study's size is refused, as any other config drift."""

from collections.abc import Callable, Mapping
from typing import Any

import optuna

from sweeper.config import SweeperConfig
from sweeper.store.studies import FINISHED
from sweeper.study.samplers import startup_trials

STUDY_ATTR = "stack_size"
Choice = dict[str, Any]  # StackChoice.attrs(): stack_size, stack_size_from, stack_rates (no torch here)
POPULATION_CAP = 8  # study.population: auto asks for at most this many trials at once
# The search-space keys that members of one stack may differ in: what the core keeps per member (its
# AdamW's lr and weight decay, seed, schedule, early stopping, epochs, non-finite patience) and a built-in
# model's dropout rate (sweeper.models.stacked). Every other key sets the shape: the members' tensors
# (model sizes, precision) or the data each step sees (batch size, lookback, features, the folds).
PER_MEMBER = frozenset({"train.lr", "train.weight_decay", "train.seed", "train.schedule", "train.warmup_frac",
                        "train.patience", "train.early_stop_metric", "train.epochs",
                        "train.nonfinite_patience"})
BUILTIN_PER_MEMBER = frozenset({"model.dropout"})  # a user's model's dropout is its template's: shared


def _choice(size: int, source: str, rates: Mapping[str, Any] | None = None, population: int = 1) -> Choice:
    return {"stack_size": int(size), "stack_size_from": source,
            **({"stack_rates": dict(rates)} if rates else {}),
            **({"population_size": int(population)} if population > 1 else {})}


def member_keys(cfg: SweeperConfig) -> tuple[list[str], list[str]]:
    """The study's search-space keys that each member of a population draws for itself, and those that
    set the population's shape (drawn once, for all of its trials)."""
    from sweeper.config import BUILTIN_MODELS

    names = cfg.search_space["model.name"].choices if "model.name" in cfg.search_space else [cfg.model.name]
    builtin = all(str(name) in BUILTIN_MODELS for name in names or [])
    own = PER_MEMBER | (BUILTIN_PER_MEMBER if builtin else frozenset())
    return [k for k in cfg.search_space if k in own], [k for k in cfg.search_space if k not in own]


def population_line(cfg: SweeperConfig) -> str:
    """What ``sweeper validate`` says of populations: their size and which params each trial draws."""
    (own, shape), stack = member_keys(cfg), cfg.train.max_stack
    size = ("one trial at a time (study.population: 1)" if (asked := cfg.study.population) == 1 else
            f"{asked} trials per stack" if asked != "auto" else f"up to {POPULATION_CAP} trials per stack, "
            + ("as measured on the first trial" if stack == "auto" else "as many as fill train.max_stack"))
    return (f"{size}; per member: {', '.join(own) or '-'}; "
            f"shape (one value per population): {', '.join(shape) or '-'}")


def shape_of(params: Mapping[str, Any], cfg: SweeperConfig) -> dict[str, Any]:
    """The params of a trial that set its population's shape."""
    shape = set(member_keys(cfg)[1])
    return {k: v for k, v in params.items() if k in shape}


class Population:
    """How many trials the driver asks for at once: ``study.population`` when a number; ``auto``: what
    the study's first trial measured (1 until it has). The study's attributes (a store read) are read
    only under ``auto`` and only until the size is stored: it never changes after.

    Either way one at a time until the sampler's and the pruner's start-up trials have finished
    (:func:`sweeper.study.samplers.startup_trials`): a start-up draw is independent random search, which
    a population would narrow to fewer shapes, and the median pruner prunes against finished trials,
    which populations of 8 started before any finished left it none to prune against (a population
    sweep of the MLP pruned nothing and ended 0.0065 worse in best val IC after 32 trials). Counted
    only until reached (a store read per claim until then)."""

    def __init__(self, cfg: SweeperConfig, study: optuna.Study) -> None:
        self.cfg, self.study = cfg, study
        self.size: int | None = None
        self.startup = startup_trials(cfg.study)

    def __call__(self) -> int:
        if (asked := self.cfg.study.population) == 1:
            return 1
        if self.startup and len(self.study.get_trials(deepcopy=False, states=FINISHED)) >= self.startup:
            self.startup = 0  # reached: never counted again
        if self.startup:
            return 1
        if asked != "auto":
            return int(asked)
        if (stack := self.cfg.train.max_stack) != "auto":  # a stack size set in the file: as many as fill it
            return min(POPULATION_CAP, max(1, stack // self.cfg.validation.runs))
        if self.size is None:
            if not (attrs := self.study.user_attrs).get(STUDY_ATTR):
                return 1
            self.size = int((decided(attrs, "auto") or {}).get("population_size", 1))  # as its trials record
        return self.size


def decided(study_attrs: Mapping[str, Any], asked: int | str) -> Choice | None:
    """The study's stack size if it is decided: ``asked`` (``train.max_stack``) when a number, the
    choice stored with the study, or the number a study created before ``auto`` was created with;
    None: to be measured."""
    if asked != "auto":
        return _choice(int(asked), "train.max_stack")
    if stored := study_attrs.get(STUDY_ATTR):
        precision = {k: stored[k] for k in ("precision", "precision_rates") if k in stored}
        return {**_choice(stored["stack_size"], "study", stored.get("stack_rates"),
                          min(POPULATION_CAP, stored.get("population_size", 1))), **precision}
    created = study_attrs.get("config", {}).get("train", {})
    # (no max_stack: created before stacked runs, one run at a time)
    return _choice(stack, "study") if created and (stack := created.get("max_stack", 1)) != "auto" else None


def resolve(study: optuna.Study, cfg: SweeperConfig, measure: Callable[[], Choice]) -> Choice:
    """The size this study's trials stack by: decided already, or measured now and stored. Of two
    trials measuring at once, one that finds a size stored when it is done keeps that one (it does
    not write its own), so at most the first trials of such a race differ."""
    if (known := decided(study.user_attrs, cfg.train.max_stack)) is not None:
        return known
    choice = measure()
    if STUDY_ATTR not in study.user_attrs:
        study.set_user_attr(STUDY_ATTR, choice)
    stored = study.user_attrs[STUDY_ATTR]
    return {**stored, "stack_size_from": choice["stack_size_from"] if stored == choice else "study"}


def drift(study_attrs: Mapping[str, Any], asked: int | str) -> str | None:
    """Why ``asked`` (``train.max_stack``) cannot resume this study (None: it can): a number other
    than the size its trials stacked by would renumber the steps the pruner compares."""
    if asked == "auto" or (known := decided(study_attrs, "auto")) is None or known["stack_size"] == asked:
        return None
    return f"train.max_stack ({known['stack_size']!r} -> {asked!r})"
