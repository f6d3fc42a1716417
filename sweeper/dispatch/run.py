"""``sweeper run`` / ``resume`` / ``validate`` / ``db init``: every check before the study is
touched (:func:`prepare`; with ``data.cache: true`` loading the data builds, or evicts, panel
cache entries: that is the cache's job), then the sweep itself (:func:`run`, which always shuts
the :class:`~sweeper.dispatch.driver.Driver`'s workers down)."""

import json
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import TrialState

from sweeper import config as C
from sweeper import launch
from sweeper.devices import Slot
from sweeper.devices.gpus import Telemetry
from sweeper.dispatch.driver import Driver
from sweeper.dispatch.forkserver import ForkServer, stop_shared
from sweeper.dispatch.plan import Plan
from sweeper.dispatch.stopping import SweepResult
from sweeper.dispatch.view import View
from sweeper.errors import ConfigError, StopRequested, StorageError, StudyNotFound, fp16_needs_cuda
from sweeper.interrupt import NEVER, StopToken, unheard
from sweeper.store import check_artifacts, claim_lock, open_storage, redact, run_folder
from sweeper.store.identity import Identity
from sweeper.store.layout import devices_csv, run_dir
from sweeper.store.locks import ClaimLock
from sweeper.store.outage import release, watch
from sweeper.store.studies import best_trial
from sweeper.study import retention
from sweeper.study.open import open_study, study_attrs
from sweeper.study.samplers import build_pruner, check_sampler
from sweeper.study.summary import PanelSummary, read_answer, summarize_panel
from sweeper.study.warm_start import start_queue

# a panel load has no time limit in this process either: this bounds only a child that hangs
SUMMARY_TIMEOUT_S = 24 * 3600.0
SUMMARY_GRACE_S = 10.0  # a stopped summary's child removes the cache entry it was building


def prepare(cfg: C.SweeperConfig, storage_url: str | None = None, *, devices: bool = True,
            enqueue: Sequence[str | Path] = (), server: ForkServer | None = None) -> Plan:
    """Run every check (config names, data, models, devices, storage, the parameter sets to enqueue:
    ``study.warm_start``'s source study, ``--enqueue`` files) without touching the study or the run folder.

    ``devices=False`` skips slot planning (``sweeper db init`` runs where there may be no GPU, e.g. a
    Kubernetes init Job). User models are imported, built and run once in a child process, forked from
    ``server`` when there is one; with a server the panel is loaded and the built-in models built in its
    children too, so that this process never imports torch. The model-shapes check's warnings go to stderr."""
    from sweeper.devices import plan_slots
    from sweeper.models.shapes import check_study_models
    from sweeper.store.engine import check_reachable

    if storage_url:
        cfg = cfg.model_copy(update={"study": cfg.study.model_copy(update={"storage": storage_url})})
    check_sampler(cfg.study.sampler)
    build_pruner(cfg.study.pruner)
    # model names only, before the data loads; importing a user's module is the child check's job
    spec = cfg.search_space.get("model.name")
    for name in sorted({str(c) for c in (spec.choices or [])} if spec is not None else ()):
        if name not in C.BUILTIN_MODELS and ":" not in name:
            raise ConfigError(f"search_space.model.name: {C.unknown_model(name)}")
    slots = plan_slots(cfg.devices) if devices else []
    _fp16_on_cpus(cfg, slots)  # before the panel loads
    summary = _summary(cfg, server)
    # a model's errors are config errors; the shapes a trial may sample but cannot build are notes
    notes = check_study_models(cfg, len(summary.features), cfg.data.lookback,
                               lambda request, timeout: launch.run("check", request, timeout, server=server),
                               builtins_in_child=server is not None)
    notes += summary.thin_splits(cfg.validation.walk_forward)
    if devices:  # a host that runs trials keeps their files (``db init`` runs none)
        run_folder.check_writable(run_dir(cfg))
    check_reachable(url := cfg.study.resolved_storage)
    check_artifacts(artifacts := cfg.study.resolved_artifacts)
    queue = start_queue(cfg, enqueue)  # after the storage check: it reads the study's storage
    for note in notes:  # shapes a trial may sample but cannot build, thin splits: worth knowing, not fatal
        print(note, file=sys.stderr, flush=True)
    return Plan(cfg, url, run_dir(cfg), artifacts, slots, summary, queue=queue)


