"""The study file's ``validation`` section: what a trial's objective is measured on.

- ``scheme: holdout`` (the default): one train block, one valid block (``data.split``), one
  training run per trial; every study written before this section existed means this.
- ``scheme: walk_forward``: ``folds`` valid blocks that march forward in time before the test split, each
  fold training on the dates before its block (``window: expanding`` or ``rolling``): the layout, and what
  each of its keys means, is :mod:`sweeper.data.folds`' (docs/walk-forward.md).

``repeats`` trains every fold (or the holdout run) with seeds ``train.seed + r``; ``aggregate`` says how the
seed and fold scores make the objective (:mod:`sweeper.validation.scores`): with ``lcb`` a config that is good
on every fold beats one that is great on one; with ``ensemble`` (``repeats >= 2``) a fold's score is its seed
ensemble's (the mean of the seeds' predictions), so a pick is judged on the model it deploys."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, model_validator

from sweeper.config.section import Section

MIN_VALID_DATES = 10  # a valid block (and a test split): a mean IC over fewer target dates is mostly noise


class ValidationConfig(Section):
    scheme: Literal["holdout", "walk_forward"] = "holdout"
    folds: int = Field(4, ge=2)
    window: Literal["expanding", "rolling"] = "expanding"
    # rolling only: target dates in each fold's train window (null: as many as the first fold has)
    train_dates: int | None = Field(None, ge=1)
    # target dates in each valid block (null: the default cut, sweeper.data.folds)
    valid_dates: int | None = Field(None, ge=1)
    repeats: int = Field(1, ge=1)
    aggregate: Literal["mean", "lcb", "ensemble"] = "mean"

    @model_validator(mode="after")
    def _keys_of_their_scheme(self, info: ValidationInfo) -> ValidationConfig:
        # a fold key with no scheme set (holdout, which ignores it) is a scheme forgotten; at the edge only
        keys = self.model_fields_set & {"folds", "window", "train_dates", "valid_dates"}
        if info.context and keys and "scheme" not in self.model_fields_set:
            raise ValueError(f"{', '.join(sorted(keys))}: walk-forward keys, which holdout (the default "
                             "scheme) ignores: set validation.scheme: walk_forward, or drop them")
        if self.train_dates is not None and self.window != "rolling":
            raise ValueError("train_dates is the length of a rolling window: "
                             "set validation.window: rolling, or drop train_dates")
        if self.aggregate == "ensemble" and self.repeats < 2:
            raise ValueError("aggregate: ensemble scores each fold's seed ensemble: set repeats >= 2")
        return self

    @property
    def walk_forward(self) -> bool:
        return self.scheme == "walk_forward"

    @property
    def n_folds(self) -> int:
        """Folds a trial trains: 1 under holdout."""
        return self.folds if self.walk_forward else 1

    @property
    def runs(self) -> int:
        """Training runs a trial makes: folds x repeats."""
        return self.n_folds * self.repeats


def objective_label(metric: str, validation: ValidationConfig) -> str:
    """What a trial's value is called where it is shown beside the metric's own figures:
    ``lcb(val_ic)`` under ``aggregate: lcb``, ``ensemble(val_ic)`` under ``aggregate: ensemble``
    (the value is not the val_ic attribute then)."""
    return metric if validation.aggregate == "mean" else f"{validation.aggregate}({metric})"
