"""A trial's folder, and everything that copies, moves or removes its files: the one owner of
``trials/<n>/`` once :mod:`~sweeper.store.layout` has named the files.

Its callers: a retry's adoption (:mod:`sweeper.worker.adoption`), a trial taking its model's
files from its runs (:mod:`sweeper.validation.record`), ``study.keep`` (:mod:`sweeper.study.retention`)
and another study's files moved aside and back (:mod:`sweeper.store.run_folder`).

A retry names the trial it resumes by number (``resume_from_trial``); the checkpoint's path is
worked out from the run folder at use time (:func:`resume_checkpoint`), so a study moved aside
to ``previous/<uuid>/`` finds its retries' sources there. A retry stored before that attribute
names its source by a path (``resume_from``), from which the trial's number is read.

Nothing here imports torch: ``sweeper gc --dry-run``, ``status`` and ``best`` read no tensor."""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from sweeper.atomic import atomic_path
from sweeper.store.layout import SPLITS, TrialFiles, trial_files, trial_of_checkpoint

Cell = tuple[int, int]  # a run of a trial: (fold, seed), 0-based (the run grid's numbering)

RESUME_FROM_TRIAL = "resume_from_trial"  # a retry's user attr: the trial whose checkpoint it continues
RESUME_FROM = "resume_from"              # the same, as a path, in retries stored before it
LIVE = (TrialState.RUNNING, TrialState.WAITING)


@dataclass(frozen=True)
class TrialFolder:
    """``<run_dir>/trials/<number>/``: its files (:attr:`files`) and the operations on them."""

    run_dir: Path
    number: int

    @classmethod
    def of(cls, files: TrialFiles) -> TrialFolder:
        """The folder of ``files`` (``<run_dir>/trials/<n>``)."""
        return cls(files.folder.parent.parent, int(files.folder.name))

    @property
    def files(self) -> TrialFiles:
        return trial_files(self.run_dir, self.number)

    # ------------------------------------------------------------ a retry's adoption
    def clear_stale(self, log: Callable[[str], None]) -> None:
        """Remove what a trial starting here cannot have written itself: a checkpoint (a trial
        continues only its retry source's) and finished runs (it skips only its source's)."""
        files = self.files
        if files.checkpoint.exists():  # a trial runs once: nothing of its own can be there yet
            log(f"removing {files.checkpoint}: a trial continues only its retry source's checkpoint; "
                "starting fresh")
            files.checkpoint.unlink(missing_ok=True)
        if files.runs.exists():  # nor finished runs: only a retry's copies of its source's
            log(f"removing {files.runs}: a trial skips only the runs its retry source finished")
            shutil.rmtree(files.runs, ignore_errors=True)

    def copy_runs_from(self, source: TrialFiles, cells: Iterable[Cell],
                       members: Collection[Cell]) -> list[Cell]:
        """Copy the finished runs among ``cells`` (those with a ``result.json``) of the source
        trial (its files) into this one; the cells copied. A run of the model's ``members`` gets
        back the weights its source had taken into its own folder before it ended."""
        done = []
        for fold, seed in cells:
            if not (src := source.run_files(fold, seed)).result.exists():
                continue
            dst = self.files.run_files(fold, seed)
            shutil.copytree(src.folder, dst.folder, dirs_exist_ok=True)
            taken = source.member_weights(seed)
            if (fold, seed) in members and not src.weights.exists() and taken.exists():
                shutil.copyfile(taken, dst.weights)
            done.append((fold, seed))
        return done

    # ------------------------------------------------------------ the trial's model
    def take_model(self, members: Sequence[Cell]) -> None:
        """The model's files become the trial's: each of its ``members``' weights moved (the run's
        folder keeps no second copy; a seed ensemble has several), the first member's
        ``norm_stats.json`` and ``daily_ic_test.csv`` copied (atomically)."""
        for fold, seed in members:
            if (member := self.files.run_files(fold, seed)).weights.exists():
                os.replace(member.weights, self.files.member_weights(seed))
        run, test = self.files.run_files(*members[0]), self.files.daily_ic("test")
        for src, dst in ((run.norm_stats, self.files.norm_stats), (run.daily_ic("test"), test)):
            if src.exists():
                with atomic_path(dst) as tmp:
                    shutil.copyfile(src, tmp)

    # ------------------------------------------------------------ study.keep
    def checkpoint_files(self) -> list[Path]:
        """The checkpoint, and with it the runs' weights an interrupted trial of several runs
        left for its retry (a trial that ends takes its model's weights into its own folder)."""
        return [self.files.checkpoint, *sorted(self.files.runs.glob(f"*/{self.files.weights.name}"))]

    def model_files(self) -> list[Path]:
        """The model's weights: with seed repeats, every seed's of the ensemble."""
        return [self.files.weights, *self.files.other_members()]

    def prediction_files(self) -> list[Path]:
        """The daily IC files and the model's stored predictions (``study.keep.predictions``)."""
        return [*(self.files.daily_ic(s) for s in SPLITS), *(self.files.predictions(s) for s in SPLITS)]


def remove(path: Path, *, dry_run: bool = False) -> int | None:
    """Remove one file; its size, or None when it was already gone (another collector was
    first). Other errors (permissions) raise OSError."""
    try:
        size = path.stat().st_size
        if not dry_run:
            path.unlink()
    except FileNotFoundError:
        return None
    return size


def move(src: Path, dst: Path) -> None:
    """Move a file or folder of the run folder (another study's, aside or back), in one rename."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.replace(src, dst)


# ---------------------------------------------------------------- what a retry resumes
def resumes(attrs: Mapping[str, Any]) -> int | str | None:
    """What a retry (its user attrs) resumes: the trial's number (``resume_from_trial``, or read from an
    older retry's ``resume_from`` path), or such a path naming no trial folder; None for nothing."""
    if (number := attrs.get(RESUME_FROM_TRIAL)) is not None:
        return int(number)
    if not (path := attrs.get(RESUME_FROM)):
        return None
    return str(path) if (found := trial_of_checkpoint(str(path))) is None else found


def resume_checkpoint(run_dir: str | Path, attrs: Mapping[str, Any]) -> Path | None:
    """The checkpoint a retry resumes, in ``run_dir`` (the study's folder now); None for none."""
    if (source := resumes(attrs)) is None:
        return None
    return Path(source) if isinstance(source, str) else trial_files(run_dir, source).checkpoint


def resume_attrs(source: int | str | None) -> dict[str, Any]:
    """The user attrs that say a retry resumes ``source`` (see :func:`resumes`)."""
    return {} if source is None else {RESUME_FROM if isinstance(source, str) else RESUME_FROM_TRIAL: source}


@dataclass(frozen=True)
class Liveness:
    """The checkpoints a trial still needs: its own while it runs or waits, what a running or
    waiting trial resumes from, and a failed trial's (with its source) that a due retry will
    resume from. Paths resolved in one run folder, the study's own or ``previous/<uuid>/``."""

    live: frozenset[Path]

    @classmethod
    def of(cls, run_dir: str | Path, trials: Iterable[FrozenTrial],
           due_retries: Iterable[tuple[FrozenTrial, Mapping[str, Any]]]) -> Liveness:
        needed = [(t, t.user_attrs) for t in trials if t.state in LIVE] + list(due_retries)
        live = [path for t, attrs in needed
                for path in (trial_files(run_dir, t.number).checkpoint, resume_checkpoint(run_dir, attrs))]
        return cls(frozenset(p.resolve() for p in live if p is not None))

    def keeps(self, folder: TrialFolder) -> bool:
        return folder.files.checkpoint.resolve() in self.live
