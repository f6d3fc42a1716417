"""IC through time (year and year x month means of the daily IC) and group-neutral IC
(prediction and label demeaned within each group per date): the arithmetic on hand-built
frames, then a real sweep on a Parquet panel whose test split spans three calendar years
and carries a sector column, read back through ``best --json`` and ``sweeper report``."""
from __future__ import annotations

import json
import math
import os
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from conftest import TINY, merge
from sweeper.cli import main
from sweeper.config import DataConfig
from sweeper.data import load_panel, write_synthetic
from sweeper.data.synth import START_DATE
from sweeper.errors import DataError
from sweeper.quant.ic import daily_ic, ic_report
from sweeper.quant.ic_time import demean_within, group_neutral_ic, ic_by_month, ic_by_year

# ------------------------------------------------------------------ arithmetic


def _daily() -> pd.DataFrame:
    """Daily ICs from 2019-11-25 to 2021-01-08 (business days): 3 calendar years."""
    dates = pd.bdate_range("2019-11-25", "2021-01-08")
    ic = np.round(np.sin(np.arange(len(dates)) / 7.0) / 10, 6)
    frame = pd.DataFrame({"date": dates.strftime("%Y-%m-%d"), "ic": ic, "rank_ic": ic / 2})
    frame.loc[frame["date"] == "2020-03-02", "ic"] = np.nan  # a day without an IC: left out of its mean
    return frame


def test_ic_by_year_and_month_are_plain_means():
    daily = _daily()
    years = ic_by_year(daily)
    assert list(years) == [2019, 2020, 2021]
    days = pd.to_datetime(daily["date"])
    for year in (2019, 2020, 2021):
        picked = daily["ic"][(days.dt.year == year) & daily["ic"].notna()]
        assert years[year] == pytest.approx(float(picked.sum() / len(picked)), abs=1e-15)
    table = ic_by_month(daily)
    assert table.index.tolist() == [2019, 2020, 2021] and table.columns.tolist() == list(range(1, 13))
    # March 2020 by hand: its 22 business days but the NaN one, summed and divided by 21
    march = daily[(days.dt.year == 2020) & (days.dt.month == 3)]
    assert len(march) == 22
    assert table.loc[2020, 3] == pytest.approx(float(march["ic"].dropna().sum()) / 21, abs=1e-15)
    assert table.loc[2019].isna().tolist() == [True] * 10 + [False, False]
    assert table.loc[2021].notna().tolist() == [True] + [False] * 11
    assert ic_by_year(daily, "rank_ic")[2021] == pytest.approx(years[2021] / 2)


def _grouped(within: float) -> pd.DataFrame:
    """4 sectors x 5 assets x 30 dates: the label is the sector's move plus the asset's own
    move; the prediction is the sector's move, plus ``within`` times the asset's own."""
    rng = np.random.default_rng(3)
    rows = []
    for d in pd.bdate_range("2021-01-04", periods=30):
        sector_move = rng.normal(size=4)
        for a in range(20):
            own = rng.normal()
            rows.append((d, f"A{a:02d}", f"S{a % 4}", sector_move[a % 4] + within * own,
                         sector_move[a % 4] + 0.2 * own))
    return pd.DataFrame(rows, columns=["date", "asset", "sector", "pred", "label"])


def test_a_model_that_only_bets_on_sectors_has_no_group_neutral_ic():
    frame = _grouped(within=0.0)
    raw = ic_report(frame)
    assert raw["ic"] > 0.9
    neutral = group_neutral_ic(frame, "sector")
    # no spread left within a sector: every date scores a constant prediction, IC 0
    assert neutral["ic"] == 0.0 and neutral["rank_ic"] == 0.0
    assert neutral["n_dates"] == 30 and neutral["n_constant_dates"] == 30


def test_group_neutral_ic_is_the_pearson_of_the_demeaned_pairs():
    frame = _grouped(within=0.5)
    frame.loc[3, "sector"] = None      # no group: left out
    frame.loc[7, "label"] = np.nan     # no label: left out before the means
    neutral = group_neutral_ic(frame, "sector")
    kept = frame.drop(index=[3, 7])
    ics = []
    for _, day in kept.groupby("date"):
        p = day["pred"] - day.groupby("sector")["pred"].transform("mean")
        y = day["label"] - day.groupby("sector")["label"].transform("mean")
        ics.append(np.corrcoef(p, y)[0, 1])
    assert neutral["ic"] == pytest.approx(float(np.mean(ics)), abs=1e-12)
    assert neutral["ic"] > 0.5
    demeaned = demean_within(frame, "sector")
    assert len(demeaned) == len(frame) - 2
    assert demeaned.groupby(["date", "group"])["pred"].sum().abs().max() < 1e-12


