"""Parent: stale trials and retries. A RUNNING trial whose driver is gone is failed as
``interrupted`` (with its reason recorded first), and every failure that deserves another
go (:mod:`sweeper.study.retry_rule`) is queued with the same params and its checkpoint."""

import time
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeper.config import StudyConfig
from sweeper.errors import FailReason
from sweeper.store import optuna_private as private
from sweeper.store import outage
from sweeper.store.identity import Identity
from sweeper.study.ending import fail_trial
from sweeper.study.retry_rule import retry_plan


def fail_dead_local(study: optuna.Study, ident: Identity) -> None:
    """Fail now the RUNNING trials of a driver on this host whose process is gone (certainly stale)
    instead of waiting out the heartbeat grace period."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        ua = t.user_attrs  # (trials of older versions have no pid_ns)
        if ua.get("driver_id") != ident.driver_id and ident.sees_dead(ua.get("host"), ua.get("driver_pid"),
                                                                      ua.get("pid_ns", ident.pid_ns)):
            fail_trial(study, private.trial_id(t), FailReason.INTERRUPTED,
                       f"driver {ua['driver_pid']} on {ident.host} is gone")


# other drivers' RUNNING trials this process has seen stale, (study, trial) -> when it first saw each so
_first_seen: dict[tuple[int, int], float] = {}


def _due(study_id: int, trial_ids: set[int], wait_s: float) -> set[int]:
    """The trials seen stale on two looks ``wait_s`` apart, with no storage trouble
    seen by this process since the first; remembers the rest, forgets the others."""
    global _first_seen
    now, trouble = time.monotonic(), outage.last_trouble()
    seen = {key: now if trouble >= (first := _first_seen.get(key, now)) else first
            for key in ((study_id, trial_id) for trial_id in trial_ids)}
    _first_seen = {k: v for k, v in _first_seen.items() if k[0] != study_id} | seen
    return {k[1] for k, first in seen.items() if now - first >= wait_s}


def fail_stale(study: optuna.Study, cfg: StudyConfig, ident: Identity) -> None:
    """Fail, as ``interrupted`` with the reason recorded first (Optuna's fail_stale_trials cannot
    record one), the RUNNING trials of other drivers whose heartbeat has stopped.

    A heartbeat older than the grace period may only mean the store was down (a restart, a
    failover, a long lock) while the trial trained on. So a trial is failed only when this driver
    sees it stale on two looks ``grace_period`` apart with no storage error or recovery in between:
    a live worker's beat is retried at least once an interval through an outage, so it is back
    within that wait; a dead one is failed two to three grace periods after its last beat. A driver
    never judges its own trials by heartbeat: it watches their processes itself.

    RUNNING trials that never got a heartbeat (which Optuna never considers stale) count too: under
    the claim lock only a driver that died between ``ask`` and its first heartbeat (or a lost commit
    of ``ask``) leaves one."""
    if (storage := private.backend(study)).get_heartbeat_interval() is None:
        return
    study_id = private.study_id(study)
    policy = outage.for_url(cfg.resolved_storage)  # the raw query below bypasses the storage's retries
    reasons = dict.fromkeys(private.stale_trial_ids(storage, study_id),
                            "no heartbeat within study.grace_period: its driver or host died")
    ages = policy.call(lambda: private.heartbeat_ages(storage, study_id))
    never_beat = [trial for trial, age in ages.items() if age is None]
    reasons |= dict.fromkeys(never_beat, "its driver died while claiming it (no heartbeat was ever recorded)")
    if reasons:
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        ours = {private.trial_id(t) for t in running if t.user_attrs.get("driver_id") == ident.driver_id}
        reasons = {t: why for t, why in reasons.items() if t not in ours}
    for trial_id in _due(study_id, set(reasons), cfg.grace_period):
        fail_trial(study, trial_id, FailReason.INTERRUPTED, reasons[trial_id])


def reconcile(study: optuna.Study, cfg: StudyConfig, ident: Identity, run_dir: Path) -> list[FrozenTrial]:
    """Fail stale RUNNING trials (dead drivers) and enqueue every due retry, each naming the trial whose
    checkpoint in ``run_dir`` (the run folder a sweep has taken for the study) it resumes. Call under the
    claim lock. Returns the trials as they stand after the failing."""
    fail_dead_local(study, ident)
    fail_stale(study, cfg, ident)
    trials = study.get_trials(deepcopy=False)
    for failed, attrs in retry_plan(trials, cfg, run_dir):
        study.enqueue_trial(failed.params, user_attrs=attrs)
    return trials
