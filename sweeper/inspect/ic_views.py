"""The best trial's IC through time and within groups, as ``sweeper best`` and the report
show them (the arithmetic is :mod:`sweeper.quant.ic_time`).

* ``ic_by_year``: read from the trial's daily IC files, so it costs no model run.
* ``group_neutral`` (with ``data.group_col``): the best trial's predictions on valid and
  test (the frames ``sweeper predict`` writes) joined by (date, asset) to the group column
  of ``data.path``, then demeaned within each (date, group). The group never enters the
  panel's tensors: :func:`sweeper.data.parquet.read_groups` reads it beside them.
* The LightGBM baseline's daily IC files (``<run_dir>/baseline/daily_ic_<split>.csv``,
  same columns as a trial's) feed the same views when they exist."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from sweeper.errors import SweeperError
from sweeper.plain import plain
from sweeper.quant.ic_time import group_neutral_ic, ic_by_year
from sweeper.store.layout import SPLITS, BaselineFiles, TrialFiles

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from sweeper.config import SweeperConfig
    from sweeper.inspect.frames import TrialFrames

GROUP_KEYS = ("ic", "rank_ic", "icir", "n_dates")


def daily_frames(files: TrialFiles | BaselineFiles) -> dict[str, pd.DataFrame]:
    """``{split: daily IC frame}`` (``date, ic, rank_ic``) of a trial's (or the baseline's) files, for
    the splits that have one (a damaged file must not cost ``status`` or ``best`` the rest of the view)."""
    out = {}
    for split in SPLITS:
        try:
            frame = pd.read_csv(files.daily_ic(split))
        except (FileNotFoundError, ValueError, UnicodeDecodeError):  # ValueError: ParserError, EmptyDataError
            continue
        if {"date", "ic"} <= set(frame.columns):
            out[split] = frame
    return out


def ic_by_year_report(frames: dict[str, pd.DataFrame]) -> dict[str, dict[str, float]]:
    """The ``best --json`` key ``ic_by_year`` of the best trial's :func:`daily_frames`:
    ``{split: {"2021": mean daily IC, ...}}`` (year keys as text, as JSON writes them)."""
    return {split: {str(year): mean for year, mean in ic_by_year(frame).items()}
            for split, frame in frames.items()}


def group_neutral_report(cfg: SweeperConfig, predictor: TrialFrames, best: FrozenTrial) -> dict[str, Any]:
    """The ``best --json`` key ``group_neutral``: ``{split: {ic, rank_ic, icir, n_dates}}`` of the best
    trial's predictions demeaned within (date, group); None with ``group_neutral_unavailable`` (the reason)
    when they cannot be computed. Empty without ``data.group_col``."""
    if cfg.data.group_col is None:
        return {}
    from sweeper.data.parquet import read_groups  # the sweeper.data package imports torch

    try:
        groups = read_groups(cfg.data).drop_duplicates(["date", "asset"])
        out = {}
        for split in SPLITS:  # each prediction row with its group (NaN where the file has none)
            frame = predictor.frame(best, split).merge(groups, on=["date", "asset"], how="left",
                                                       validate="many_to_one")
            out[split] = {key: plain(v) for key, v in group_neutral_ic(frame).items() if key in GROUP_KEYS}
    except SweeperError as exc:
        return {"group_neutral": None, "group_neutral_unavailable": str(exc)}
    return {"group_neutral": out, "group_col": cfg.data.group_col}
