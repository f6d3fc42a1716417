"""IC through time and IC within groups: where in the calendar a model's IC came from, and how
much of it survives taking out what a group (e.g. a sector) shares on each date.

* :func:`ic_by_year` / :func:`ic_by_month`: the mean of a daily IC frame (``date, ic, rank_ic``)
  per calendar year, and per year and month; a day without an IC (NaN) is left out of its mean.
* :func:`group_neutral_ic`: the IC of prediction and label demeaned within each (date, group). A
  model that only ranks groups has no spread left inside one: its group-neutral IC is ~0."""

import numpy as np
import pandas as pd

from sweeper.quant.ic import ICReport, check_columns, ic_report


def _dated(daily: pd.DataFrame, col: str) -> pd.Series:
    """``col`` of a daily IC frame indexed by its parsed dates, NaN days dropped."""
    check_columns(daily, ("date", col), "a daily IC frame")
    values = pd.Series(pd.to_numeric(daily[col], errors="coerce").to_numpy(np.float64),
                       index=pd.DatetimeIndex(pd.to_datetime(daily["date"])))
    return values[np.isfinite(values.to_numpy())]


def ic_by_year(daily: pd.DataFrame, col: str = "ic") -> dict[int, float]:
    """``{year: mean daily IC}`` for every calendar year with at least one IC day, ascending."""
    values = _dated(daily, col)
    means = values.groupby(pd.DatetimeIndex(values.index).year).mean()
    return {int(year): float(mean) for year, mean in zip(means.index.tolist(), means.tolist(), strict=True)}


def ic_by_month(daily: pd.DataFrame, col: str = "ic") -> pd.DataFrame:
    """A year x month table of mean daily IC: one row per calendar year with an IC day
    (ascending), columns 1..12, NaN for a month without one."""
    values = _dated(daily, col)
    days = pd.DatetimeIndex(values.index)
    return (values.groupby([days.year, days.month]).mean().unstack().reindex(columns=range(1, 13))
            .rename_axis(index="year", columns="month").astype(np.float64))


def demean_within(frame: pd.DataFrame, group: str = "group") -> pd.DataFrame:
    """``date, group, pred, label`` with pred and label minus their mean within each (date, group),
    over the pairs the IC scores (rows without a group or a finite pred and label dropped first); a
    group of one asset on a date is dropped too: demeaned, it would add weight without information."""
    check_columns(frame, ("date", "pred", "label", group), "group-neutral IC")
    pred, label = (pd.to_numeric(frame[c], errors="coerce").to_numpy(np.float64) for c in ("pred", "label"))
    keep = np.isfinite(pred) & np.isfinite(label) & frame[group].notna().to_numpy()
    out = pd.DataFrame({"date": frame["date"].to_numpy()[keep], "group": frame[group].to_numpy()[keep],
                        "pred": pred[keep], "label": label[keep]})
    by = out.groupby(["date", "group"], sort=False)
    size = by["pred"].transform("size").to_numpy()
    for side in ("pred", "label"):
        # a side constant within its group is exactly 0 once demeaned: x - mean(x) would
        # leave rounding residue, which the IC would then correlate as if it were a signal
        flat = (by[side].transform("min") == by[side].transform("max")).to_numpy()
        out[side] = np.where(flat, 0.0, out[side] - by[side].transform("mean"))
    return out[size >= 2].reset_index(drop=True)


def group_neutral_ic(frame: pd.DataFrame, group: str = "group") -> ICReport:
    """:func:`sweeper.quant.ic.ic_report` of pred and label demeaned within (date, group)."""
    return ic_report(demean_within(frame, group))
