"""Creating or joining a study: its stored config and data fingerprint, and
the refusal to resume one whose study file has drifted."""

import uuid
import warnings
from typing import Any

import optuna

from sweeper import __version__
from sweeper import config as C
from sweeper.errors import ConfigDrift, StorageError, StudyNotFound, say
from sweeper.models.check_cache import code_changed, source_digest
from sweeper.store import SweeperStorage, quiet_optuna
from sweeper.store.locks import ClaimLock
from sweeper.study.samplers import build_pruner, build_sampler, driver_seed
from sweeper.study.stacking import drift as stack_drift
from sweeper.study.summary import PanelSummary
from sweeper.study.warm_start import Queue
from sweeper.validation import contract as K

NOTHING_QUEUED = Queue()


def study_attrs(cfg: C.SweeperConfig, panel: PanelSummary, environment: dict[str, Any]) -> dict[str, Any]:
    """The study's attributes. ``split_dates`` (``{split: [first, last]}`` target dates) are
    fixed for the whole study (``data.split.*``). ``features`` are the columns the study's data
    selection resolved to. ``study_uuid`` is the study's identity, stored once when it is
    created: a study of the same name in another storage, or one re-created after its database
    was deleted, has another (a checkpoint and a run folder say which study they belong to by it).
    ``model_fingerprint``: the user models' source (None with only built-in ones)."""
    return {"study_uuid": uuid.uuid4().hex, "config": C.to_dict(cfg, kept=True),
            "sweeper_version": __version__, "environment": environment, "data_fingerprint": panel.fingerprint,
            "model_fingerprint": source_digest(cfg), "config_hash": C.config_hash(cfg),
            "split_dates": panel.split_dates, K.FOLD_DATES: panel.folds,
            "split_widths": {k: getattr(cfg.data.split, k) for k in ("lookback", "horizon", "embargo")},
            "features": panel.features, "oracle_ic": panel.oracle_ic, "data_source": panel.source}


def open_study(storage: SweeperStorage, cfg: C.SweeperConfig, *, attrs: dict[str, Any],
               lock: ClaimLock, force: bool, must_exist: bool, driver_id: str = "",
               queue: Queue = NOTHING_QUEUED) -> tuple[optuna.Study, bool]:
    """Create the study, or load it and refuse config drift (unless ``force``); then, still
    under the lock, enqueue ``queue`` (its warm-start and config sets only into a study this
    call created and that holds no trial yet: one filled by hand with Optuna first runs what it
    holds). Returns the study and whether this call created it.

    Only the driver that creates a study samples with ``study.sampler.seed`` itself, so a fresh single-driver
    study is reproducible; every driver that joins or resumes one reseeds from the seed, the trials so far and
    its ``driver_id`` (:func:`~sweeper.study.samplers.driver_seed`), so no two repeat each other."""
    sampler, pruner = build_sampler(cfg.study.sampler), build_pruner(cfg.study.pruner)
    name = cfg.study.name
    with lock:  # concurrent create_study is a known deadlock; serialise it
        exists = any(s.study_name == name for s in storage.get_all_studies())
        if must_exist and not exists:
            raise StudyNotFound(f"study {name!r} does not exist in {storage.url}: "
                                "start it with `sweeper run`")
        with quiet_optuna():  # sweeper prints its own start lines; Optuna's INFO line is noise
            study = optuna.create_study(storage=storage, study_name=name, sampler=sampler, pruner=pruner,
                                        direction=cfg.study.resolved_direction, load_if_exists=True)
        created = not exists or "config" not in study.user_attrs
        n_trials = len(study.get_trials(deepcopy=False))
        if not created:
            check_compatible(study, attrs, force)
        # after the drift check, before the attributes: once ``config`` is stored no rerun enqueues them
        queue.apply(study, new=created and not n_trials)
        for key, value in attrs.items():  # a study made by a sweeper before these two gains them
            if created or (key in ("study_uuid", "model_fingerprint") and key not in study.user_attrs):
                study.set_user_attr(key, value)
        if study.metric_names is None:  # optuna-dashboard's axis and trials_dataframe's column name it
            with warnings.catch_warnings(category=optuna.exceptions.ExperimentalWarning, action="ignore"):
                study.set_metric_names([C.objective_label(cfg.study.metric, cfg.validation)])
    if not created:
        seed = driver_seed(cfg.study.sampler.seed, n_trials, driver_id)
        study.sampler = build_sampler(cfg.study.sampler, seed)
    return study, created


