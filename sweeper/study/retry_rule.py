"""Which failed trials deserve another go, and with what: the one home of the retry rule.

A pure function of the stored trials and the run folder it finds their checkpoints in (the study's own, or
``previous/<uuid>/`` when another study has taken the folder over), read by the parent's reconcile (which
enqueues the retries, :mod:`sweeper.dispatch.retries`) and by ``study.keep`` (:mod:`sweeper.study.retention`,
in the worker too), which keeps the checkpoint a due retry will resume from. A retry names that checkpoint's
trial (``resume_from_trial``), never its path (:mod:`sweeper.store.trial_folder`)."""

from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from sweeper.config import StudyConfig
from sweeper.errors import FailReason
from sweeper.store.layout import trial_files
from sweeper.store.trial_folder import resume_attrs, resumes

MAX_INTERRUPTED_RETRIES = 20
COUNTED_AS_CRASHES = (FailReason.CRASH, FailReason.STALL, FailReason.TIMEOUT)  # against study.retries


def retry_plan(trials: list[FrozenTrial], cfg: StudyConfig,
               run_dir: str | Path) -> list[tuple[FrozenTrial, dict[str, Any]]]:
    """FAIL trials that should run again, each with the user attrs of its retry; their
    checkpoints are looked for in ``run_dir``, the folder that holds the study's trials now."""
    retried = {t.user_attrs.get("retry_of") for t in trials if t.user_attrs.get("retry_of") is not None}
    plan = []
    for t in trials:
        if t.state != TrialState.FAIL or t.number in retried:
            continue
        reason = t.user_attrs.get("fail_reason", FailReason.INTERRUPTED)
        attempt = int(t.user_attrs.get("attempt", 0))
        if not _deserves_retry(t, reason, attempt, cfg):
            continue
        crashes = int(t.user_attrs.get("crash_count", 0)) + (reason in COUNTED_AS_CRASHES)
        # the failed trial's own checkpoint when it saved one (written whole: every save replaces it
        # atomically), else the one it resumed itself
        resume = t.number if trial_files(run_dir, t.number).checkpoint.is_file() else resumes(t.user_attrs)
        attrs: dict[str, Any] = {"retry_of": t.number, "attempt": attempt + 1, "crash_count": crashes}
        if reason == "oom" or t.user_attrs.get("exclusive_gpu"):
            attrs["exclusive_gpu"] = True  # the driver starts it on a GPU of its own and lets nothing join it
        plan.append((t, {**attrs, **resume_attrs(resume)}))
    return plan


def _deserves_retry(t: FrozenTrial, reason: str, attempt: int, cfg: StudyConfig) -> bool:
    crashes_left = int(t.user_attrs.get("crash_count", 0)) < cfg.retries
    rules: dict[str, bool] = {
        FailReason.INTERRUPTED: attempt < MAX_INTERRUPTED_RETRIES,
        # no fault of the trial's: once space is freed it resumes from its last good checkpoint
        FailReason.DISK: attempt < MAX_INTERRUPTED_RETRIES,
        FailReason.CRASH: crashes_left, FailReason.STALL: crashes_left,  # a hang is retried like a crash
        FailReason.TIMEOUT: cfg.retry_timeouts and crashes_left,
        # out of memory beside other trials (trials_per_gpu: auto): once more, with a GPU to itself
        FailReason.OOM: (int(t.user_attrs.get("gpu_shared_with") or 0) > 0
                         and not t.user_attrs.get("exclusive_gpu"))}
    return rules.get(reason, False)

