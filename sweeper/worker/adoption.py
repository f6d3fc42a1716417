"""Worker: which checkpoint a trial may continue. The one place a checkpoint is adopted.

A checkpoint belongs to one trial of one study on one dataset: its owner stamp
(:class:`~sweeper.core.checkpoint.FileCheckpointer`) names the study's ``study_uuid``, the trial's
number and the panel's fingerprint. A trial continues a checkpoint only when it is a retry
(``resume_from_trial``) of the trial that wrote it, or of a retry of that trial, in the same study,
on the same data and under the same config. A fresh trial never continues one: a checkpoint left at
its own path (by a deleted study of the same name, say) is removed, and the log says so."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from sweeper import config as C
from sweeper.core.checkpoint import checkpoint_meta, config_mismatch, copy_checkpoint
from sweeper.store import optuna_private as private
from sweeper.store.layout import TrialFiles
from sweeper.store.trial_folder import TrialFolder, resume_checkpoint
from sweeper.validation.contract import FOLD_DATES, RESUMED_FROM_FOLD, RESUMED_RUNS, layout
from sweeper.validation.grid import RunGrid, named_run, seeded
from sweeper.worker.hook import copy_csv_upto


def owner(study_uuid: str | None, number: int, fingerprint: str) -> dict[str, Any]:
    """The stamp a trial's checkpoints carry."""
    return {"study_uuid": study_uuid, "trial": number, "fingerprint": fingerprint}


def adopt(study: optuna.Study, trial: optuna.Trial, frozen: FrozenTrial, cfg: C.SweeperConfig,
          files: TrialFiles, stamp: dict[str, Any], log: Callable[[str], None]) -> None:
    """Leave at the trial's checkpoint path the checkpoint it continues, or none.

    A retry continues from the checkpoint of the trial it resumes (``resume_from_trial``, or an
    older retry's ``resume_from``), found in this run folder, replaying the interrupted trial's
    intermediate values up to that checkpoint's step exactly once; it also copies the source's
    finished runs (``runs/``, skipped when it trains). One of another study, dataset, trial, run
    or config is not continued: the trial starts fresh and says why (``resume_skipped``)."""
    folder, grid = TrialFolder.of(files), RunGrid.of(cfg)
    folder.clear_stale(log)
    source = resume_checkpoint(folder.run_dir, frozen.user_attrs)
    if source is None or (meta := checkpoint_meta(source)) is None:
        return
    was: dict[str, Any] = meta["owner"] if isinstance(meta.get("owner"), dict) else {}
    fold, seed = named_run(was)  # an older holdout trial's stamp names no run: its one run's
    if problem := (foreign(meta, stamp, _lineage(study, frozen)) or _run_problem(was, study, grid)
                   or config_mismatch(meta["config"], seeded(cfg, seed))):
        log(f"not resuming from {source}: {problem}; starting fresh")
        trial.set_user_attr("resume_skipped", problem)
        return
    _continue(study, trial, frozen, folder, source, grid, (fold, seed, meta["epoch"]), log,
              len(was.get("stack") or []))


def _continue(study: optuna.Study, trial: optuna.Trial, frozen: FrozenTrial, folder: TrialFolder,
              source: Path, grid: RunGrid, where: tuple[int, int, int], log: Callable[[str], None],
              stack: int = 0) -> None:
    """Continue ``source`` at ``where`` (fold, seed, epoch; 0-based runs; of a stack's first
    run, the stack holding ``stack`` runs): the source trial's finished runs and the checkpoint
    copied, its history replayed and copied up to that step."""
    fold, seed, epoch = where
    origin = TrialFiles(source.parent)  # the source trial's folder: its metrics.csv and runs/
    done = folder.copy_runs_from(origin, grid.cells(), grid.members)
    copy_checkpoint(source, folder.files.checkpoint)
    step = grid.step(fold, seed, epoch)
    # the interrupted trial's intermediate values up to the checkpoint's step, reported once
    storage = private.backend(study)
    previous = storage.get_trial(storage.get_trial_id_from_study_id_trial_number(
        private.study_id(study), int(frozen.user_attrs["retry_of"])))
    for at, value in sorted(previous.intermediate_values.items()):
        if at <= step and at not in frozen.intermediate_values:
            trial.report(value, at)
    if origin.metrics.exists():
        copy_csv_upto(origin.metrics, folder.files.metrics, step, grid)
    trial.set_user_attr("resumed_from_epoch", epoch)
    trial.set_user_attr(RESUMED_FROM_FOLD, fold + 1)
    trial.set_user_attr(RESUMED_RUNS, len(done))
    log(_resume_line(grid, str(source), fold + 1, seed + 1, epoch, [(f + 1, s + 1) for f, s in done], stack))


def _run_problem(was: dict[str, Any], study: optuna.Study, grid: RunGrid) -> str | None:
    """Why the checkpoint's run is not one of this trial's runs; None when it is."""
    fold, repeat = (n + 1 for n in named_run(was))
    if not (1 <= fold <= grid.folds and 1 <= repeat <= grid.repeats):
        return (f"the checkpoint holds fold {fold}, seed {repeat}; this trial has "
                f"{grid.folds} folds of {grid.repeats} seeds")
    folds = layout(study.user_attrs)  # empty unless the study is walk-forward
    if fold <= len(folds) and was.get(FOLD_DATES) != folds[fold - 1]:
        return (f"the checkpoint's fold {fold} had other dates ({was.get(FOLD_DATES)}, "
                f"now {folds[fold - 1]})")
    return None


def _resume_line(grid: RunGrid, source: str, fold: int, repeat: int, epoch: int,
                 done: list[tuple[int, int]], stack: int) -> str:
    """``resuming in fold 3 (seed 1) from ... at epoch 2; folds 1-2 done`` (1-based; a stack's
    checkpoint: ``resuming the stack of 4 runs led by ...``)."""
    full = [f for f in range(1, grid.folds + 1) if all((f, r) in done for r in range(1, grid.repeats + 1))]
    finished = (f"folds {full[0]}-{full[-1]} done" if len(full) > 1 else f"fold {full[0]} done" if full
                else "no fold done") if grid.folded else f"{len(done)} seeds done"
    where = f"fold {fold} (seed {repeat})" if grid.folded else f"seed {repeat}"
    if (fold, repeat) in done:  # the checkpoint's run had finished: the next one starts fresh
        return f"resuming from {source} after {where}, which had finished; {finished}"
    lead = f"the stack of {stack} runs led by" if stack > 1 else "in"
    return f"resuming {lead} {where} from {source} at epoch {epoch}; {finished}"


def foreign(meta: dict[str, Any], stamp: dict[str, Any], lineage: list[int]) -> str | None:
    """Why a checkpoint is not this retry's to continue; None when it is."""
    if not isinstance(was := meta.get("owner"), dict):
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

