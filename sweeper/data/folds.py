"""Walk-forward folds: the one home of the fold layout and of each fold's panel.

Under ``validation.scheme: walk_forward`` the target dates before the test split are cut into
``validation.folds`` valid blocks that march forward in time. The region runs from the first train target
(``data.split``'s train start) to the test split's start less the purge of ``horizon + embargo`` dates, so
the last block ends where the test split's purge begins and no fold sees a test date. Fold ``i`` validates
on block ``i`` and trains on the targets before it, less the same purge (:mod:`sweeper.data.split`'s rule:
for every train target ``t`` and valid target ``u``, ``t + horizon + embargo < u``).

- ``window: expanding``: every fold trains from the first train target;
- ``window: rolling``: on the last ``validation.train_dates`` targets before the purge (by
  default as many as the first fold has, so every fold trains on as many dates).

Blocks hold ``validation.valid_dates`` targets each; by default the region less one purge is cut into
``folds + 1`` equal parts, the first being the first fold's train window (as scikit-learn's
``TimeSeriesSplit``). A layout that cannot fit (a train window shorter than :data:`MIN_TRAIN_DATES` or the
lookback, a block shorter than :data:`MIN_VALID_DATES`) is a ConfigError naming the keys. The layout depends
only on the panel's dates and the pinned split widths: every trial of a study is judged on the same folds.

Under ``holdout`` the layout is one fold: the panel's own train and valid splits."""

import dataclasses
from dataclasses import dataclass

import pandas as pd

from sweeper.config import DataConfig, SweeperConfig
from sweeper.config.validation import MIN_VALID_DATES
from sweeper.data.panel import Panel
from sweeper.data.split import purge_gap, split_widths
from sweeper.errors import ConfigError

MIN_TRAIN_DATES = 20  # target dates a fold's train window needs at least (and at least the lookback)


@dataclass(frozen=True)
class Fold:
    """One fold: ``[start, stop)`` target-date indices of its train window and valid block."""

    index: int
    train: tuple[int, int]
    valid: tuple[int, int]


def fold_layout(panel: Panel, cfg: SweeperConfig) -> list[Fold]:
    """The study's folds on ``panel``'s dates (one, the panel's own split, under holdout);
    raises ConfigError when walk-forward folds cannot fit."""
    if not cfg.validation.walk_forward:
        return [Fold(0, panel.splits["train"], panel.splits["valid"])]
    lookback, horizon, embargo = split_widths(cfg.data)
    v, gap, first = cfg.validation, purge_gap(horizon, embargo), panel.splits["train"][0]
    end = panel.splits["test"][0] - gap  # the last block stops where the test split's purge begins
    span = end - first
    size = v.valid_dates if v.valid_dates is not None else (span - gap) // (v.folds + 1)
    need_train = max(MIN_TRAIN_DATES, lookback)
    if size < MIN_VALID_DATES:
        fix = (f"set validation.valid_dates to at least {MIN_VALID_DATES}, or " if v.valid_dates is not None
               else "set fewer validation.folds, or " if v.folds > 2 else "")  # 2 is walk-forward's least
        raise _too_small(cfg, span, gap, f"valid blocks of {max(size, 0)} target dates; each needs at "
                                         f"least {MIN_VALID_DATES}", fix)
    starts = [end - (v.folds - i) * size for i in range(v.folds)]
    if (first_train := starts[0] - gap - first) < need_train:
        raise _too_small(cfg, span, gap, f"a first train window of {max(first_train, 0)} target dates; "
                                         f"each needs at least {need_train} (the larger of "
                                         f"{MIN_TRAIN_DATES} and data.lookback)")
    length = v.train_dates if v.train_dates is not None else first_train
    if v.window == "rolling" and length < need_train:
        raise ConfigError(f"validation.train_dates: {length} target dates is too short a rolling window; it "
                          f"needs at least {need_train} (the larger of {MIN_TRAIN_DATES} and data.lookback)")
    if v.window == "rolling" and length > first_train:  # else the folds would train on different lengths
        raise ConfigError(f"validation.train_dates: {length} target dates is too long a rolling window; "
                          f"the first fold has {first_train} before its purge: set at most that, or fewer "
                          "validation.folds")
    return [Fold(i, (max(first, start - gap - length) if v.window == "rolling" else first, start - gap),
                 (start, start + size)) for i, start in enumerate(starts)]


def _too_small(cfg: SweeperConfig, span: int, gap: int, what: str, fix: str | None = None) -> ConfigError:
    v = cfg.validation
    if fix is None:  # a first train window too short
        fix = f"set {'fewer validation.folds or ' * (v.folds > 2)}a smaller validation.valid_dates, or "
    sizes = f"validation.valid_dates {v.valid_dates}" if v.valid_dates is not None else "equal parts"
    return ConfigError(
        f"validation.folds: {v.folds} walk-forward folds ({sizes}) in the {span} target dates before "
        f"the test split's purge of {gap} dates give {what}: {fix}give the train and valid splits "
        "more dates (data.split.test, data.split.*)")


def fold_spans(panel: Panel, folds: list[Fold]) -> list[dict[str, list[str]]]:
    """``[{"train": [first, last], "valid": [first, last]}]``: ISO days of each fold's target dates
    (the ``fold_dates`` user attribute)."""
    return [{"train": panel.days(f.train), "valid": panel.days(f.valid)} for f in folds]


def fold_panel(panel: Panel, fold: Fold, cfg: DataConfig) -> Panel:
    """``panel`` with the fold's train and valid splits (its test split unchanged), its features
    normalised with statistics fitted on the fold's train window only.

    Cross-sectional norms (``cs_zscore``, ``cs_rank``, ``none``) fit nothing over time: the fold
    shares the panel's arrays. ``robust_zscore`` fits a median and MAD over time, so its fold
    panel is built again from the data with the fold's dates as the split (through the panel
    cache, one entry per fold); it also carries that fold's oracle IC."""
    if (splits := {"train": fold.train, "valid": fold.valid, "test": panel.splits["test"]}) == panel.splits:
        return panel
    if cfg.feature_norm != "robust_zscore":
        oracle = None if panel.oracle_ic is None else {**panel.oracle_ic, "valid": float("nan")}
        return dataclasses.replace(panel, splits=splits, oracle_ic=oracle, _cache={})
    from sweeper.data.load import load_panel

    # the fold's splits as inclusive date ranges, with the study's pinned widths: the split rule
    # (:func:`~sweeper.data.split.range_splits`) gives back exactly these target indices
    ranges = {name: tuple(pd.Timestamp(panel.dates[k]).isoformat() for k in (a, b - 1))
              for name, (a, b) in splits.items()}
    return load_panel(cfg.model_copy(update={"split": cfg.split.model_copy(update=ranges)}))
