"""The sweep driver (parent process): create or resume the study, claim trials
under a lock, hand them to GPU-pinned worker processes, and survive anything a
trial does.

Three layers, as in Optuna's ``_optimize``: :func:`run` (set-up and cleanup in
``finally``) -> :meth:`Driver.loop` (slots, events, signals) ->
:meth:`Driver.dispatch` (one trial). The parent never imports torch.cuda and
never creates a CUDA context.
"""
from __future__ import annotations

import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeper import __version__
from sweeper import config as C
from sweeper.errors import ConfigDrift, ConfigError, StorageError, StudyNotFound
from sweeper.results import best_trial
from sweeper.store import check_artifacts, claim_lock, open_storage, quiet_optuna, running_without_heartbeat

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
MAX_INTERRUPTED_RETRIES = 20
MAX_EARLY_EXITS = 3
WAIT_POLL_S = 0.5
DRIFT_PREFIXES = ("data.", "model.", "train.", "search_space", "study.metric", "study.direction")


# --------------------------------------------------------------- builders

def build_sampler(cfg: C.SamplerConfig) -> optuna.samplers.BaseSampler:
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


def build_pruner(cfg: C.PrunerConfig) -> optuna.pruners.BasePruner:
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


def check_sampler(cfg: C.SamplerConfig) -> None:
    try:
        build_sampler(cfg)
    except TypeError as exc:
        raise ConfigError(f"study.sampler.options: {exc}") from None


# --------------------------------------------------------------- identity

@dataclass(frozen=True)
class Identity:
    """Who runs a trial: the host id, the driver's pid, a per-run driver id, and
    the process table that pid belongs to (boot id and pid namespace), so that
    only a driver that can see a pid ever judges it dead."""

    host: str
    pid: int
    driver_id: str
    pid_ns: str = ""

    @classmethod
    def current(cls) -> "Identity":
        host = os.environ.get("SWEEPER_HOST_ID") or socket.gethostname()
        return cls(host=host, pid=os.getpid(), driver_id=uuid.uuid4().hex[:12], pid_ns=_pid_namespace())

    def attrs(self) -> dict[str, Any]:
        return {"host": self.host, "driver_pid": self.pid, "driver_id": self.driver_id, "pid_ns": self.pid_ns}


