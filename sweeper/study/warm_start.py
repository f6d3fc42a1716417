"""Parameter sets a study runs before its sampler's own (docs/long-sweeps.md, warm starts).

- ``study.warm_start``: the ``top_k`` best COMPLETE trials of another study, best first;
- ``study.start_from_config``: the study file's own values for the search-space keys;
- ``sweeper run --enqueue params.yaml``: hand-written sets.

Everything is read and checked by :func:`start_queue` (called from ``prepare``, which writes
nothing); :meth:`Queue.apply` enqueues, under the claim lock, when the study is opened. The
first two only into a new study (created by this open, with no trial yet), so a resume never
repeats them; the files each time they are given. Each enqueued trial is marked with the user attribute
``warm_start_from``: ``<study>#<trial number>``, ``config`` or ``<file>#<entry>``."""

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from sweeper import config as C
from sweeper.errors import ConfigError, StorageError
from sweeper.store import open_storage, quiet_optuna, redact
from sweeper.store.studies import no_best, ranked
from sweeper.study.space import ordered

WARM_START_FROM = "warm_start_from"  # the user attribute that marks an enqueued trial
CONFIG_SET = "the study file's own values (config)"  # what the mark "config" stands for, printed


@dataclass(frozen=True)
class StartSet:
    params: dict[str, Any]  # dotted search-space key -> value; the sampler draws the keys left out
    source: str  # its warm_start_from mark


@dataclass(frozen=True)
class Queue:
    """What to enqueue when the study is opened: ``first`` (the warm-start sets, then the
    config's) only into a new study, ``always`` (``--enqueue``) every time. ``notes`` (what
    was dropped, and why) are printed when ``first`` is enqueued."""

    first: tuple[StartSet, ...] = ()
    always: tuple[StartSet, ...] = ()
    notes: tuple[str, ...] = ()

    def apply(self, study: optuna.Study, new: bool) -> None:
        """Enqueue (``first`` only when ``new``, a study this open created with no trial yet); call
        under the claim lock, so that no driver samples a trial before them."""
        sets = (self.first if new else ()) + self.always
        for note in self.notes if new else ():
            print(note, file=sys.stderr, flush=True)
        for s in sets:
            study.enqueue_trial(s.params, user_attrs={WARM_START_FROM: s.source})
        if sets:
            named = (CONFIG_SET if s.source == "config" else s.source for s in sets)
            print(f"enqueued {len(sets)} parameter set{'s' if len(sets) > 1 else ''} ahead of the sampler's: "
                  + ", ".join(named), file=sys.stderr, flush=True)


class _Outside(ValueError):
    """A value this search-space entry cannot take; the message says why."""


def fit(spec: C.ParamSpec, value: Any) -> Any:
    """``value`` as the entry ``spec`` would suggest it (an int for ``int``, the choice itself for
    ``categorical``); raises _Outside when the space cannot suggest it: not one of the choices,
    outside [low, high], off the ``step`` grid, or not an integer for ``int``."""
    if spec.type == "categorical":
        for choice in spec.choices or ():  # True == 1 in Python; a bool only matches a bool
            if choice == value and isinstance(choice, bool) == isinstance(value, bool):
                return choice
        raise _Outside(f"not one of {spec.choices}")
    number = value
    if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as text
        try:
            number = float(value)
        except ValueError:
            raise _Outside("not a number") from None
    if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
        raise _Outside("not a finite number")
    assert spec.low is not None and spec.high is not None  # validated for float and int
    if spec.type == "int":
        if not float(number).is_integer():
            raise _Outside("not an integer")
        number = int(number)
    if not spec.low <= number <= spec.high:
        raise _Outside(f"outside [{spec.low:g}, {spec.high:g}]")
    step = spec.step or (1 if spec.type == "int" else None)
    if step and abs((k := (number - spec.low) / step) - round(k)) > 1e-8:  # Optuna's own tolerance
        raise _Outside(f"not on the grid of step {step:g} from {spec.low:g}")
    return number if spec.type == "int" else float(number)


