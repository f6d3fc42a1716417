"""Worker: which checkpoint a trial may continue. The one place a checkpoint is adopted.

A checkpoint belongs to one trial of one study on one dataset: its owner stamp
(:class:`~sweeper.core.checkpoint.FileCheckpointer`) names the study's ``study_uuid``, the trial's
number and the panel's fingerprint. A trial continues a checkpoint only when it is a retry
(``resume_from``) of the trial that wrote it, or of a retry of that trial, in the same study, on
the same data and under the same config. A fresh trial never continues one: a checkpoint left at
its own path (by a deleted study of the same name, say) is removed, and the log says so.
"""
from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from sweeper import config as C
from sweeper.core.checkpoint import checkpoint_meta, config_mismatch, copy_checkpoint
from sweeper.store import optuna_private as private
from sweeper.store.layout import TrialFiles
from sweeper.validation.runner import global_step, model_run, seeded
from sweeper.worker.hook import copy_csv_upto


def owner(study_uuid: str | None, number: int, fingerprint: str) -> dict[str, Any]:
    """The stamp a trial's checkpoints carry."""
    return {"study_uuid": study_uuid, "trial": number, "fingerprint": fingerprint}


def adopt(study: optuna.Study, trial: optuna.Trial, frozen: FrozenTrial, cfg: C.SweeperConfig,
          files: TrialFiles, stamp: dict[str, Any], log: Callable[[str], None]) -> None:
    """Leave at the trial's checkpoint path the checkpoint it continues, or none.

    A retry continues from its ``resume_from`` checkpoint, replaying the interrupted trial's
    intermediate values up to that epoch exactly once; one of another study, dataset, trial or
    config is not continued: the trial starts fresh and says why (``resume_skipped``)."""
    if cfg.validation.runs > 1:
        return adopt_runs(study, trial, frozen, cfg, files, stamp, log)
    _clear(files, log)
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


def _clear(files: TrialFiles, log: Callable[[str], None]) -> None:
    if files.checkpoint.exists():  # a trial runs once: nothing of its own can be there yet
        log(f"removing {files.checkpoint}: a trial continues only its retry source's checkpoint; "
            "starting fresh")
        files.checkpoint.unlink(missing_ok=True)
    if files.runs.exists():  # nor finished runs: only a retry's copies of its source's
        log(f"removing {files.runs}: a trial skips only the runs its retry source finished")
        shutil.rmtree(files.runs, ignore_errors=True)


def adopt_runs(study: optuna.Study, trial: optuna.Trial, frozen: FrozenTrial, cfg: C.SweeperConfig,
               files: TrialFiles, stamp: dict[str, Any], log: Callable[[str], None]) -> None:
    """:func:`adopt` for a trial of several runs (walk_forward, repeats): a retry copies the
    source's finished runs (``runs/``, skipped when it trains), and its checkpoint, whose owner
    names the run in progress (fold, repeat) that the retry continues. The intermediate values
    are replayed up to the checkpoint's global step."""
    _clear(files, log)
    source = str(frozen.user_attrs.get("resume_from") or "")
    meta = checkpoint_meta(source) if source else None
    if meta is None:
        return
    was: dict[str, Any] = meta["owner"] if isinstance(meta.get("owner"), dict) else {}
    problem = foreign(meta, stamp, _lineage(study, frozen)) or _run_problem(was, study, cfg)
    repeat = int(was.get("repeat") or 1)
    problem = problem or config_mismatch(meta["config"], seeded(cfg, repeat - 1))
    if problem:
        log(f"not resuming from {source}: {problem}; starting fresh")
        trial.set_user_attr("resume_skipped", problem)
        return
    fold, epoch = int(was["fold"]), meta["epoch"]
    done = _copy_runs(TrialFiles(Path(source).parent), files, cfg)
    copy_checkpoint(Path(source), files.checkpoint)
    step = global_step(cfg, fold - 1, repeat - 1, epoch)
    _replay(study, trial, frozen, step)
    metrics_csv = TrialFiles(Path(source).parent).metrics
    if metrics_csv.exists():
        copy_csv_upto(metrics_csv, files.metrics, step, cfg.validation.repeats, cfg.train.epochs)
    trial.set_user_attr("resumed_from_epoch", epoch)
    trial.set_user_attr("resumed_from_fold", fold)
    trial.set_user_attr("resumed_runs", len(done))
    log(_resume_line(cfg, source, fold, repeat, epoch, done))