def check_resumable(cfg: C.SweeperConfig, storage_url: str, panel: PanelSummary) -> None:
    """``validate``'s read-only resume check: ConfigDrift where ``run`` would refuse (no study yet: none)."""
    from sweeper.store.studies import load_existing

    try:
        study = load_existing(cfg, storage_url)
    except (StudyNotFound, StorageError):  # nothing to resume: a run creates it
        return
    check_compatible(study, study_attrs(cfg, panel, {}), force=False)


def check_compatible(study: optuna.Study, attrs: dict[str, Any], force: bool) -> None:
    stored = study.user_attrs
    if (asked := attrs["config"]["study"]["direction"]) and study.direction.name.lower() != asked:
        raise ConfigDrift(f"study {study.study_name!r} was created to {study.direction.name.lower()}, "
                          "the study file asks otherwise")
    differ = C.drift(stored.get("config", {}), attrs["config"])
    stacking = stack_drift(stored, attrs["config"].get("train", {}).get("max_stack", "auto"))
    if stacking:  # train.max_stack is no drift key: auto resumes any study, a number must match
        differ.append(stacking)
    if grew := stored.get("data_fingerprint") not in (None, attrs["data_fingerprint"]):
        path = attrs["config"]["data"].get("path")
        differ.append(f"data fingerprint ({stored['data_fingerprint']} -> {attrs['data_fingerprint']}): "
                      f"{f'the data file {path}' if path else 'the synthetic panel'} is not the data this "
                      "study was run on")
    if changed := code_changed(attrs["model_fingerprint"], stored):
        differ.append(f"{changed}, and its trials would rank two models as one")
    # a data file that grew moves a split of fractions: its new trials would be judged on another window
    if (old := stored.get("split_dates")) not in (None, new := attrs.get("split_dates")):
        span = lambda dates: ", ".join(f"{k} {a} to {b}" for k, (a, b) in dates.items())  # noqa: E731
        pin = ", ".join(f"{k}: [{a}, {b}]" for k, (a, b) in old.items())
        differ.append(f"split dates ({span(old)} -> {span(new)}): new trials would be scored on other dates "
                      f"than its trials so far and ranked with them; data.split: {{{pin}}} keeps its dates"
                      + " (with --force for the data's fingerprint)" * grew)
    if differ and not force:
        raise ConfigDrift(f"study {study.study_name!r} was created with a different config; these keys "
                          f"differ: {'; '.join(differ)}. Revert them, use a new study.name, or pass --force "
                          "to resume anyway.")


def as_run(cfg: C.SweeperConfig, study: optuna.Study) -> C.SweeperConfig:
    """``cfg`` with what says what the study's values are (``study.metric``, ``study.direction``, the
    ``validation`` section) as the study ran: a read command of a study file edited since (for a new
    study) labels and reads the trials as what they are, and says so once on stderr."""
    stored = study.user_attrs.get("config") or {}
    try:
        ran = C.SweeperConfig.model_validate(stored)
    except ValueError:  # a study of another version that this one cannot read: as the file says
        return cfg
    # a direction given as the one its metric has (None -> 'maximize') is none changed
    keys = ("study.metric", "validation.", *(("study.direction",) if ran.study.resolved_direction !=
                                              cfg.study.resolved_direction else ()))
    if moved := [k for k in C.drift(stored, C.to_dict(cfg)) if k.startswith(keys)]:
        say(f"the study file differs from study {study.study_name!r} in {', '.join(moved)}: its trials are "
            "read as it ran them")
    return cfg.model_copy(update={"validation": ran.validation, "study": cfg.study.model_copy(
        update={"metric": ran.study.metric, "direction": ran.study.direction})}) if moved else cfg
