"""The run grid: the one place that knows how a trial's training runs are laid out.

A trial trains ``folds x repeats`` runs (fold-major: every seed of fold 1, then fold 2, ...), each of
``train.epochs`` epochs. A holdout trial is the degenerate grid: one fold of one seed (or of ``repeats``
seeds). Everything that steps through runs, numbers them or decodes a stored step asks this value: the
worker's hook and the runner, a retry's replay, ``status``, ``best``, ``predict``, ``refit`` and the report.

Indices are 0-based here (``fold``, ``seed``) and epochs 1-based, as the core counts them; the
files and the stored attributes say fold and seed 1-based (``runs/fold-<f>.seed-<r>/``), every
trial's, a holdout trial's one run too (``fold-1.seed-1``)."""
from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sweeper.config import SweeperConfig


@dataclass(frozen=True)
class RunGrid:
    """``folds`` x ``repeats`` runs of ``epochs`` epochs each, trained in stacks of at most
    ``stack`` consecutive runs (:mod:`sweeper.core.stack_loop`; 1: one run at a time)."""

    folds: int = 1
    repeats: int = 1
    epochs: int = 1
    stack: int = 1

    @classmethod
    def of(cls, cfg: SweeperConfig, stack: int | None = None) -> RunGrid:
        """The grid of a trial trained under ``cfg`` (its validation section and train.epochs),
        in stacks of up to ``train.max_stack`` runs (a user's ``module:Class`` too, through
        torch.func: :mod:`sweeper.models.stacked.func`). ``stack``: the size the study decided where
        ``train.max_stack`` is ``auto`` (:mod:`sweeper.study.stacking`; a trial's config.yaml holds
        its number); without it such a grid knows no stack size, and its steps cannot be counted."""
        size = stack if stack is not None else cfg.train.max_stack
        return cls(cfg.validation.n_folds, cfg.validation.repeats, cfg.train.epochs,
                   size if isinstance(size, int) else 0)

    def stacks(self) -> list[list[tuple[int, int]]]:
        """The cells in the order they train, grouped into the stacks that train as one."""
        self._known()
        cells = list(self.cells())
        return [cells[i:i + self.stack] for i in range(0, len(cells), self.stack)]

    def stack_of(self, fold: int, seed: int) -> int:
        """The index of the stack that trains run (fold, seed)."""
        self._known()
        return (fold * self.repeats + seed) // self.stack

    def _known(self) -> None:
        if self.stack < 1:
            raise ValueError("the stack size of a study with train.max_stack: auto is decided by its first "
                             "trial (the study's stack_size attribute): pass it to RunGrid.of")

    @property
    def single(self) -> bool:
        """One run (holdout, one seed): the trial's scores are that run's, with nothing to
        aggregate over folds or seeds. Its files are laid out as every trial's."""
        return self.folds * self.repeats == 1

    @property
    def folded(self) -> bool:
        """Walk-forward: several folds (a holdout trial's grid is one fold)."""
        return self.folds > 1

    def label(self, fold: int) -> str:
        """How a run's fold is named in its log line."""
        return f"fold {fold + 1}/{self.folds}" if self.folded else "holdout"

    @property
    def model_run(self) -> tuple[int, int]:
        """(fold, seed) of the trial's first model run: the last fold's first seed (its
        normalisation and, with one seed, its weights are the trial's)."""
        return self.folds - 1, 0

    @property
    def members(self) -> list[tuple[int, int]]:
        """The runs of the trial's model, the model run first: the last fold's seeds (one seed:
        the model run; several: the seed ensemble, scored on test as one model)."""
        return [(self.folds - 1, seed) for seed in range(self.repeats)]

    def is_model(self, fold: int, seed: int) -> bool:
        """Whether run (fold, seed) is one of the model's :attr:`members`."""
        return fold == self.folds - 1

    @property
    def ensemble(self) -> bool:
        """The trial's model is the mean of several seeds' predictions (``validation.repeats > 1``)."""
        return self.repeats > 1

    def cells(self) -> Iterator[tuple[int, int]]:
        """Every (fold, seed), in the order they train."""
        return itertools.product(range(self.folds), range(self.repeats))

    def step(self, fold: int, seed: int, epoch: int) -> int:
        """The intermediate value's step of a run's epoch: ``stack * epochs + epoch``, where ``stack`` is
        the index of the run's stack (one value per epoch per stack: the mean over its members); with one
        run per stack, ``(fold * repeats + seed) * epochs + epoch``, so the pruner compares trials at the
        same fold, seed and epoch (under holdout with one seed, the epoch itself)."""
        return self.stack_of(fold, seed) * self.epochs + epoch

    def position(self, step: int) -> tuple[int, int, int]:
        """(fold, seed, epoch) of a stored step: the inverse of :meth:`step` (a stack's: its first run's)."""
        self._known()
        stack, epoch = divmod(max(int(step), 1) - 1, max(self.epochs, 1))
        fold, seed = divmod(stack * self.stack, self.repeats)
        return fold, seed, epoch + 1

    def columns(self, fold: int, seed: int) -> dict[str, int]:
        """The columns that name a run in ``metrics.csv`` rows and epoch events, 1-based."""
        return {"fold": fold + 1, "repeat": seed + 1}

    def step_of_row(self, row: Mapping[str, Any]) -> int:
        """:meth:`step` of a ``metrics.csv`` row: its epoch in the run it names (:func:`named_run`)."""
        return self.step(*named_run(row), int(float(row["epoch"])))


def named_run(names: Mapping[str, Any]) -> tuple[int, int]:
    """(fold, seed), 0-based, of the run that a checkpoint's owner stamp or a ``metrics.csv`` row
    names by its ``fold`` and ``repeat`` (1-based). One that names none was written by a trial of
    one run before every trial had run folders (a holdout trial's, sweeper before issue 39): it is
    that run's, fold 1 of seed 1, so a study's old trials are read and resumed as new ones are."""
    return int(names.get("fold") or 1) - 1, int(names.get("repeat") or 1) - 1


def seeded(cfg: SweeperConfig, seed: int) -> SweeperConfig:
    """The config of the run with seed index ``seed`` (0-based): ``train.seed + seed``."""
    return cfg if seed == 0 else cfg.with_train(seed=cfg.train.seed + seed)