def _pid_namespace() -> str:
    # two pods on one node share the boot id but not the pid namespace; two
    # machines given the same SWEEPER_HOST_ID share neither
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}:{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


# ------------------------------------------------------------------ study

def study_attrs(cfg: C.SweeperConfig, fingerprint: str, environment: dict[str, Any]) -> dict[str, Any]:
    return {
        "config": C.to_dict(cfg),
        "config_hash": C.config_hash(cfg),
        "sweeper_version": __version__,
        "environment": environment,
        "data_fingerprint": fingerprint,
    }


def drift(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Dotted keys whose values differ in the parts of the config a resume may not change."""
    old, new = C.flatten(stored), C.flatten(current)
    keys = sorted(k for k in set(old) | set(new) if k.startswith(DRIFT_PREFIXES))
    return [f"{k} ({old.get(k, '<unset>')!r} -> {new.get(k, '<unset>')!r})" for k in keys if old.get(k) != new.get(k)]


def open_study(storage: Any, cfg: C.SweeperConfig, *, attrs: dict[str, Any], lock: Any, force: bool,
               must_exist: bool) -> tuple[optuna.Study, bool]:
    """Create the study, or load it and refuse config drift (unless ``force``).
    Returns the study and whether this call created it."""
    sampler, pruner = build_sampler(cfg.study.sampler), build_pruner(cfg.study.pruner)
    name = cfg.study.name
    with lock:  # concurrent create_study is a known deadlock; serialise it
        exists = any(s.study_name == name for s in storage.get_all_studies())
        if must_exist and not exists:
            raise StudyNotFound(f"study {name!r} does not exist in {storage.url}: start it with `sweeper run`")
        with quiet_optuna():  # sweeper prints its own start lines; Optuna's INFO line is noise
            study = optuna.create_study(storage=storage, study_name=name, sampler=sampler, pruner=pruner,
                                        direction=cfg.study.resolved_direction, load_if_exists=True)
        if not exists or "config" not in study.user_attrs:
            for key, value in attrs.items():
                study.set_user_attr(key, value)
            return study, True
    check_compatible(study, attrs, force)
    return study, False


def check_compatible(study: optuna.Study, attrs: dict[str, Any], force: bool) -> None:
    stored = study.user_attrs
    if study.direction.name.lower() != attrs["config"]["study"]["direction"] and attrs["config"]["study"]["direction"]:
        raise ConfigDrift(f"study {study.study_name!r} was created to {study.direction.name.lower()}, "
                          "the study file asks otherwise")
    differ = drift(stored.get("config", {}), attrs["config"])
    if stored.get("data_fingerprint") not in (None, attrs["data_fingerprint"]):
        differ.append(f"data fingerprint ({stored['data_fingerprint']} -> {attrs['data_fingerprint']}):"
                      f" the data file {attrs['config']['data'].get('path')} is not the data this study was run on")
    if differ and not force:
        raise ConfigDrift(
            f"study {study.study_name!r} was created with a different config; these keys differ: "
            + "; ".join(differ) + ". Revert them, use a new study.name, or pass --force to resume anyway."
        )


# -------------------------------------------------------- stale & retries

def fail_interrupted(study: optuna.Study, trial_id: int, why: str) -> bool:
    """FAIL a RUNNING trial as ``interrupted``; False if it finished meanwhile.

    The reason is written first: Optuna refuses user attributes on finished
    trials, which is why its own stale-trial callback cannot record one.
    """
    storage = study._storage
    try:
        storage.set_trial_user_attr(trial_id, "fail_reason", "interrupted")
        storage.set_trial_user_attr(trial_id, "error", why)
        return storage.set_trial_state_values(trial_id, state=TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False


def retry_plan(trials: list[FrozenTrial], cfg: C.StudyConfig) -> list[tuple[FrozenTrial, dict[str, Any]]]:
    """FAIL trials that should run again, each with the user attrs of its retry."""
    retried = {t.user_attrs.get("retry_of") for t in trials if t.user_attrs.get("retry_of") is not None}
    plan = []
    for t in trials:
        if t.state != TrialState.FAIL or t.number in retried:
            continue
        reason = t.user_attrs.get("fail_reason", "interrupted")
        attempt = int(t.user_attrs.get("attempt", 0))
        retry = {
            "interrupted": attempt < MAX_INTERRUPTED_RETRIES,
            "crash": int(t.user_attrs.get("crash_count", 0)) < cfg.retries,
            "timeout": cfg.retry_timeouts and int(t.user_attrs.get("crash_count", 0)) < cfg.retries,
        }.get(reason, False)
        if retry:
            plan.append((t, _retry_attrs(t, reason, attempt)))
    return plan


def _retry_attrs(t: FrozenTrial, reason: str, attempt: int) -> dict[str, Any]:
    crashes = int(t.user_attrs.get("crash_count", 0)) + (reason in ("crash", "timeout"))
    ckpt = t.user_attrs.get("checkpoint")
    resume = ckpt if ckpt and Path(ckpt).with_suffix(".json").exists() else t.user_attrs.get("resume_from")
    attrs = {"retry_of": t.number, "attempt": attempt + 1, "crash_count": crashes}
    if resume:
        attrs["resume_from"] = resume
    return attrs


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


def fail_dead_local(study: optuna.Study, ident: Identity) -> None:
    """RUNNING trials of a driver on this host whose process is gone are certainly
    stale: fail them now instead of waiting out the heartbeat grace period."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        ua = t.user_attrs
        if (ua.get("host") != ident.host or ua.get("driver_id") == ident.driver_id or "driver_pid" not in ua
                or ua.get("pid_ns", ident.pid_ns) != ident.pid_ns):  # trials of older versions have none
            continue
        if not _pid_alive(int(ua["driver_pid"])):
            fail_interrupted(study, t._trial_id, f"driver {ua['driver_pid']} on {ident.host} is gone")


def fail_stale(study: optuna.Study) -> None:
    """Optuna's fail_stale_trials, but recording ``fail_reason`` before the FAIL.

    Also fails RUNNING trials that never got a heartbeat, which Optuna never
    considers stale: under the claim lock such a trial can only be left by a
    driver that died between ``ask`` and its first heartbeat.
    """
    storage = study._storage
    if storage.get_heartbeat_interval() is None:
        return
    for trial_id in storage._get_stale_trial_ids(study._study_id):
        fail_interrupted(study, trial_id, "no heartbeat within study.grace_period: its driver or host died")
    for trial_id in running_without_heartbeat(storage, study._study_id):
        fail_interrupted(study, trial_id, "its driver died while claiming it (no heartbeat was ever recorded)")


def reconcile(study: optuna.Study, cfg: C.StudyConfig, ident: Identity) -> list[FrozenTrial]:
    """Fail stale RUNNING trials (dead drivers) and enqueue every due retry. Call
    under the claim lock. Returns the trials as they stand after the failing."""
    fail_dead_local(study, ident)
    fail_stale(study)
    trials = study.get_trials(deepcopy=False)
    for failed, attrs in retry_plan(trials, cfg):
        study.enqueue_trial(failed.params, user_attrs=attrs)
    return trials


# ------------------------------------------------------------------ claim

# WAITING trials are not counted: they are retries queued for the next free
# slot, and ask() hands them out before sampling anything new, so counting them
# would make a queued retry block itself. Every ask happens under the lock, so
# the count can never overshoot.
BUDGET_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)


def claim(study: optuna.Study, cfg: C.SweeperConfig, lock: Any, ident: Identity, run_dir: Path) -> optuna.Trial | None:
    """Under the lock, in order: fail stale trials, count the budget, ask, record
    the first heartbeat and the host. None when the budget is used up."""
    from sweeper.space import suggest

    with lock:
        trials = reconcile(study, cfg.study, ident)
        if sum(t.state in BUDGET_STATES for t in trials) >= cfg.study.n_trials:
            return None
        trial = study.ask()
        study._storage.record_heartbeat(trial._trial_id)
        # a retry carries the user attrs of its enqueue only; these make it this host's
        checkpoint = str(run_dir / "trials" / str(trial.number) / "checkpoint.pt")
        for key, value in {**ident.attrs(), "checkpoint": checkpoint}.items():
            trial.set_user_attr(key, value)
        suggest(trial, cfg)
    return trial


# ---------------------------------------------------------------- workers

@dataclass
class Running:
    number: int
    trial_id: int
    started: float
    epoch: int | None = None
    metrics: dict[str, Any] = field(default_factory=dict)


class WorkerHandle:
    """One long-lived worker process bound to a device slot."""

    def __init__(self, slot: Any, init: dict[str, Any], log_dir: Path) -> None:
        self.slot = slot
        self.init = init
        # hosts may share the run folder: each writes its own slot logs
        host = re.sub(r"[^A-Za-z0-9_.-]", "_", init["driver"]["host"])
        self.log_path = log_dir / f"{host}.slot-{slot.id}.log"
        self.proc: subprocess.Popen | None = None
        self.ready = False
        self.was_ready = False
        self.early_exits = 0  # exits before ever becoming ready, in a row
        self.running: Running | None = None
        self.stop_sent = False  # a worker is told to stop once, however many loop turns the drain takes
        self._buf = b""

    def start(self) -> None:
        env = {**os.environ, **self.slot.env, "PYTHONUNBUFFERED": "1"}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        # own session: a terminal Ctrl-C reaches only the driver, which relays it
        self.proc = subprocess.Popen([sys.executable, "-m", "sweeper.worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=log, env=env, start_new_session=True)
        log.close()
        self.ready, self.was_ready, self.running, self._buf = False, False, None, b""
        self.stop_sent = False
        self.send({"op": "init", **self.init, "slot": {"id": self.slot.id, "label": self.slot.label}})

    def send(self, msg: dict[str, Any]) -> None:
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the worker died; its EOF on stdout reports it

    def read_events(self) -> list[dict[str, Any]] | None:
        """Complete events available now; None at EOF (the worker exited)."""
        chunk = os.read(self.proc.stdout.fileno(), 65536)
        if not chunk:
            return None
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc:
            self.proc.wait()

    def close(self) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()


# ----------------------------------------------------------------- driver

class Stop:
    """Signal state: the first SIGINT/SIGTERM drains, the second kills."""

    def __init__(self) -> None:
        self.count = 0
        self.signum: int | None = None

    def __call__(self, signum: int, _frame: Any) -> None:
        self.count += 1
        self.signum = self.signum or signum

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or signal.SIGINT)


@dataclass
class Outcome:
    counts: dict[str, int]
    best: FrozenTrial | None
    interrupted: bool
    exit_code: int
    message: str = ""


class Driver:
    def __init__(self, cfg: C.SweeperConfig, study: optuna.Study, slots: list[Any], *, storage_url: str,
                 run_dir: Path, artifacts: str, view: Any, ident: Identity, lock: Any) -> None:
        self.cfg, self.study, self.view, self.ident, self.lock = cfg, study, view, ident, lock
        self.run_dir = run_dir
        init = {"config": C.to_dict(cfg), "storage": storage_url, "study": cfg.study.name,
                "run_dir": str(run_dir), "artifacts": artifacts,
                "driver": {"host": ident.host, "pid": ident.pid, "driver_id": ident.driver_id}}
        self.workers = [WorkerHandle(s, init, run_dir / "logs") for s in slots]
        self.sel = selectors.DefaultSelector()
        self.stop = Stop()
        self.started = time.monotonic()
        self.failures_in_row = 0
        self.exhausted = False
        self.next_claim = 0.0
        self.waiting_on: set[int] = set()  # other drivers' running trials that hold the budget
        self.next_poll = 0.0
        self.message = ""
        self.broken = False

    # layer 2: the loop
    def loop(self) -> None:
        for w in self.workers:
            self._spawn(w)
        while True:
            if self.stop.count >= 2:
                self._kill_all()
                return
            if self.stop.count == 1:
                self._drain()
            elif not self._stopping() and self._claim_due():
                for w in self.workers:
                    if w.ready and w.running is None and not self.dispatch(w):
                        break
            if all(w.running is None for w in self.workers) and (self.stop.count or self._stopping()):
                return
            self._pump(timeout=0.2)
            self._check_timeouts()
            self.view.tick(self)

    def _stopping(self) -> bool:
        if self.broken:
            return True
        timeout = self.cfg.study.timeout
        if timeout is not None and time.monotonic() - self.started > timeout:
            self.message = self.message or f"study.timeout ({timeout:g} s) reached"
            return True
        if self.failures_in_row >= self.cfg.study.max_consecutive_failures:
            self.message = (f"stopped: the last {self.failures_in_row} trials all failed "
                            f"(study.max_consecutive_failures); see {self.run_dir / 'logs'}")
            return True
        return self.exhausted

    # layer 3: one trial
    def dispatch(self, w: WorkerHandle) -> bool:
        trial = claim(self.study, self.cfg, self.lock, self.ident, self.run_dir)
        if trial is None:
            foreign = self._foreign_running()
            if foreign:
                # the budget is held by other drivers' trials: they may finish, or die and
                # need re-running, so look again instead of leaving
                self.waiting_on = foreign
                self.next_claim = time.monotonic() + self.cfg.study.heartbeat_interval
                return False
            self.waiting_on = set()
            self.exhausted = True
            if not any(x.running for x in self.workers):
                self.message = self.message or (
                    f"budget reached: study.n_trials={self.cfg.study.n_trials} trials are finished "
                    f"(counted across every host); nothing left for {self.ident.host} to run")
            return False
        self.waiting_on = set()
        w.running = Running(number=trial.number, trial_id=trial._trial_id, started=time.monotonic())
        w.send({"op": "run", "trial_id": trial._trial_id, "number": trial.number})
        self.view.trial_started(w.slot, trial.number, trial.params)
        return True

    def _claim_due(self) -> bool:
        """Claim on schedule, or at once when a trial this driver waits on has ended
        (a cheap poll of RUNNING trials, instead of a full claim every heartbeat)."""
        now = time.monotonic()
        if now >= self.next_claim:
            return True
        if self.waiting_on and now >= self.next_poll:
            self.next_poll = now + WAIT_POLL_S
            return not self.waiting_on <= self._foreign_running()
        return False

    def _foreign_running(self) -> set[int]:
        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        return {t.number for t in running if t.user_attrs.get("driver_id") != self.ident.driver_id}

    def _spawn(self, w: WorkerHandle) -> None:
        w.start()
        self.sel.register(w.proc.stdout, selectors.EVENT_READ, w)

    def _pump(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout=timeout):
            w: WorkerHandle = key.data
            events = w.read_events()
            if events is None:
                self._worker_exited(w)
                continue
            for ev in events:
                self._on_event(w, ev)

    def _on_event(self, w: WorkerHandle, ev: dict[str, Any]) -> None:
        kind = ev["ev"]
        if kind == "ready":
            w.ready = w.was_ready = True
            w.early_exits = 0
        elif kind == "epoch" and w.running:
            w.running.epoch, w.running.metrics = ev["epoch"], ev["metrics"]
            self.view.epoch(w.slot, ev["number"], ev["epoch"], ev["metrics"])
        elif kind == "end":
            self.failures_in_row = self.failures_in_row + 1 if ev["state"] == "FAIL" else 0
            self.view.trial_ended(w.slot, ev["number"], ev["state"], ev.get("value"), ev.get("reason"))
            w.running = None
            w.ready = ev["state"] != "FAIL"  # after a failure the worker exits; its replacement comes on EOF
            self.exhausted = False  # a failure frees budget; the next claim re-counts

    def _worker_exited(self, w: WorkerHandle) -> None:
        self.sel.unregister(w.proc.stdout)
        code = w.proc.wait()
        if w.running is not None:
            reason = "interrupted" if self.stop.count else "crash"
            self._fail(w.running, reason, f"worker exited with code {code}", code)
            self.failures_in_row += reason == "crash"
            self.view.trial_ended(w.slot, w.running.number, "FAIL", None, reason)
        w.close()
        w.running = None
        if not w.was_ready and not self.stop.count:
            self._early_exit(w, code)
        if not self.stop.count and not self._stopping():
            self._spawn(w)

    def _early_exit(self, w: WorkerHandle, code: int) -> None:
        """A worker that dies before it is ready (storage refused, too many
        connections, a broken install) would otherwise be respawned forever."""
        w.early_exits += 1
        if w.early_exits >= MAX_EARLY_EXITS and not self.broken:
            self.broken = True
            self.message = (f"stopped: the worker for {w.slot.label} exited {w.early_exits} times before it was "
                            f"ready (last exit code {code}); see {w.log_path}")

    def _fail(self, run: Running, reason: str, error: str, code: int | None = None) -> None:
        storage = self.study._storage
        if storage.get_trial(run.trial_id).state.is_finished():
            return
        for key, value in {"fail_reason": reason, "error": error, "exit_code": code}.items():
            storage.set_trial_user_attr(run.trial_id, key, value)
        self.study.tell(run.number, state=TrialState.FAIL, skip_if_finished=True)
        self.exhausted = False

    def _check_timeouts(self) -> None:
        limit = self.cfg.train.max_minutes
        if limit is None:
            return
        for w in self.workers:
            if w.running and time.monotonic() - w.running.started > limit * 60:
                run = w.running
                w.kill()
                self._fail(run, "timeout", f"trial exceeded train.max_minutes={limit:g}", w.proc.returncode)
                self.failures_in_row += 1
                self.view.trial_ended(w.slot, run.number, "FAIL", None, "timeout")
                w.running, w.ready = None, False  # the EOF that follows respawns the slot

    def _drain(self) -> None:
        for w in self.workers:
            if not w.stop_sent:
                w.send({"op": "stop"})
                w.stop_sent = True

    def _kill_all(self) -> None:
        for w in self.workers:
            run = w.running
            w.kill()
            if run is not None:
                self._fail(run, "interrupted", "killed by a second Ctrl-C", w.proc.returncode)

    def shutdown(self) -> None:
        for w in self.workers:
            if w.running is None:
                w.kill()  # idle (or still importing torch): holds no trial, no need to wait
            w.close()
            if w.running is not None:
                self._fail(w.running, "interrupted", "driver shut down")
        self.sel.close()


# ------------------------------------------------------------- set-up

@dataclass
class Plan:
    """Everything validated before anything is written."""

    cfg: C.SweeperConfig
    storage_url: str
    run_dir: Path
    artifacts: str
    slots: list[Any]
    fingerprint: str
    oracle_ic: dict[str, float] | None
    source: str
    study_file: str = "STUDY.yaml"


def prepare(cfg: C.SweeperConfig, storage_url: str | None = None, *, devices: bool = True) -> Plan:
    """Run every check (config names, data, devices, storage) without writing anything.

    ``devices=False`` skips slot planning (``sweeper db init`` runs where there
    may be no GPU, e.g. a Kubernetes init Job)."""
    from sweeper.data import load_panel
    from sweeper.devices import plan_slots
    from sweeper.models import build_model, resolve_model_class
    from sweeper.store import check_reachable

    if storage_url:
        cfg = cfg.model_copy(update={"study": cfg.study.model_copy(update={"storage": storage_url})})
    check_sampler(cfg.study.sampler)
    build_pruner(cfg.study.pruner)
    _check_models(cfg, resolve_model_class)
    panel = load_panel(cfg.data)
    build_model(cfg.model, len(panel.features), cfg.data.lookback)  # constructor errors are config errors
    slots = plan_slots(cfg.devices) if devices else []
    url = cfg.study.resolved_storage
    check_reachable(url)
    artifacts = cfg.study.resolved_artifacts
    check_artifacts(artifacts)
    run_dir = Path(f"runs/{cfg.study.name}") if artifacts.startswith("s3://") else Path(artifacts)
    return Plan(cfg, url, run_dir, artifacts, slots, panel.fingerprint, panel.oracle_ic, panel.source)


def _check_models(cfg: C.SweeperConfig, resolve: Any) -> None:
    names = {cfg.model.name}
    spec = cfg.search_space.get("model.name")
    if spec is not None and spec.choices:
        names |= {str(c) for c in spec.choices}
    for name in sorted(names):
        if name not in C.BUILTIN_MODELS and ":" not in name:
            raise ConfigError(f"search_space.model.name: unknown model {name!r}")
        resolve(name)


def _attach(plan: Plan, *, force: bool, must_exist: bool) -> tuple[optuna.Study, Any, bool]:
    """Open the storage, then create or join the study under the claim lock."""
    from sweeper.devices import environment_summary

    cfg = plan.cfg
    try:
        storage = open_storage(plan.storage_url, heartbeat_interval=cfg.study.heartbeat_interval,
                               grace_period=cfg.study.grace_period, create=not must_exist)
    except StorageError as exc:
        if must_exist:
            raise StudyNotFound(f"study {cfg.study.name!r} does not exist ({exc}); start it with `sweeper run`") from None
        raise
    lock = claim_lock(storage, plan.storage_url, cfg.study.name)
    attrs = {**study_attrs(cfg, plan.fingerprint, environment_summary()), "oracle_ic": plan.oracle_ic,
             "data_source": plan.source}
    study, created = open_study(storage, cfg, attrs=attrs, lock=lock, force=force, must_exist=must_exist)
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
    from sweeper.store import redact

    plan = prepare(cfg, storage_url, devices=False)
    study, _lock, created = _attach(plan, force=False, must_exist=False)
    return InitResult(study=plan.cfg.study.name, storage=redact(plan.storage_url), created=created,
                      n_trials=len(study.get_trials(deepcopy=False)))


def run(cfg: C.SweeperConfig, *, view: Any, storage_url: str | None = None, force: bool = False,
        must_exist: bool = False, study_file: str = "STUDY.yaml") -> Outcome:
    """``sweeper run`` / ``sweeper resume``: the whole sweep, resumable at any point."""
    plan = prepare(cfg, storage_url)
    plan.study_file = study_file
    cfg = plan.cfg
    ident = Identity.current()
    study, lock, _created = _attach(plan, force=force, must_exist=must_exist)
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    driver = Driver(cfg, study, plan.slots, storage_url=plan.storage_url, run_dir=plan.run_dir,
                    artifacts=plan.artifacts, view=view, ident=ident, lock=lock)
    telemetry = Telemetry(plan.run_dir / "devices.csv", plan.slots)
    previous = {s: signal.signal(s, driver.stop) for s in (signal.SIGINT, signal.SIGTERM)}
    view.start(cfg, plan, study)
    try:
        telemetry.start()
        driver.loop()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        driver.shutdown()
        telemetry.stop()
    outcome = summarize(study, cfg, driver)
    view.close(outcome, cfg, plan)
    return outcome


def summarize(study: optuna.Study, cfg: C.SweeperConfig, driver: Driver) -> Outcome:
    trials = study.get_trials(deepcopy=False)
    counts = {s.name: 0 for s in TrialState}
    for t in trials:
        counts[t.state.name] += 1
    best = best_trial(study)
    interrupted = driver.stop.count > 0
    code = driver.stop.exit_code if interrupted else 0
    if not interrupted and (driver.broken or driver.failures_in_row >= cfg.study.max_consecutive_failures):
        code = 1
    return Outcome(counts=counts, best=best, interrupted=interrupted, exit_code=code, message=driver.message)


class Telemetry:
    """Samples each GPU through NVML every few seconds into devices.csv (no CUDA context)."""

    def __init__(self, path: Path, slots: list[Any], interval: float | None = None) -> None:
        self.path = path
        self.enabled = any(s.kind == "gpu" for s in slots)
        self.interval = interval or float(os.environ.get("SWEEPER_TELEMETRY_INTERVAL", "5"))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="telemetry")

    def start(self) -> None:
        if self.enabled:
            self._thread.start()

    def _loop(self) -> None:
        from sweeper.devices import telemetry

        import csv

        while True:
            rows = telemetry()
            if rows:
                new = not self.path.exists()
                with self.path.open("a", newline="") as fh:
                    writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
                    if new:
                        writer.writeheader()
                    writer.writerows(rows)
            if self._stop.wait(self.interval):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