def _fp16_on_cpus(cfg: C.SweeperConfig, slots: list[Slot]) -> None:
    """fp16 (the file's, or a search-space choice) on a host of CPU slots: each trial at it is pruned."""
    space = cfg.search_space.get("train.precision")
    if slots and all(s.kind == "cpu" for s in slots) and "fp16" in (space.choices or [] if space else
                                                                    [cfg.train.precision]):
        key = "search_space.train.precision" if space else "train.precision"
        raise fp16_needs_cuda(key, "the CPU: " + ", ".join(s.label for s in slots))


def _summary(cfg: C.SweeperConfig, server: ForkServer | None) -> PanelSummary:
    """The panel's summary, made in a child where a fork server makes one cheap (the driver then
    never imports torch), else, or when that child gave no answer, in this process."""
    if server is None or not server.alive:
        return summarize_panel(cfg)
    out, _ = launch.run("summary", json.dumps(C.to_dict(cfg)), SUMMARY_TIMEOUT_S, grace=SUMMARY_GRACE_S,
                        server=server)
    return read_answer(out) or summarize_panel(cfg)


def _attach(plan: Plan, *, force: bool, must_exist: bool, driver_id: str = "",
            stop: StopToken = NEVER) -> tuple[optuna.Study, ClaimLock, bool]:
    """Open the storage, then create or join the study under the claim lock, and enqueue the
    plan's parameter sets (a new study's warm start and config values only when this created it)."""
    from sweeper.devices import environment_summary

    cfg = plan.cfg
    try:
        storage = open_storage(plan.storage_url, heartbeat_interval=cfg.study.heartbeat_interval,
                               grace_period=cfg.study.grace_period, create=not must_exist,
                               outage_s=cfg.study.storage_outage_s)
    except StorageError as exc:
        if must_exist:
            raise StudyNotFound(f"study {cfg.study.name!r} does not exist ({exc}); "
                                "start it with `sweeper run`") from None
        raise
    lock = claim_lock(storage, plan.storage_url, cfg.study.name, stop)
    attrs = study_attrs(cfg, plan.panel, environment_summary())
    study, created = open_study(storage, cfg, attrs=attrs, lock=lock, force=force, must_exist=must_exist,
                                driver_id=driver_id, queue=plan.queue)
    return study, lock, created


@dataclass
class InitResult:
    study: str
    storage: str
    created: bool
    n_trials: int


def init_db(cfg: C.SweeperConfig, storage_url: str | None = None) -> InitResult:
    """``sweeper db init``: create Optuna's tables and the study, with its config and
    data fingerprint, once, before any host runs. Idempotent; refuses a study
    file that differs from the one the study was created with."""
    plan = prepare(cfg, storage_url, devices=False)
    study, _lock, created = _attach(plan, force=False, must_exist=False)
    return InitResult(study=plan.cfg.study.name, storage=redact(plan.storage_url), created=created,
                      n_trials=len(study.get_trials(deepcopy=False)))


@unheard()
def run(cfg: C.SweeperConfig, *, view: View, storage_url: str | None = None, force: bool = False,
        must_exist: bool = False, study_file: str = "STUDY.yaml",
        enqueue: Sequence[str | Path] = ()) -> SweepResult:
    """``sweeper run`` / ``sweeper resume``: the whole sweep, resumable at any point.
    ``enqueue``: ``--enqueue`` files, each a list of parameter sets run ahead of the sampler's.

    A signal during set-up or the workers' shutdown raises StopRequested out of here (the CLI
    exits 130/143 with the resume line); during the loop the first drains and the second
    kills, and the SweepResult says so."""
    # as the workers read it (a config changed in Python after loading, `cfg.train.epochs = 0`, was stored)
    C.validate_config(C.to_dict(cfg), "study config")
    stop = StopToken()
    server: ForkServer | None = None
    try:
        with _signals_to(stop):
            # the user models' check and the workers are forked from it (`sweeper run` started it
            # once the study file loaded, so that its preload overlaps the checks; a failed check
            # leaves it to the process's exit)
            forks = ForkServer.shared()
            plan = prepare(cfg, storage_url, enqueue=enqueue, server=forks)
            plan.study_file = study_file
            study, lock, ident = _set_up(plan, stop, force, must_exist)
            server = forks  # from here a sweep that ends by an exception stops it
            driver = Driver(plan.cfg, study, plan.slots, storage_url=plan.storage_url, run_dir=plan.run_dir,
                            artifacts=plan.artifacts, view=view, ident=ident, lock=lock, stop=stop,
                            server=server)
            _sweep(driver, plan, study, view)
            result = summarize(study, driver)  # a stopped sweep's store waits still give up at once
    except BaseException:
        if server is not None:
            stop_shared()  # after the workers' shutdown (_sweep's finally): a straggler dies with it
        raise
    finally:
        release(stop)  # later store calls of this process wait on no finished sweep's token
    view.close(result, plan.cfg, plan)
    return result


