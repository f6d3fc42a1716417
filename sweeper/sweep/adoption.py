"""Worker: which checkpoint a trial may continue. The one place a checkpoint is adopted.

A checkpoint belongs to one trial of one study on one dataset: its owner stamp
(:class:`~sweeper.core.checkpoint.FileCheckpointer`) names the study's ``study_uuid``, the trial's
number and the panel's fingerprint. A trial continues a checkpoint only when it is a retry
(``resume_from``) of the trial that wrote it, or of a retry of that trial, in the same study, on
the same data and under the same config. A fresh trial never continues one: a checkpoint left at
its own path (by a deleted study of the same name, say) is removed, and the log says so.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from sweeper import config as C
from sweeper.core.checkpoint import checkpoint_meta, config_mismatch, copy_checkpoint
from sweeper.store import optuna_private as private
from sweeper.store.layout import TrialFiles
from sweeper.sweep.trial_hook import copy_csv_upto


def owner(study_uuid: str | None, number: int, fingerprint: str) -> dict[str, Any]:
    """The stamp a trial's checkpoints carry."""
    return {"study_uuid": study_uuid, "trial": number, "fingerprint": fingerprint}


def adopt(study: optuna.Study, trial: optuna.Trial, frozen: FrozenTrial, cfg: C.SweeperConfig,
          files: TrialFiles, stamp: dict[str, Any], log: Callable[[str], None]) -> None:
    """Leave at the trial's checkpoint path the checkpoint it continues, or none.

    A retry continues from its ``resume_from`` checkpoint, replaying the interrupted trial's
    intermediate values up to that epoch exactly once; one of another study, dataset, trial or
    config is not continued: the trial starts fresh and says why (``resume_skipped``)."""
    if files.checkpoint.exists():  # a trial runs once: nothing of its own can be there yet
        log(f"removing {files.checkpoint}: a trial continues only its retry source's checkpoint; "
            "starting fresh")
        files.checkpoint.unlink(missing_ok=True)
    source = frozen.user_attrs.get("resume_from")
    if not source:
        return
    meta = checkpoint_meta(source)
    if meta is None:
        return
    problem = foreign(meta, stamp, _lineage(study, frozen)) or config_mismatch(meta["config"], cfg)
    if problem:
        log(f"not resuming from {source}: {problem}; starting fresh")
        trial.set_user_attr("resume_skipped", problem)
        return
    epoch = meta["epoch"]
    copy_checkpoint(Path(source), files.checkpoint)
    _replay(study, trial, frozen, epoch)
    metrics_csv = TrialFiles(Path(source).parent).metrics
    if metrics_csv.exists():
        copy_csv_upto(metrics_csv, files.metrics, epoch)
    trial.set_user_attr("resumed_from_epoch", epoch)
    log(f"resuming from {source} at epoch {epoch}")


def foreign(meta: dict[str, Any], stamp: dict[str, Any], lineage: list[int]) -> str | None:
    """Why a checkpoint is not this retry's to continue; None when it is."""
    was = meta.get("owner")
    if not isinstance(was, dict):
        return "the checkpoint does not say which study wrote it (an older sweeper)"
    if was.get("study_uuid") != stamp["study_uuid"]:
        return (f"the checkpoint belongs to another study (study_uuid {was.get('study_uuid')}, "
                f"this study's is {stamp['study_uuid']})")
    if was.get("fingerprint") != stamp["fingerprint"]:
        return (f"the checkpoint was trained on other data (fingerprint {str(was.get('fingerprint'))[:12]}, "
                f"now {stamp['fingerprint'][:12]})")
    if was.get("trial") not in lineage:
        return f"the checkpoint belongs to trial {was.get('trial')}, not to a trial this one retries"
    return None


def _lineage(study: optuna.Study, frozen: FrozenTrial) -> list[int]:
    """The trials this one retries: its ``retry_of``, that trial's ``retry_of``, and so on
    (a retry's copied checkpoint still carries the stamp of the trial that saved it)."""
    storage, study_id = private.backend(study), private.study_id(study)
    numbers: list[int] = []
    number = frozen.user_attrs.get("retry_of")
    while number is not None and int(number) not in numbers:
        numbers.append(int(number))
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, int(number))
        number = storage.get_trial(trial_id).user_attrs.get("retry_of")
    return numbers


def _replay(study: optuna.Study, trial: optuna.Trial, frozen: FrozenTrial, epoch: int) -> None:
    """The interrupted trial's intermediate values up to the checkpoint's epoch, reported once."""
    storage = private.backend(study)
    previous = storage.get_trial(storage.get_trial_id_from_study_id_trial_number(
        private.study_id(study), int(frozen.user_attrs["retry_of"])))
    for step, value in sorted(previous.intermediate_values.items()):
        if step <= epoch and step not in frozen.intermediate_values:
            trial.report(value, step)
