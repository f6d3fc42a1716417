"""sweeper's factor figures against alphalens-reloaded's (docs/inspect.md, "Agreement with
alphalens"): the daily rank IC, the mean label by quantile, the top-minus-bottom spread and
the top-quantile turnover, alphalens' factor data built directly from a prediction frame
(the prediction as ``factor``, the label as the forward-return column, no prices). Where the
definitions coincide the figures agree to 1e-6; where they differ, the documented relation
is asserted. On one real study's ``sweeper predict --split test`` output, and on ragged
synthetic frames (missing rows, several h and q) for the binning."""
from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pandas as pd
import pytest
import yaml

os.environ.setdefault("MPLBACKEND", "Agg")  # alphalens imports matplotlib: no display needed
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # a third-party import's deprecation notes are not ours to fix
    from alphalens import performance as al_perf
    from alphalens import utils as al_utils

from conftest import TINY, merge, sweeper_cli
from sweeper.quant.ic import daily_ic, ic_report
from sweeper.quant.portfolio import LongShort, long_short
from test_portfolio import random_frame

STUDY = merge(TINY, {"study": {"name": "al", "n_trials": 2}, "train": {"epochs": 1}})
Q, H = 5, 2  # report.quantiles and data.horizon of STUDY (their defaults)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """One real sweep, ``sweeper predict --trial best --split test`` and ``sweeper best --json``
    (in process: the figures, not the processes, are under test)."""
    root = tmp_path_factory.mktemp("alphalens")
    (root / "study.yaml").write_text(yaml.safe_dump(STUDY))
    sweeper_cli(root, "run", "study.yaml")
    sweeper_cli(root, "predict", "study.yaml", "--trial", "best", "--split", "test", "-o", "test.parquet")
    best = json.loads(sweeper_cli(root, "best", "study.yaml", "--json").stdout)
    # in float64, as sweeper computes: float32 sums of the float32 labels drift by ~1e-6
    frame = pd.read_parquet(root / "test.parquet").astype({"pred": "float64", "label": "float64"})
    return {"frame": frame, "best": best}


def factor_data(frame: pd.DataFrame, horizon: int, q: int | None = Q, factor: str = "pred") -> pd.DataFrame:
    """alphalens' factor data of a prediction frame: index (date, asset), ``factor``, the label
    as the forward return ``{h}D`` and, with ``q``, alphalens' own ``factor_quantile``
    (``quantize_factor``: pd.qcut of the factor's values on each date, quantiles 1..q)."""
    ok = frame[np.isfinite(frame["pred"]) & np.isfinite(frame["label"])]
    index = pd.MultiIndex.from_arrays([pd.to_datetime(ok["date"]), ok["asset"]], names=["date", "asset"])
    data = pd.DataFrame({f"{max(horizon, 1)}D": ok["label"].to_numpy(np.float64),
                         "factor": ok[factor].to_numpy(np.float64)}, index=index).sort_index()
    if q is not None:
        data["factor_quantile"] = al_utils.quantize_factor(data, quantiles=q)
    return data


def used(frame: pd.DataFrame, view: LongShort) -> pd.DataFrame:
    """The rows on the dates sweeper's long-short view used (every h-th date with >= 2q rows)."""
    return frame[pd.to_datetime(frame["date"]).isin(pd.to_datetime(view.dates))]


def by_date(data: pd.DataFrame, demeaned: bool = False) -> pd.DataFrame:
    """alphalens' mean forward return by (quantile, date), as a [date, quantile] table."""
    means, _ = al_perf.mean_return_by_quantile(data, by_date=True, demeaned=demeaned)
    return means.iloc[:, 0].unstack("factor_quantile")


def has_ties(frame: pd.DataFrame) -> bool:
    ok = frame[np.isfinite(frame["pred"]) & np.isfinite(frame["label"])]
    return bool(ok.duplicated(["date", "pred"]).any())


# ------------------------------------------------------------------ the real study


@pytest.mark.slow
def test_rank_ic_is_alphalens_ic(study):
    """alphalens' IC is Spearman: sweeper's ``rank_ic``, date by date (``ic`` is Qlib's Pearson)."""
    frame = study["frame"]
    ours = daily_ic(frame).set_index("date")["rank_ic"]
    theirs = al_perf.factor_information_coefficient(factor_data(frame, H, q=None))[f"{H}D"]
    labelled = frame["date"][np.isfinite(frame["label"])].nunique()  # the last h dates have no label
    assert len(ours) == len(theirs) == labelled > 20
    np.testing.assert_allclose(ours.to_numpy(), theirs.to_numpy(), rtol=0, atol=1e-6)
    assert list(pd.to_datetime(ours.index)) == list(theirs.index)
    mean = float(theirs.mean())
    assert ic_report(frame)["rank_ic"] == pytest.approx(mean, abs=1e-6)
    assert study["best"]["metrics"]["test_rank_ic"] == pytest.approx(mean, abs=1e-6)
    # the Pearson IC is another figure: alphalens has no counterpart to compare it with
    assert abs(ic_report(frame)["ic"] - mean) > 1e-6


@pytest.mark.slow
def test_bucket_means_spread_and_turnover_are_alphalens_on_the_used_dates(study):
    frame = study["frame"]
    view = long_short(frame, H, Q)
    assert not has_ties(frame) and view.summary()["n_periods"] > 10
    assert_agrees_with_alphalens(frame, view, H, Q)
    # and `sweeper best` reports the same figures for the same frame
    reported = study["best"]["portfolio"]["test"]
    data = factor_data(used(frame, view), H)
    means, _ = al_perf.mean_return_by_quantile(data, demeaned=False)
    assert reported["bucket_mean_label"] == pytest.approx(list(means.iloc[:, 0]), rel=1e-6, abs=1e-12)
    turnover = al_perf.quantile_turnover(data["factor_quantile"], Q, period=1)
    assert reported["top_turnover"] == pytest.approx(float(turnover.mean()), rel=1e-6)
    spread, _ = al_perf.compute_mean_returns_spread(by_date(data).stack(), Q, 1)
    assert reported["long_short_ann_return"] == pytest.approx(2 * spread.mean() * 252 / H, rel=1e-6)


# ------------------------------------------------------------------ the documented relations


def assert_agrees_with_alphalens(frame: pd.DataFrame, view: LongShort, horizon: int, q: int) -> None:
    """Each relation of docs/inspect.md, "Agreement with alphalens", on a frame without ties."""
    data = factor_data(used(frame, view), horizon, q)
    # binning: alphalens' quantile k is sweeper's bucket k-1, so each (date, bucket) mean agrees
    table = by_date(data)
    assert list(table.columns) == list(range(1, q + 1))
    np.testing.assert_allclose(table.to_numpy(), view.buckets, rtol=1e-6, atol=1e-12)
    # mean label by quantile: sweeper's bucket_mean_label is alphalens' with demeaned=False ...
    summary = view.summary()
    means, _ = al_perf.mean_return_by_quantile(data, demeaned=False)
    np.testing.assert_allclose(means.iloc[:, 0], summary["bucket_mean_label"], rtol=1e-6, atol=1e-12)
    # ... and alphalens' default (demeaned=True) is it minus the mean over dates of the date's mean label
    demeaned, _ = al_perf.mean_return_by_quantile(data)
    day_mean = data.iloc[:, 0].groupby(level="date").mean().mean()
    np.testing.assert_allclose(demeaned.iloc[:, 0], np.array(summary["bucket_mean_label"]) - day_mean,
                               rtol=1e-6, atol=1e-12)
    # spread: alphalens halves top - bottom (a 100% gross book), with or without demeaning
    for flag in (False, True):
        spread, _ = al_perf.compute_mean_returns_spread(by_date(data, flag).stack(), q, 1)
        np.testing.assert_allclose(2 * spread.to_numpy(), view.ls, rtol=1e-6, atol=1e-12)
    # turnover: alphalens' quantile_turnover of the top quantile on the used dates, period 1 ...
    turnover = al_perf.quantile_turnover(data["factor_quantile"], q, period=1)
    assert np.isnan(turnover.iloc[0])  # no date before the first
    np.testing.assert_allclose(turnover.iloc[1:].to_numpy(), view.turnover, rtol=1e-6, atol=1e-12)
    assert summary["top_turnover"] == pytest.approx(float(turnover.mean()), rel=1e-6)
    # ... which is period=h on every eligible date, read at the used ones (alphalens averages all)
    every = long_short(frame, 1, q)
    lagged = al_perf.quantile_turnover(factor_data(used(frame, every), horizon, q)["factor_quantile"], q,
                                       period=max(horizon, 1))
    np.testing.assert_allclose(lagged.loc[pd.to_datetime(view.dates[1:])].to_numpy(), view.turnover,
                               rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("seed,horizon,q", [(0, 1, 5), (1, 2, 5), (2, 5, 3), (4, 3, 10)])
def test_ragged_frames_agree_with_alphalens(seed, horizon, q):
    """Missing preds, labels and rows: every date has its own number of assets."""
    frame = random_frame(seed)
    assert not has_ties(frame)
    view = long_short(frame, horizon, q)
    assert view.summary()["n_periods"] >= 5
    assert_agrees_with_alphalens(frame, view, horizon, q)


def test_ties_go_by_row_order_where_alphalens_keeps_them_together():
    """At ties sweeper's buckets are alphalens' of the prediction's ``rank(method="first")``
    on each date (equal counts); alphalens' qcut of the values themselves puts equal values
    in one quantile, or refuses a date whose edges repeat."""
    frame = random_frame(3, ties=True)   # predictions 0..3: many ties on every date
    assert has_ties(frame)
    view = long_short(frame, 2, 4)
    rows = used(frame, view)
    rows = rows[np.isfinite(rows["pred"]) & np.isfinite(rows["label"])].copy()
    rows["first"] = rows.groupby("date")["pred"].rank(method="first")
    data = factor_data(rows, 2, 4, factor="first")
    np.testing.assert_allclose(by_date(data).to_numpy(), view.buckets, rtol=1e-6, atol=1e-12)
    with pytest.raises(ValueError, match="Bin edges must be unique"):
        al_utils.quantize_factor(factor_data(rows, 2, None), quantiles=4)
    two = pd.DataFrame({"date": "2021-01-04", "asset": list("ABCDEFGH"), "label": np.arange(8) / 100.0,
                        "pred": [1.0, 2, 3, 4, 4, 4, 4, 5]})  # qcut edges 1, 4, 5
    theirs = al_utils.quantize_factor(factor_data(two, 1, None), quantiles=2)
    assert list(theirs) == [1, 1, 1, 1, 1, 1, 1, 2]  # the four 4s stay together in the bottom half
    assert list(long_short(two, 1, 2).buckets[0]) == pytest.approx([0.015, 0.055])  # 4 and 4 rows


def test_a_constant_prediction_is_ic_0_where_alphalens_has_none():
    frame = pd.DataFrame({"date": np.repeat(["2021-01-04", "2021-01-05"], 4), "asset": list("ABCD") * 2,
                          "pred": [1.0, 2, 4, 3, 0.5, 0.5, 0.5, 0.5], "label": [0.01, 0.02, 0.03, 0.04] * 2})
    assert daily_ic(frame)["rank_ic"].tolist() == pytest.approx([0.8, 0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns that a constant input has no correlation
        theirs = al_perf.factor_information_coefficient(factor_data(frame, 1, q=None))["1D"]
    assert theirs.iloc[0] == pytest.approx(0.8) and np.isnan(theirs.iloc[1])