def config_set(cfg: C.SweeperConfig) -> tuple[StartSet | None, list[str]]:
    """The study file's values for the search-space keys that are active with them and that the
    space can suggest (the sampler draws the others, each with a note, and those the file does not
    set, a user model's argument say, as an --enqueue set's left-out keys); None when none is."""
    params, refused = _fitted(cfg, {key: given for key in ordered(cfg.search_space)
                                    if C.condition_met(cfg.search_space[key], cfg, {})
                                    and (given := C.config_value(cfg, key, None)) is not None})
    notes = [f"start from config: {key}={value!r} is {why}; the sampler draws it"
             for key, value, why in refused]
    return (StartSet(params, "config") if params else None), notes


def _fitted(cfg: C.SweeperConfig,
            values: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, Any, _Outside]]]:
    """``values`` as the search space would suggest them (:func:`fit`), and ``(key, value, why)``
    of each it cannot take: a value its entry cannot suggest, or a key it has no entry for."""
    params, refused = {}, []
    for key, value in values.items():
        try:
            if key not in cfg.search_space:
                raise _Outside("not in this search space")
            params[key] = fit(cfg.search_space[key], value)
        except _Outside as why:
            refused.append((key, value, why))
    return params, refused


def _source_study(warm: C.WarmStartConfig, own: C.StudyConfig) -> optuna.Study:
    # null: this study's storage; by default that is one database per study name, so the source's own
    url = warm.storage or own.storage or own.model_copy(update={"name": warm.study}).resolved_storage
    try:
        storage = open_storage(url, create=False)
    except StorageError as exc:
        raise ConfigError(f"study.warm_start.storage: {exc}") from None
    if warm.study not in (names := [s.study_name for s in storage.get_all_studies()]):
        held = f" (it holds: {', '.join(names)})" if names else " (it holds no study)"
        raise ConfigError(f"study.warm_start.study: no study {warm.study!r} in {redact(url)}{held}")
    with quiet_optuna():
        return optuna.load_study(study_name=warm.study, storage=storage)


def warm_start_sets(cfg: C.SweeperConfig) -> tuple[list[StartSet], list[str]]:
    """The ``top_k`` best sets of ``study.warm_start.study``, best first, with what this search
    space cannot take dropped (a note each). ConfigError when the source study or its storage is
    missing, or has no COMPLETE trial."""
    warm = cfg.study.warm_start
    assert warm is not None
    source = _source_study(warm, cfg.study)
    best = ranked(source.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)),
                  source.direction == optuna.study.StudyDirection.MAXIMIZE)[:warm.top_k]
    if not best:  # none completed, or none within the source's study.constraints
        raise ConfigError(f"study.warm_start.study: {no_best(source)}, to start from")
    sets = []
    notes = [f"warm start: study {warm.study!r} has {len(best)} completed trials, fewer than top_k "
             f"{warm.top_k}"] if len(best) < warm.top_k else []
    for t in best:
        params, refused = _fitted(cfg, t.params)
        notes += [f"warm start: dropped {key if key not in cfg.search_space else f'{key}={value!r}'} ({why}) "
                  f"from trial {t.number} of study {warm.study!r}" for key, value, why in refused]
        if params:
            sets.append(StartSet(params, f"{warm.study}#{t.number}"))
        else:
            notes.append(f"warm start: skipped trial {t.number} of study {warm.study!r}: "
                         "none of its parameters is in this search space")
    return sets, notes