def test_a_group_of_one_asset_on_a_date_is_left_out():
    frame = pd.DataFrame({"date": ["d1"] * 5, "pred": [1.0, 2.0, 3.0, 4.0, 9.0],
                          "label": [1.0, 3.0, 2.0, 5.0, -7.0], "g": ["a", "a", "b", "b", "c"]})
    out = demean_within(frame, "g")
    assert out["pred"].tolist() == [-0.5, 0.5, -0.5, 0.5] and out["label"].tolist() == [-1.0, 1.0, -1.5, 1.5]
    # by hand: covariance 0.5 + 0.5 + 0.75 + 0.75, variances 1 and 6.5 (sums of squares)
    assert daily_ic(out)["ic"].tolist() == pytest.approx([2.5 / math.sqrt(6.5)], abs=1e-15)


def test_a_frame_without_the_group_column_is_a_data_error():
    with pytest.raises(DataError, match="group-neutral IC needs the column 'sector'"):
        group_neutral_ic(_grouped(0.0).drop(columns="sector"), "sector")


# ------------------------------------------------------------------ the data layer

N_DATES = 820  # business days from 2010-01-04: to 2013-02; the test split covers 2011-10 to the end


def _panel_with_sectors(path, dates=N_DATES):
    write_synthetic(path, assets=24, dates=dates, features=3, seed=4)
    table = pq.read_table(path)
    assets = table.column("asset").to_pylist()
    sector = pa.array([int(a[1:]) % 3 for a in assets], type=pa.int64())  # numeric: must not become a feature
    pq.write_table(table.append_column("sector", sector).replace_schema_metadata(table.schema.metadata), path)
    return path


def _split():
    days = pd.bdate_range(START_DATE, periods=N_DATES)
    return {"train": ["2010-01-01", "2010-12-31"], "valid": ["2011-01-01", "2011-09-30"],
            "test": ["2011-10-01", str(days[-1].date())]}


def test_the_group_column_is_read_beside_the_panel_never_as_a_feature(tmp_path):
    path = _panel_with_sectors(tmp_path / "p.parquet", dates=120)
    plain = load_panel(DataConfig(path=str(path), lookback=5, cache=False))
    assert "sector" in plain.features  # without data.group_col it is just another numeric column
    grouped = load_panel(DataConfig(path=str(path), lookback=5, cache=False, group_col="sector"))
    assert grouped.features == ["f00", "f01", "f02"]
    with pytest.raises(DataError, match=r"column 'industry' \(data.group_col\) not found"):
        load_panel(DataConfig(path=str(path), lookback=5, cache=False, group_col="industry"))
    with pytest.raises(DataError, match=r"data.group_col 'sector': the synthetic panel"):
        load_panel(DataConfig(synthetic={"assets": 4, "dates": 40, "features": 2}, group_col="sector"))


def _study(root, **data):
    raw = merge(TINY, {"study": {"name": "years", "n_trials": 2}, "report": {"baseline": None},
                       "data": {"synthetic": None, "path": "panel.parquet", "split": _split(), **data}})
    raw["model"] = {"name": "mlp", "hidden_size": 8}
    path = root / "study.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