@contextmanager
def _signals_to(stop: StopToken) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP go to ``stop`` while the sweep runs; raising at once outside the loop
    (before it there is nothing to drain) until ``_sweep`` says otherwise."""
    stop.raise_at_once = True
    # a SIGHUP that is ignored (nohup) stays so: the sweep outlives the terminal, as asked
    hup = (signal.SIGHUP,) if signal.getsignal(signal.SIGHUP) == signal.SIG_DFL else ()
    # off the main thread (a notebook's background sweep) a signal reaches the main thread's handlers only
    main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, stop.hung_up if s == signal.SIGHUP else stop)
                for s in (signal.SIGINT, signal.SIGTERM, *hup) if main}
    try:
        yield
    finally:
        stop.raise_at_once = False
        for s, handler in previous.items():
            signal.signal(s, handler)


def _set_up(plan: Plan, stop: StopToken, force: bool, must_exist: bool,
            ) -> tuple[optuna.Study, ClaimLock, Identity]:
    watch(plan.storage_url, stop)  # the store's waits through an outage end on Ctrl-C
    ident = Identity.current()
    study, lock, created = _attach(plan, force=force, must_exist=must_exist, driver_id=ident.driver_id,
                                   stop=stop)
    if created:  # paths are relative to the study file's folder (sweeper.config.anchor): say where
        print(f"created study {plan.cfg.study.name!r} in {redact(plan.storage_url)}, its files in "
              f"{plan.run_dir}", file=sys.stderr, flush=True)
    # the run folder holds this study's files; another study's are moved aside (run_folder)
    with lock:  # two drivers of one study never move files at once
        started = any(t.state != TrialState.WAITING for t in study.get_trials(deepcopy=False))
        lines = run_folder.take(plan.run_dir, plan.cfg.study.name, study.user_attrs["study_uuid"],
                                redact(plan.storage_url), fresh=not started, study_folder=plan.cfg.study.home)
    room = retention.space_warning(plan.run_dir, study.get_trials(deepcopy=False), plan.cfg.study.n_trials)
    for line in [*lines, room] if room else lines:
        print(line, file=sys.stderr, flush=True)
    return study, lock, ident


def _sweep(driver: Driver, plan: Plan, study: optuna.Study, view: View) -> None:
    """The loop, with its cleanup in ``finally``: workers shut down, telemetry stopped."""
    telemetry = Telemetry(devices_csv(plan.run_dir), plan.slots)
    driver.stop.raise_at_once = False  # from here a signal drains, and a second one kills
    view.start(plan.cfg, plan, study)
    try:
        telemetry.start()
        driver.loop()
    except StopRequested:
        pass  # a wait below the loop (the claim lock, the store) gave up on Ctrl-C/SIGTERM: shut down
    finally:
        driver.stop.raise_at_once = True  # a signal cuts the shutdown short, as it always did
        try:
            driver.shutdown()
        finally:
            driver.stop.raise_at_once = False  # the summary is quick; a store that is away ends it
            view.end()
            telemetry.stop()


def summarize(study: optuna.Study, driver: Driver) -> SweepResult:
    ending, signum, message = driver.rule.ending(), driver.stop.signum or signal.SIGINT, driver.rule.message
    try:
        trials = study.get_trials(deepcopy=False)
        counts, best = {s.name: sum(t.state == s for t in trials) for s in TrialState}, best_trial(study)
    except StopRequested:  # stopped while the store is away: no counts to show
        counts, best, message = {}, None, "the store did not answer; the summary is left out"
    return SweepResult(counts=counts, best=best, ending=ending, signum=signum, message=message)