def read_enqueue_file(path: str | Path, cfg: C.SweeperConfig) -> list[StartSet]:
    """``--enqueue FILE``: a YAML list of mappings (or one mapping) of search-space keys (dotted,
    or nested) to values. Strict: a key outside the search space or a value it cannot take is
    a ConfigError naming the file, the entry and the key."""
    if not (path := Path(path)).is_file():
        raise ConfigError(f"{path}: --enqueue file not found")
    entries = [raw] if isinstance(raw := C.read_yaml(path), dict) else raw
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{path}: expected a list of mappings of search_space keys to values")
    sets = []
    for i, entry in enumerate(entries):
        where = f"{path}: entry #{i}"
        if not isinstance(entry, dict) or not entry:
            raise ConfigError(f"{where}: expected a non-empty mapping of search_space keys to values, "
                              f"got {entry!r}")
        params, refused = _fitted(cfg, C.flatten(entry))
        for key, value, why in refused[:1]:  # strict: the first key it cannot take
            if key not in cfg.search_space:
                raise ConfigError(f"{where}: {key} is not a search_space key "
                                  f"(the search space has: {', '.join(cfg.search_space) or 'none'})")
            raise ConfigError(f"{where}: {key}={value!r} is {why}")
        for key, spec in ((k, cfg.search_space[k]) for k in params):  # one its own values never let be drawn
            if all(c in params or c not in cfg.search_space for c in spec.when or {}) \
                    and not C.condition_met(spec, cfg, params):
                raise ConfigError(f"{where}: {key} is drawn only when {spec.when}, which this entry (or the "
                                  f"study's own values) never meets: a trial would drop it")
        sets.append(StartSet(params, f"{path}#{i}"))
    return sets


def _has_study(cfg: C.SweeperConfig) -> bool:
    """Whether the study already exists (created, with its config): read-only."""
    try:
        storage = open_storage(cfg.study.resolved_storage, create=False)
    except StorageError:  # no database yet, or no tables in it: a new study
        return False
    return any(s.study_name == cfg.study.name and "config" in s.user_attrs for s in storage.get_all_studies())


def held_ahead(study: optuna.Study) -> int:
    """How many trials an ``--enqueue`` set waits behind, of the budget: finished, running or waiting (the
    budget check here, and the retrain command's, :func:`sweeper.study.retention.retrain_command`)."""
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED,
                                                        TrialState.RUNNING, TrialState.WAITING)))


def _check_budget(cfg: C.SweeperConfig, sets: int, first: int, wanted: int, exists: bool) -> None:
    """``--enqueue`` sets past the budget would wait for good: refused. Ahead of them: a study's trials
    finished, running or waiting, or, in a study that holds none (new), its ``first`` sets (``wanted``
    before ``study.n_trials`` cut them)."""
    try:
        study = optuna.load_study(study_name=cfg.study.name, storage=open_storage(cfg.study.resolved_storage,
                                                                                   create=False))
        held = held_ahead(study)
    except (StorageError, KeyError):  # no database, or no such study yet
        held = 0
    ahead, wanted = (held, held) if held or exists else (first, wanted)
    if (left_out := ahead + sets - cfg.study.n_trials) > 0:
        raise ConfigError(f"--enqueue: study {cfg.study.name!r} has {ahead} trials finished or queued ahead "
                          f"of its sets (study.n_trials {cfg.study.n_trials}), so {min(left_out, sets)} of "
                          f"its {sets} set(s) would never run; add --set study.n_trials={wanted + sets}")


def start_queue(cfg: C.SweeperConfig, enqueue: Sequence[str | Path] = ()) -> Queue:
    """Read and check every set the study will enqueue when opened; writes nothing.

    A new study's sets are the warm-start sets best first, then the config's unless it equals
    one of them, at most ``study.n_trials`` of them (a note says how many were left out). An
    existing study's source study is not read: a warm start is applied once, when it is created."""
    always = tuple(s for path in enqueue for s in read_enqueue_file(path, cfg))
    exists = _has_study(cfg)
    first, notes = warm_start_sets(cfg) if cfg.study.warm_start is not None and not exists else ([], [])
    if cfg.study.start_from_config:
        own, own_notes = config_set(cfg)
        notes += own_notes
        if own is not None and all(own.params != s.params for s in first):
            first.append(own)
    wanted = len(first)
    if len(first) > cfg.study.n_trials:
        notes.append(f"warm start: {', '.join(s.source for s in first[cfg.study.n_trials:])} left out "
                     f"(study.n_trials is {cfg.study.n_trials})")
        first = first[:cfg.study.n_trials]
    if always:
        _check_budget(cfg, len(always), len(first), wanted, exists)
    return Queue(first=tuple(first), always=always, notes=tuple(notes))