# slow: `sweeper run` starts the workers' fork server once the study file loads, before the data's checks
@pytest.mark.slow
def test_a_missing_group_column_is_exit_2_naming_it(workdir):
    _panel_with_sectors(workdir / "panel.parquet", dates=120)
    path = _study(workdir, group_col="industry", split={"train": 0.6, "valid": 0.2, "test": 0.2})
    result = CliRunner().invoke(main, ["run", str(path)], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert "column 'industry' (data.group_col) not found" in result.output
    assert "Traceback" not in result.output


# ------------------------------------------------------------------ a real sweep


def _cli(*args):
    result = CliRunner().invoke(main, list(map(str, args)), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    root = tmp_path_factory.mktemp("years")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        _panel_with_sectors(root / "panel.parquet")
        path = _study(root, group_col="sector")
        _cli("run", path)
        best = json.loads(_cli("best", path, "--json"))
        text = _cli("best", path)
        # the LightGBM baseline's daily IC files, as its job writes them: the report adds its panels
        baseline = root / "runs" / "years" / "baseline"
        baseline.mkdir(parents=True)
        trial = root / "runs" / "years" / "trials" / str(best["trial"])
        for split in ("valid", "test"):
            daily = pd.read_csv(trial / f"daily_ic_{split}.csv")
            daily.assign(ic=daily["ic"] / 2).to_csv(baseline / f"daily_ic_{split}.csv", index=False)
        _cli("report", path, "-o", root / "report.html")
        page = (root / "report.html").read_text()
    finally:
        os.chdir(cwd)
    return {"root": root, "best": best, "text": text, "page": page, "trial": trial}


@pytest.mark.slow
def test_best_json_has_ic_by_year_of_every_test_year(swept):
    best, trial = swept["best"], swept["trial"]
    test = pd.read_csv(trial / "daily_ic_test.csv")
    years = pd.to_datetime(test["date"]).dt.year
    assert sorted(set(years)) == [2011, 2012, 2013]
    assert list(best["ic_by_year"]["test"]) == ["2011", "2012", "2013"]
    for year in (2011, 2012, 2013):
        ic = test["ic"][years == year].dropna()
        assert best["ic_by_year"]["test"][str(year)] == pytest.approx(float(ic.sum() / len(ic)), rel=1e-12)
    assert list(best["ic_by_year"]["valid"]) == ["2011"]
    valid = pd.read_csv(trial / "daily_ic_valid.csv")
    assert best["ic_by_year"]["valid"]["2011"] == pytest.approx(float(valid["ic"].mean()), rel=1e-12)
    assert "test IC by year: 2011 " in swept["text"] and ", 2013 " in swept["text"]


@pytest.mark.slow
def test_best_json_has_the_group_neutral_ic(swept):
    best = swept["best"]
    assert best["group_col"] == "sector" and set(best["group_neutral"]) == {"valid", "test"}
    # recomputed here: the trial's predictions (sweeper predict) demeaned within sector per date by hand
    root = swept["root"]
    cwd = os.getcwd()
    os.chdir(root)
    try:
        _cli("predict", "study.yaml", "--split", "test", "-o", root / "pred_test.csv")
    finally:
        os.chdir(cwd)
    pred = pd.read_csv(root / "pred_test.csv").dropna(subset=["pred", "label"])  # the pairs IC scores
    sectors = {f"A{k:04d}": k % 3 for k in range(1, 25)}
    pred["sector"] = pred["asset"].map(sectors)
    ics = []
    for _, day in pred.groupby("date"):
        p = day["pred"] - day.groupby("sector")["pred"].transform("mean")
        y = day["label"] - day.groupby("sector")["label"].transform("mean")
        ics.append(np.corrcoef(p, y)[0, 1])
    neutral = best["group_neutral"]["test"]
    assert neutral["ic"] == pytest.approx(float(np.mean(ics)), abs=1e-6)
    assert neutral["n_dates"] == pred["date"].nunique()
    assert neutral["ic"] != pytest.approx(best["metrics"]["test_ic"], abs=1e-9)
    assert "group-neutral IC (demeaned within sector per date): valid ic " in swept["text"]


def _figures(page: str) -> dict[str, dict]:
    found = re.findall(r'<script type="application/json" id="fig-(\w+)" class="fig">(.*?)</script>', page, re.S)
    return {name: json.loads(payload) for name, payload in found}


@pytest.mark.slow
def test_the_report_has_the_year_month_heatmap_of_trial_and_baseline(swept):
    fig = _figures(swept["page"])["ic_time"]
    meta = fig["layout"]["meta"]
    assert set(meta["months"]) == {"best", "baseline"}
    assert list(meta["months"]["best"]["test"]) == ["2011", "2012", "2013"]
    test = pd.read_csv(swept["trial"] / "daily_ic_test.csv")
    days = pd.to_datetime(test["date"])
    june = test["ic"][(days.dt.year == 2012) & (days.dt.month == 6)].dropna()
    assert meta["months"]["best"]["test"]["2012"][5] == pytest.approx(float(june.sum() / len(june)), rel=1e-12)
    assert meta["months"]["baseline"]["test"]["2012"][5] == pytest.approx(float(june.sum() / len(june)) / 2,
                                                                           rel=1e-12)
    assert meta["months"]["best"]["test"]["2011"][:9] == [None] * 9  # the test split starts in October
    heatmaps = [t for t in fig["data"] if t["type"] == "heatmap"]
    assert len(heatmaps) == 4 and heatmaps[1]["y"] == ["2011", "2012", "2013"]
    assert meta["ic_by_year"] == swept["best"]["ic_by_year"]
    assert meta["group_neutral"]["test"]["ic"] == pytest.approx(swept["best"]["group_neutral"]["test"]["ic"])
    assert "group-neutral IC (demeaned within sector per date)" in swept["page"]
    assert not math.isnan(meta["group_neutral"]["valid"]["ic"])
