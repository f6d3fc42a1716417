"""Time split of the target dates, with a purge gap between consecutive splits.

A sample's target date ``t`` has a label covering dates ``(t, t + horizon]``. Between the last target date
of one split and the first target date of the next, ``horizon + embargo`` dates are dropped, so for every
pair of targets ``t`` (earlier split) and ``u`` (later split): ``t + horizon + embargo < u``. The first
``lookback - 1`` dates are never targets (no full input window)."""

import itertools
import math

import numpy as np

from sweeper.config import DataConfig, SplitConfig
from sweeper.data.columns import user_day
from sweeper.errors import DataError

SPLITS = ("train", "valid", "test")


def split_widths(cfg: DataConfig) -> tuple[int, int, int]:
    """``(lookback, horizon, embargo)`` the split is computed with: the study's pinned
    ``data.split.*`` values (the widest any of its trials can sample), never below the
    config's own (a DataConfig built directly, with them null, uses its own)."""
    s = cfg.split
    return (max(s.lookback or 0, cfg.lookback), max(s.horizon or 0, cfg.horizon),
            max(s.embargo or 0, cfg.embargo))


def purge_gap(horizon: int, embargo: int) -> int:
    """Number of dates dropped between two consecutive splits."""
    return horizon + embargo


def split_dates(dates: np.ndarray, split: SplitConfig, lookback: int, horizon: int, embargo: int,
                where: str) -> dict[str, tuple[int, int]]:
    """``{"train"|"valid"|"test": (start, stop)}`` half-open target-date indices.

    ``where`` prefixes every error message (e.g. ``"data.parquet: column 'date'"``)."""
    gap = purge_gap(horizon, embargo)
    train, valid, test = split.train, split.valid, split.test  # all fractions or all date ranges (validated)
    if isinstance(train, float) and isinstance(valid, float) and isinstance(test, float):
        return fraction_splits(len(dates), (train, valid, test), lookback, gap, where, (horizon, embargo))
    ranges = tuple(part for part in (train, valid, test) if not isinstance(part, float))
    return range_splits(dates, ranges, lookback, gap, where)


def fraction_sizes(budget: int, fractions: tuple[float, float, float]) -> list[int]:
    """Split ``budget`` dates by cumulative rounding (sizes add up exactly).

    Rounding can empty a small split at one budget after filling it at a smaller one
    (0.5/0.17/0.33 of 4 dates is 2/1/1, of 5 dates 3/0/2). From :func:`min_budget` on, an
    emptied split takes a date from the largest, so every larger budget works too."""
    sizes = _rounded(budget, fractions)
    if 0 in sizes and budget >= min_budget(fractions):
        while 0 in sizes:
            sizes[sizes.index(max(sizes))] -= 1
            sizes[sizes.index(0)] += 1
    return sizes


def _rounded(budget: int, fractions: tuple[float, float, float]) -> list[int]:
    # half-up rounding with a tolerance so 0.6*1000 is 600, not 599.99..
    cuts = [0] + [math.floor(c * budget + 0.5 + 1e-9) for c in np.cumsum(fractions)]
    return [cuts[k + 1] - cuts[k] for k in range(3)]


def min_budget(fractions: tuple[float, float, float]) -> int:
    """Smallest number of target dates that gives every split at least one date."""
    return next(budget for budget in itertools.count(3) if min(_rounded(budget, fractions)) >= 1)


def fraction_splits(n_dates: int, fractions: tuple[float, float, float], lookback: int, gap: int, where: str,
                    horizon_embargo: tuple[int, int] = (0, 0)) -> dict[str, tuple[int, int]]:
    """Fractions are of the dates that can be targets: all dates minus the
    ``lookback - 1`` warm-up dates and the two purge gaps."""
    warmup = lookback - 1
    sizes = fraction_sizes(budget, fractions) if (budget := n_dates - warmup - 2 * gap) >= 3 else [0, 0, 0]
    if min(sizes) < 1:
        need = warmup + 2 * gap + min_budget(fractions)
        h, e = horizon_embargo
        raise DataError(f"{where}: {n_dates} dates are too few: lookback {lookback}, horizon {h}, "
                        f"embargo {e} and splits {fractions[0]:g}/{fractions[1]:g}/{fractions[2]:g} need at "
                        f"least {need} dates")
    starts = itertools.accumulate([warmup, *(size + gap for size in sizes[:-1])])
    return {name: (start, start + size) for name, start, size in zip(SPLITS, starts, sizes)}


def range_splits(dates: np.ndarray, ranges: tuple[tuple[str, str], ...], lookback: int, gap: int,
                 where: str) -> dict[str, tuple[int, int]]:
    """Explicit inclusive ``[start, end]`` date ranges; the purge trims the end
    of the earlier split, the warm-up trims the start of any split."""
    bounds = [_range_indices(dates, name, rng, where) for name, rng in zip(SPLITS, ranges)]
    for k in range(2):
        if bounds[k][1] > bounds[k + 1][0]:
            raise DataError(f"{where}: data.split.{SPLITS[k]} {list(ranges[k])} overlaps or comes after "
                            f"data.split.{SPLITS[k + 1]} {list(ranges[k + 1])}; give the ranges in time "
                            "order")
    out: dict[str, tuple[int, int]] = {}
    for k, name in enumerate(SPLITS):
        start, stop = max(bounds[k][0], lookback - 1), bounds[k][1]
        if k < 2:
            stop = min(stop, bounds[k + 1][0] - gap)
        if stop <= start:
            raise DataError(f"{where}: data.split.{name} {list(ranges[k])} has no target dates left after "
                            f"the {lookback - 1} warm-up dates of the lookback window and the purge gap of "
                            f"{gap} dates")
        out[name] = (start, stop)
    return out


def _range_indices(dates: np.ndarray, name: str, rng: tuple[str, str], where: str) -> tuple[int, int]:
    lo, hi = (user_day(v, f"{where}: data.split.{name}", end=k == 1) for k, v in enumerate(rng))
    start = int(np.searchsorted(dates, lo, side="left"))
    if (stop := int(np.searchsorted(dates, hi, side="right"))) <= start:
        first, last = (str(np.datetime_as_string(d, unit="D")) for d in (dates[0], dates[-1]))
        raise DataError(f"{where}: data.split.{name} range {list(rng)} selects no dates "
                        f"(the file has {len(dates)} dates from {first} to {last})")
    return start, stop
