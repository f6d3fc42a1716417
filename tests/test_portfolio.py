"""The long-short view (sweeper.quant.portfolio) against the issue's definitions, written
out here a second time, date by date, with pandas' own qcut."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from sweeper.quant.portfolio import SUMMARY_KEYS, long_short, max_drawdown


def reference_long_short(frame: pd.DataFrame, horizon: int, q: int) -> dict:
    """The definitions, one date at a time (docs/inspect.md, "The long-short view")."""
    ok = frame[np.isfinite(frame["pred"].astype(float)) & np.isfinite(frame["label"].astype(float))]
    counts = ok.groupby("date").size()
    dates = sorted(counts.index[counts >= 2 * q])[::max(horizon, 1)]
    ls, tops, buckets = [], [], []
    for day in dates:
        g = ok[ok["date"] == day]
        bucket = pd.qcut(g["pred"].rank(method="first"), q, labels=False)
        means = g["label"].groupby(bucket).mean()
        ls.append(means[q - 1] - means[0])
        tops.append(set(g["asset"][bucket == q - 1]))
        buckets.append(means.to_numpy())
    ls = np.array(ls)
    peak, drawdown, total = 0.0, 0.0, 0.0
    for v in ls:
        total += v
        peak = max(peak, total)
        drawdown = max(drawdown, peak - total)
    turnover = [1 - len(now & before) / len(now) for before, now in zip(tops, tops[1:])]
    per_year = 252 / max(horizon, 1)
    return {
        "long_short_ann_return": ls.mean() * per_year,
        "long_short_sharpe": ls.mean() / ls.std(ddof=1) * math.sqrt(per_year),
        "long_short_max_drawdown": drawdown,
        "top_turnover": float(np.mean(turnover)),
        "n_periods": len(ls),
        "bucket_mean_label": list(np.mean(buckets, axis=0)),
    }


def assert_matches_reference(got: dict, want: dict) -> None:
    for key in (*SUMMARY_KEYS, "bucket_mean_label"):
        assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-12), key


def random_frame(seed: int, dates: int = 40, assets: int = 23, ties: bool = False) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    days = np.repeat(pd.bdate_range("2021-01-04", periods=dates).to_numpy(), assets)
    names = np.tile([f"S{k:02d}" for k in range(assets)], dates)
    pred = rng.integers(0, 4, len(days)).astype(float) if ties else rng.normal(size=len(days))
    label = 0.01 * pred + rng.normal(0, 0.02, len(days))
    frame = pd.DataFrame({"date": days, "asset": names, "pred": pred, "label": label})
    frame.loc[rng.random(len(frame)) < 0.1, "label"] = np.nan   # missing labels
    frame.loc[rng.random(len(frame)) < 0.05, "pred"] = np.nan
    return frame[rng.random(len(frame)) > 0.05].reset_index(drop=True)  # absent rows


@pytest.mark.parametrize("seed,horizon,q,ties", [(0, 1, 5, False), (1, 2, 5, False), (2, 5, 3, False),
                                                  (3, 2, 4, True), (4, 3, 10, False)])
def test_matches_the_definitions(seed: int, horizon: int, q: int, ties: bool) -> None:
    frame = random_frame(seed, ties=ties)
    assert_matches_reference(long_short(frame, horizon, q).summary(), reference_long_short(frame, horizon, q))


def test_hand_computed_example() -> None:
    # q=2, h=1; 4 assets a day: bottom = the 2 lowest preds, top = the 2 highest
    rows = [("d1", "A", 1, 0.01), ("d1", "B", 2, 0.02), ("d1", "C", 3, 0.03), ("d1", "D", 4, 0.05),
            ("d2", "A", 4, -0.02), ("d2", "B", 3, 0.00), ("d2", "C", 2, 0.01), ("d2", "D", 1, 0.01),
            ("d3", "A", 1, 0.0), ("d3", "B", 2, 0.0), ("d3", "C", 3, np.nan)]  # d3: 2 usable rows < 2q
    frame = pd.DataFrame(rows, columns=["date", "asset", "pred", "label"])
    view = long_short(frame, horizon=1, quantiles=2)
    # d1: top (C, D) 0.04, bottom (A, B) 0.015 -> 0.025; d2: top (A, B) -0.01, bottom (C, D) 0.01 -> -0.02
    assert list(view.dates) == ["d1", "d2"]
    np.testing.assert_allclose(view.ls, [0.025, -0.02], rtol=1e-12)
    s = view.summary()
    assert s["n_periods"] == 2
    assert s["long_short_ann_return"] == pytest.approx(0.0025 * 252)
    assert s["long_short_sharpe"] == pytest.approx(0.0025 / np.std([0.025, -0.02], ddof=1) * math.sqrt(252))
    assert s["long_short_max_drawdown"] == pytest.approx(0.02)  # from the peak 0.025 down to 0.005
    assert s["top_turnover"] == 1.0  # {C, D} -> {A, B}: nothing kept
    assert s["bucket_mean_label"] == pytest.approx([(0.015 + 0.01) / 2, (0.04 - 0.01) / 2])


def test_every_hth_date_is_used_and_ties_go_by_row_order() -> None:
    frame = random_frame(5, dates=30)
    assert long_short(frame, 3, 5).summary()["n_periods"] == len(long_short(frame, 1, 5).dates[::3])
    # all predictions equal: rank "first" orders by row, so the top bucket is the last rows
    flat = pd.DataFrame({"date": ["d"] * 10, "asset": list("ABCDEFGHIJ"), "pred": 1.0,
                         "label": np.arange(10) / 100})
    view = long_short(flat, 1, 5)
    assert view.ls[0] == pytest.approx((0.08 + 0.09) / 2 - (0.00 + 0.01) / 2)


def test_drawdown_counts_a_fall_from_the_start() -> None:
    assert max_drawdown(np.array([-0.05, -0.01, 0.03])) == pytest.approx(0.06)
    assert max_drawdown(np.array([0.01, 0.02])) == 0.0
    assert math.isnan(max_drawdown(np.array([])))


def test_too_few_dates_give_json_safe_nones() -> None:
    frame = pd.DataFrame({"date": ["d"] * 4, "asset": list("ABCD"), "pred": [1.0, 2, 3, 4], "label": [0.1] * 4})
    s = long_short(frame, 1, 5).summary()  # 4 rows < 2q = 10: no date is usable
    assert s["n_periods"] == 0 and s["long_short_ann_return"] is None and s["long_short_sharpe"] is None
    assert s["top_turnover"] is None and s["bucket_mean_label"] == [None] * 5
    with pytest.raises(ValueError, match="quantiles"):
        long_short(frame, 1, 1)


def test_report_quantiles_is_a_config_key():
    from sweeper.config import validate_config
    from sweeper.errors import ConfigError

    assert validate_config({"data": {"synthetic": {}}}, "s.yaml").report.quantiles == 5
    assert validate_config({"data": {"synthetic": {}}, "report": {"quantiles": 10}}, "s.yaml").report.quantiles == 10
    with pytest.raises(ConfigError, match="report.quantiles"):
        validate_config({"data": {"synthetic": {}}, "report": {"quantiles": 1}}, "s.yaml")
    with pytest.raises(ConfigError, match="did you mean 'report.quantiles'"):
        validate_config({"data": {"synthetic": {}}, "report": {"quantile": 4}}, "s.yaml")