def _run_problem(was: dict[str, Any], study: optuna.Study, cfg: C.SweeperConfig) -> str | None:
    """Why the checkpoint's run is not one of this trial's runs; None when it is."""
    fold, repeat = was.get("fold"), was.get("repeat")
    if not isinstance(fold, int) or not isinstance(repeat, int):
        return "the checkpoint names no fold and seed (it was saved by a single-run trial)"
    if not (1 <= fold <= cfg.validation.n_folds and 1 <= repeat <= cfg.validation.repeats):
        return (f"the checkpoint holds fold {fold}, seed {repeat}; this trial has "
                f"{cfg.validation.n_folds} folds of {cfg.validation.repeats} seeds")
    layout = study.user_attrs.get("fold_dates") or []
    if cfg.validation.walk_forward and fold <= len(layout) and was.get("fold_dates") != layout[fold - 1]:
        return (f"the checkpoint's fold {fold} had other dates ({was.get('fold_dates')}, "
                f"now {layout[fold - 1]})")
    return None


def _copy_runs(source: TrialFiles, files: TrialFiles, cfg: C.SweeperConfig) -> list[tuple[int, int]]:
    """Copy the source trial's finished runs (those with a result.json); their (fold, repeat), 1-based."""
    done = []
    for fold in range(1, cfg.validation.n_folds + 1):
        for repeat in range(1, cfg.validation.repeats + 1):
            src = source.run(fold, repeat)
            if not (src / "result.json").exists():
                continue
            shutil.copytree(src, files.run(fold, repeat), dirs_exist_ok=True)
            model = (fold - 1, repeat - 1) == model_run(cfg)
            if model and not (src / "weights.pt").exists() and source.weights.exists():
                # the source had moved its model's weights into its own folder before it ended
                shutil.copyfile(source.weights, files.run(fold, repeat) / "weights.pt")
            done.append((fold, repeat))
    return done


def _resume_line(cfg: C.SweeperConfig, source: str, fold: int, repeat: int, epoch: int,
                 done: list[tuple[int, int]]) -> str:
    """``resuming in fold 3 (seed 1) from ... at epoch 2; folds 1-2 done``."""
    full = [f for f in range(1, cfg.validation.n_folds + 1)
            if all((f, r) in done for r in range(1, cfg.validation.repeats + 1))]
    finished = (f"folds {full[0]}-{full[-1]} done" if len(full) > 1 else f"fold {full[0]} done" if full
                else "no fold done") if cfg.validation.walk_forward else f"{len(done)} seeds done"
    where = f"fold {fold} (seed {repeat})" if cfg.validation.walk_forward else f"seed {repeat}"
    if (fold, repeat) in done:  # the checkpoint's run had finished: the next one starts fresh
        return f"resuming from {source} after {where}, which had finished; {finished}"
    return f"resuming in {where} from {source} at epoch {epoch}; {finished}"


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
    """The interrupted trial's intermediate values up to the checkpoint's epoch (its global step,
    for a trial of several runs), reported once."""
    storage = private.backend(study)
    previous = storage.get_trial(storage.get_trial_id_from_study_id_trial_number(
        private.study_id(study), int(frozen.user_attrs["retry_of"])))
    for step, value in sorted(previous.intermediate_values.items()):
        if step <= epoch and step not in frozen.intermediate_values:
            trial.report(value, step)
