"""The fold contract: the names of the user attributes a trial of several runs records (and
the study's fold layout), in one home. The worker writes them; ``best``, ``status``,
``export``, the report, ``predict`` and ``refit`` read them (docs/walk-forward.md).

Walk-forward or not is a fact of the stored study, asked through :func:`folded` alone: a study
whose ``fold_dates`` attribute lists its folds (a holdout study stores an empty list, and one
stored before folds existed none at all)."""

from collections.abc import Mapping
from typing import Any

FOLD_DATES = "fold_dates"                # study (and trial): [{"train": [a, b], "valid": [c, d]}, ...]
FOLD_BEST_EPOCH = "fold_best_epoch"      # per fold, the median over its seeds of best_epoch
FOLDS_RUN = "folds_run"                  # folds with a scored run (the last may be cut short)
SEED_VAL_IC_SD = "seed_val_ic_sd"        # mean over folds of the std of the seeds' val_ic
SEED_ENSEMBLE_VAL_IC = "seed_ensemble_val_ic"
FOLD_SEED_ENSEMBLE_VAL_IC = "fold_seed_ensemble_val_ic"
# with seed repeats the trial's test_ic, test_rank_ic and test_icir are its seed ensemble's (the
# mean of the model fold's seeds' predictions); each seed's own test figures stay here, in seed order
SEED_TEST_IC = "seed_test_ic"
SEED_TEST_RANK_IC = "seed_test_rank_ic"
RESUMED_FROM_FOLD = "resumed_from_fold"  # a retry: the fold it continued (1-based)
RESUMED_RUNS = "resumed_runs"            # a retry: runs it found finished and skipped


def fold_key(metric: str) -> str:
    """Per fold, the mean over seeds of ``metric``: ``fold_val_ic``."""
    return f"fold_{metric}"


def se_key(metric: str) -> str:
    """The fold scores' standard error (one fold: the seeds'): ``val_ic_se``."""
    return f"{metric}_se"


def worst_key(metric: str) -> str:
    """The worst fold's score (walk-forward only): ``worst_fold_val_ic``."""
    return f"worst_fold_{metric}"


FOLD_VAL_IC, VAL_IC_SE, WORST_FOLD_VAL_IC = fold_key("val_ic"), se_key("val_ic"), worst_key("val_ic")


def folded(study_attrs: Mapping[str, Any]) -> bool:
    """Whether a stored study validates on walk-forward folds (its user attributes)."""
    return bool(study_attrs.get(FOLD_DATES))


def layout(study_attrs: Mapping[str, Any]) -> list[dict[str, list[str]]]:
    """The stored study's folds (empty for a holdout study)."""
    return list(study_attrs.get(FOLD_DATES) or [])
