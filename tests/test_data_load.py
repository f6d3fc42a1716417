"""load_panel on real Parquet files: the contract, the dense layout and every DataError."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from conftest import real_env
from sweeper.config import DataConfig, SplitConfig, SyntheticConfig
from sweeper.data import load_panel, write_synthetic
from sweeper.data.scoring import scoring_panel
from sweeper.errors import DataError


def long_frame(n_dates: int = 40, n_assets: int = 5, seed: int = 0) -> pd.DataFrame:
    """A small complete panel: date, asset, f1, f2, sector (text), label."""
    rng = np.random.default_rng(seed)
    dates = pd.bdate_range("2021-01-04", periods=n_dates)
    frame = pd.DataFrame({
        "date": np.repeat(dates.to_numpy(), n_assets),
        "asset": np.tile([f"S{k}" for k in range(n_assets)], n_dates),
    })
    frame["f1"] = rng.normal(size=len(frame))
    frame["f2"] = rng.integers(0, 100, size=len(frame))
    frame["sector"] = "tech"
    frame["label"] = rng.normal(scale=0.02, size=len(frame))
    return frame


def write(frame: pd.DataFrame, path) -> str:
    frame.to_parquet(path, index=False)
    return str(path)


def cfg(path, **kw) -> DataConfig:
    kw.setdefault("lookback", 3)
    kw.setdefault("horizon", 1)
    return DataConfig(path=str(path), **kw)


def raises(config: DataConfig, *needles: str) -> str:
    with pytest.raises(DataError) as info:
        load_panel(config)
    msg = str(info.value)
    for needle in needles:
        assert needle in msg, msg
    return msg


# ------------------------------------------------------------ the contract


def test_features_none_takes_every_numeric_column_but_date_asset_label(tmp_path):
    panel = load_panel(cfg(write(long_frame(), tmp_path / "p.parquet")))
    assert panel.features == ["f1", "f2"]  # 'sector' is text: not a feature
    assert panel.X.shape == (40, 5, 2) and panel.X.dtype == torch.float32
    assert panel.dates.dtype == np.dtype("datetime64[ns]")
    assert list(panel.assets) == ["S0", "S1", "S2", "S3", "S4"]


def test_only_the_needed_columns_are_read(tmp_path, monkeypatch):
    path = write(long_frame(), tmp_path / "p.parquet")
    seen = []
    real = pq.read_table

    def spy(source, columns=None, **kw):
        seen.append(columns)
        return real(source, columns=columns, **kw)

    monkeypatch.setattr(pq, "read_table", spy)
    panel = load_panel(cfg(path, features=["f2"], cache=False))
    # the keys first, then the features in blocks of columns: never a column the panel does not use
    assert seen == [["date", "asset", "label"], ["f2"]]
    assert panel.features == ["f2"]


def test_dense_layout_scatters_rows_and_marks_absent_ones(tmp_path):
    frame = long_frame(n_dates=12, n_assets=3)
    frame.loc[(frame.asset == "S1") & (frame.date == frame.date.iloc[6]), "f1"] = np.nan
    frame = frame[~((frame.asset == "S2") & (frame.date >= frame.date.iloc[24]))]  # S2 delists
    frame = frame.sample(frac=1.0, random_state=0)  # row order must not matter
    panel = load_panel(cfg(write(frame, tmp_path / "p.parquet"), feature_norm="none", label_norm="none"))
    ordered = long_frame(n_dates=12, n_assets=3)
    for t, i in [(0, 0), (5, 1), (11, 0), (7, 2)]:
        row = ordered.iloc[t * 3 + i]
        assert panel.X[t, i, 0].item() == pytest.approx(row.f1, rel=1e-6)
        assert panel.X[t, i, 1].item() == row.f2
        assert panel.y_raw[t, i].item() == pytest.approx(row.label, rel=1e-6)
    assert panel.X[2, 1, 0].item() == 0.0  # NaN feature -> 0
    assert panel.mask[2, 1] and not panel.mask[8:, 2].any() and panel.mask[:8, 2].all()
    assert torch.isnan(panel.y_raw[8:, 2]).all() and (panel.X[8:, 2] == 0).all()


def test_date_and_asset_types(tmp_path):
    frame = long_frame(n_dates=30, n_assets=3)
    frame["asset"] = frame["asset"].str[1:].astype(int)  # integer ids become text
    text = frame.assign(date=frame.date.dt.strftime("%Y-%m-%d"))
    text.loc[0, "date"] = "2021-01-04 00:00:00"  # another spelling of the same day
    days = frame.assign(date=frame.date.dt.date)
    panels = [load_panel(cfg(write(f, tmp_path / f"{k}.parquet"))) for k, f in enumerate([frame, text, days])]
    for panel in panels:
        assert list(panel.assets) == ["0", "1", "2"]
        np.testing.assert_array_equal(panel.dates, panels[0].dates)
        assert torch.equal(panel.X, panels[0].X)


def test_renamed_columns(tmp_path):
    frame = long_frame().rename(columns={"date": "day", "asset": "ticker", "label": "ret2"})
    panel = load_panel(cfg(write(frame, tmp_path / "p.parquet"), date_col="day", asset_col="ticker", label="ret2"))
    assert panel.features == ["f1", "f2"] and panel.y_raw.shape == (40, 5)


def test_fingerprint_tracks_bytes_and_column_selection(tmp_path):
    a = write(long_frame(seed=0), tmp_path / "a.parquet")
    b = write(long_frame(seed=1), tmp_path / "b.parquet")
    fa = load_panel(cfg(a)).fingerprint
    assert fa == load_panel(cfg(a, lookback=4)).fingerprint
    assert fa != load_panel(cfg(b)).fingerprint
    assert fa != load_panel(cfg(a, features=["f1"])).fingerprint
    assert len(fa) == 64 and int(fa, 16) >= 0


def test_oracle_ic_read_from_metadata(tmp_path):
    plain = load_panel(cfg(write(long_frame(), tmp_path / "p.parquet")))
    assert plain.oracle_ic is None
    oracle = write_synthetic(tmp_path / "s.parquet", assets=20, dates=60, features=3, seed=1)
    panel = load_panel(DataConfig(path=str(tmp_path / "s.parquet")))
    assert panel.oracle_ic == pytest.approx(oracle, rel=1e-12)  # the default split: the stored figures
    assert panel.source == str(tmp_path / "s.parquet")


def test_oracle_of_a_file_follows_the_actual_split(tmp_path):
    write_synthetic(tmp_path / "s.parquet", assets=20, dates=80, features=3, seed=1)
    split = SplitConfig(train=0.5, valid=0.3, test=0.2)
    from_file = load_panel(DataConfig(path=str(tmp_path / "s.parquet"), lookback=7, horizon=3, split=split))
    in_memory = load_panel(DataConfig(synthetic=SyntheticConfig(assets=20, dates=80, features=3, seed=1),
                                      lookback=7, horizon=3, split=split))
    assert from_file.splits == in_memory.splits
    assert from_file.oracle_ic == pytest.approx(in_memory.oracle_ic, rel=1e-9)
    default = write_synthetic(tmp_path / "d.parquet", assets=20, dates=80, features=3, seed=1)
    assert from_file.oracle_ic["valid"] != pytest.approx(default["valid"], rel=1e-3)


def test_synthetic_source_needs_no_file():
    panel = load_panel(DataConfig(synthetic=SyntheticConfig(assets=12, dates=60, features=3, seed=2), lookback=5))
    assert panel.source == "synthetic(assets=12,dates=60,features=3,seed=2)"
    assert panel.X.shape == (60, 12, 3) and set(panel.oracle_ic) == {"train", "valid", "test"}


# ------------------------------------------------------------ every DataError


def test_missing_file(tmp_path):
    raises(cfg(tmp_path / "nope.parquet"), str(tmp_path / "nope.parquet"), "not found")


def test_not_a_parquet_file(tmp_path):
    path = tmp_path / "p.parquet"
    path.write_text("date,asset,label\n2020-01-01,A,0.1\n")
    raises(cfg(path), str(path), "not a Parquet file")


@pytest.mark.parametrize("key,value", [("label", "ret5"), ("date_col", "day"), ("asset_col", "ticker"),
                                       ("features", ["f1", "f9"])])
def test_missing_column(tmp_path, key, value):
    path = write(long_frame(), tmp_path / "p.parquet")
    missing = value[-1] if isinstance(value, list) else value
    raises(cfg(path, **{key: value}), path, f"column '{missing}'", f"data.{key}", "not found")


@pytest.mark.parametrize("key,column", [("data.label", "label"), ("data.asset_col", "asset")])
def test_a_key_column_named_as_a_feature_is_refused(tmp_path, key, column):
    """The label named in data.features was trained on (val IC 0.48) once the leak guard was raised."""
    frame = long_frame().assign(asset=lambda f: f.asset.str[1:].astype(int))  # a numeric asset id
    path = write(frame, tmp_path / "p.parquet")
    raises(cfg(path, features=["f1", column], max_feature_label_corr=1.0), path,
           f"column '{column}' ({key}) cannot be a feature (data.features)")


@pytest.mark.parametrize("column", ["f1", "label", "date"])
def test_a_column_name_given_twice_is_refused(tmp_path, column):
    """pyarrow writes a table with one name twice (after a join, say): a feature's twin was a KeyError
    traceback, the label's or the date's 'not found' in a list that showed it twice."""
    table = pa.Table.from_pandas(long_frame(), preserve_index=False)
    path = tmp_path / "p.parquet"
    pq.write_table(table.append_column(column, table.column("f1")), path)
    raises(cfg(path), f"{path}: column '{column}' appears 2 times; expected each column name once")


def test_no_numeric_feature_column(tmp_path):
    path = write(long_frame()[["date", "asset", "sector", "label"]], tmp_path / "p.parquet")
    raises(cfg(path), path, "no numeric feature columns", "data.features")


def test_non_numeric_feature(tmp_path):
    path = write(long_frame(), tmp_path / "p.parquet")
    raises(cfg(path, features=["f1", "sector"]), path, "feature column 'sector'", "numeric")


def test_non_numeric_label(tmp_path):
    path = write(long_frame().assign(label="up"), tmp_path / "p.parquet")
    raises(cfg(path), path, "label column 'label'", "numeric")


def test_duplicated_date_asset_rows(tmp_path):
    frame = long_frame()
    frame = pd.concat([frame, frame.iloc[[7, 12, 13]]], ignore_index=True)
    path = write(frame, tmp_path / "p.parquet")
    raises(cfg(path), path, "'date', 'asset'", "3 duplicated", "(2021-01-05, S2)")


def test_a_days_rows_stamped_at_two_times_are_refused_and_intraday_bars_are_not(tmp_path):
    """Two sources merged, half the assets at 15:00: each time became a date (the panel's dates
    doubled, its windows half empty, its purge half as many calendar days). Bars of a day, each asset
    at every time, are dates of their own."""
    frame = long_frame()
    frame.loc[frame.asset.isin(["S1", "S3"]), "date"] += pd.Timedelta(hours=15)
    path = write(frame, tmp_path / "p.parquet")
    said = (f"{path}: column 'date': a day's rows at several times (2021-01-04T00:00 and 2021-01-04T15:00), most "
            "assets' at one; expected one time a day (normalise the timestamps to the day)")
    assert raises(cfg(path), path) == said
    # one asset's row given by both sources turned the guard off for the whole file: the panel's dates doubled
    overlap = frame[frame.asset == "S1"].iloc[[0]].assign(date=lambda f: f.date - pd.Timedelta(hours=15))
    write(pd.concat([frame, overlap], ignore_index=True), path)
    assert raises(cfg(path), path) == said
    bars = pd.concat([long_frame(n_dates=20), long_frame(n_dates=20, seed=1).assign(
        date=lambda f: f.date + pd.Timedelta(hours=15))], ignore_index=True)
    assert len(load_panel(cfg(write(bars, tmp_path / "bars.parquet"))).dates) == 40
    # bars where 3 of 5 assets trade once a day (at the first bar): 4 of a day's 7 rows share an asset's day
    thin = pd.concat([long_frame(n_dates=20), long_frame(n_dates=20, seed=1).query("asset in ['S1', 'S3']").assign(
        date=lambda f: f.date + pd.Timedelta(hours=15))], ignore_index=True)
    assert len(load_panel(cfg(write(thin, tmp_path / "thin.parquet"))).dates) == 40


def test_unparseable_dates(tmp_path):
    frame = long_frame().assign(date=lambda f: f.date.dt.strftime("%Y-%m-%d"))
    frame.loc[11, "date"] = "2021-13-45"
    path = write(frame, tmp_path / "p.parquet")
    raises(cfg(path), path, "column 'date'", "'2021-13-45'", "cannot parse")


def test_text_dates_are_read_in_one_format(tmp_path):
    """Day-first text was guessed value by value: 04/01/2021 read as 1 April, 13/01/2021 as 13 January, and
    the panel's order scrambled without a word. Now one format reads them all, or the file is refused."""
    frame = long_frame()
    day_first = frame.assign(date=frame.date.dt.strftime("%d/%m/%Y"))  # the first date, 04/01/2021: ambiguous
    path = write(day_first, tmp_path / "d.parquet")
    raises(cfg(path), path, "column 'date'", "cannot parse", "'13/01/2021'", "in one format")
    ref = load_panel(cfg(write(frame, tmp_path / "ref.parquet")))
    us = load_panel(cfg(write(frame.assign(date=frame.date.dt.strftime("%m/%d/%Y")), tmp_path / "us.parquet")))
    np.testing.assert_array_equal(us.dates, ref.dates)
    late = day_first.iloc[np.argsort(-frame.date.dt.day.to_numpy() // 13, kind="stable")]  # 13/01/2021 first
    np.testing.assert_array_equal(load_panel(cfg(write(late, tmp_path / "late.parquet"))).dates, ref.dates)


def test_time_zone_aware_dates_keep_their_wall_time(tmp_path):
    """An A-share panel stamped at Asia/Shanghai midnight was moved to the previous day's 16:00 (UTC): every
    split one day early and its predictions matching none of its rows. A zone west of UTC kept its days."""
    frame = long_frame()
    ref = load_panel(cfg(write(frame, tmp_path / "ref.parquet")))
    for zone in ("Asia/Shanghai", "America/New_York"):
        aware = frame.assign(date=frame.date.dt.tz_localize(zone))
        np.testing.assert_array_equal(load_panel(cfg(write(aware, tmp_path / f"{zone[:4]}.parquet"))).dates,
                                      ref.dates)


def test_missing_dates(tmp_path):
    frame = long_frame()
    frame.loc[3, "date"] = pd.NaT
    path = write(frame, tmp_path / "p.parquet")
    raises(cfg(path), path, "column 'date'", "1 rows have no date", "row 3")


def test_yyyymmdd_integers_and_strings_are_dates(tmp_path):
    frame = long_frame(n_dates=30, n_assets=3)
    as_int = frame.assign(date=frame.date.dt.strftime("%Y%m%d").astype(np.int64))
    as_int32 = frame.assign(date=frame.date.dt.strftime("%Y%m%d").astype(np.int32))
    as_text = frame.assign(date=frame.date.dt.strftime("%Y%m%d"))
    ref = load_panel(cfg(write(frame, tmp_path / "ref.parquet")))
    for k, f in enumerate([as_int, as_int32, as_text]):
        panel = load_panel(cfg(write(f, tmp_path / f"{k}.parquet")))
        np.testing.assert_array_equal(panel.dates, ref.dates)
        assert torch.equal(panel.X, ref.X) and panel.splits == ref.splits


def test_other_numeric_dates_are_refused(tmp_path):
    # epoch seconds are not read as dates (nor as nanoseconds since 1970)
    seconds = lambda f: [int(d.timestamp()) for d in f.date]  # noqa: E731
    path = write(long_frame().assign(date=seconds), tmp_path / "p.parquet")
    raises(cfg(path), path, "column 'date'", "cannot parse", "1609718400", "YYYYMMDD integers")
    floats = write(long_frame().assign(date=1.5), tmp_path / "f.parquet")
    raises(cfg(floats), floats, "date column 'date'", "double")


def test_feature_patterns_and_exclusions(tmp_path):
    frame = long_frame().assign(mom_5=1.0, mom_20=2.0, vol_5=3.0, fwd_ret=4.0)
    path = write(frame, tmp_path / "p.parquet")
    assert load_panel(cfg(path, features=["mom_*", "f1"])).features == ["mom_5", "mom_20", "f1"]
    assert load_panel(cfg(path, features=["*_5", "mom_5"])).features == ["mom_5", "vol_5"]  # once each
    assert load_panel(cfg(path, exclude=["fwd_*", "f?"])).features == ["mom_5", "mom_20", "vol_5"]
    assert load_panel(cfg(path, features=["[mv]*"], exclude=["*_20"])).features == ["mom_5", "vol_5"]
    raises(cfg(path, features=["beta_*"]), path, "pattern 'beta_*'", "data.features", "matches no numeric column")
    raises(cfg(path, exclude=["*"]), path, "no feature column selected", "exclude ['*']")
    raises(cfg(path, features=[]), path, "no feature column selected (data.features [], exclude [])")
    # a typo in exclude kept the column it was meant to drop (a leak), without a word
    raises(cfg(path, exclude=["fwd_*", "vol5"]), path, "data.exclude ['vol5'] matches no column; the file has: ")


def test_a_column_named_like_a_pattern_is_taken_by_its_name(tmp_path):
    """``ret[5]`` was read as a pattern (r, e, t, then the character 5) and matched nothing."""
    path = write(long_frame().assign(**{"ret[5]": 1.0, "ret5": 2.0}), tmp_path / "p.parquet")
    assert load_panel(cfg(path, features=["ret[5]", "f1"])).features == ["ret[5]", "f1"]
    assert load_panel(cfg(path, features=["ret[0-9]"])).features == ["ret5"]  # a pattern that names no column


def test_decimal_columns_are_numbers(tmp_path):
    """A SQL NUMERIC export (decimal128) was skipped as a feature without a word, and refused as the label."""
    frame = long_frame().round({"f1": 6, "f2": 6, "label": 6})
    ref = load_panel(cfg(write(frame, tmp_path / "ref.parquet")))
    as_decimal = pa.Table.from_pandas(frame, preserve_index=False)
    for name in ("f1", "label"):
        at = as_decimal.schema.get_field_index(name)
        as_decimal = as_decimal.set_column(at, name, as_decimal.column(name).cast(pa.decimal128(18, 6)))
    pq.write_table(as_decimal, tmp_path / "d.parquet")
    panel = load_panel(cfg(tmp_path / "d.parquet"))
    assert panel.features == ref.features == ["f1", "f2"] and panel.splits == ref.splits
    # a decimal is cast to float32 at once, the float64 through its rounding: within a float32 step
    torch.testing.assert_close(panel.X, ref.X, rtol=1e-5, atol=1e-6, equal_nan=True)
    torch.testing.assert_close(panel.y_raw, ref.y_raw, rtol=1e-6, atol=1e-7, equal_nan=True)


def test_a_boolean_column_is_a_0_1_feature(tmp_path):
    """A flag column (halted, is_st) was skipped by ``features: null`` without a word, and refused by name."""
    flag = np.random.default_rng(1).random(len(long_frame())) < 0.3
    as_bool = load_panel(cfg(write(long_frame().assign(halted=flag), tmp_path / "b.parquet")))
    as_float = load_panel(cfg(write(long_frame().assign(halted=flag.astype(float)), tmp_path / "f.parquet")))
    assert as_bool.features == as_float.features == ["f1", "f2", "halted"]
    torch.testing.assert_close(as_bool.X, as_float.X, rtol=0, atol=0, equal_nan=True)
    assert load_panel(cfg(tmp_path / "b.parquet", features=["halted"])).features == ["halted"]


def test_a_feature_without_any_value_is_refused(tmp_path):
    """A feature all null (or all inf) in an export or a live feed was trained on as zeros, and
    ``predict --data`` scored a model with it as zeros, without a word."""
    frame = long_frame()
    for name, value in (("nan", np.nan), ("inf", np.inf)):
        path = write(frame.assign(f2=value), tmp_path / f"{name}.parquet")
        raises(cfg(path), path, "feature column 'f2' has no finite value", "data.exclude")
    trained = cfg(write(frame, tmp_path / "p.parquet"))
    panel = load_panel(trained)
    live = write(frame.assign(f1=np.nan, label=np.nan), tmp_path / "live.parquet")
    with pytest.raises(DataError, match=f"^{live}: feature column 'f1' has no finite value; mend the file"):
        scoring_panel(trained, live, panel.features, panel.norm_stats)
    some = write(frame.assign(f1=frame.f1.where(frame.asset == "S0"), label=np.nan), tmp_path / "s.parquet")
    assert scoring_panel(trained, some, panel.features, panel.norm_stats).X.shape == panel.X.shape


def test_no_rows(tmp_path):
    path = write(long_frame().iloc[:0], tmp_path / "p.parquet")
    raises(cfg(path), path, "no usable rows")


def test_no_finite_label(tmp_path):
    path = write(long_frame().assign(label=np.nan), tmp_path / "p.parquet")
    raises(cfg(path), path, "column 'label'", "no usable rows")


def test_split_without_usable_rows(tmp_path):
    frame = long_frame()
    frame.loc[frame.date >= frame.date.iloc[-5 * 5], "label"] = np.nan  # the last 5 dates have no label
    path = write(frame, tmp_path / "p.parquet")
    raises(cfg(path, split=SplitConfig(train=0.7, valid=0.18, test=0.12)), path, "column 'label'",
           "no usable rows in the test split")


def test_too_few_dates_says_how_many_are_needed(tmp_path):
    # lookback 5 -> 4 warm-up dates, horizon 1 -> 2 purged dates, 0.6/0.2/0.2 needs 4 target dates
    path = write(long_frame(n_dates=9), tmp_path / "p.parquet")
    raises(cfg(path, lookback=5), path, "column 'date'", "9 dates are too few", "need at least 10 dates")
    panel = load_panel(cfg(write(long_frame(n_dates=10), tmp_path / "q.parquet"), lookback=5))
    assert panel.splits == {"train": (4, 6), "valid": (7, 8), "test": (9, 10)}


def test_date_range_selecting_no_dates(tmp_path):
    path = write(long_frame(), tmp_path / "p.parquet")
    split = SplitConfig(train=("2021-01-01", "2021-01-31"), valid=("2021-02-06", "2021-02-07"),
                        test=("2021-02-08", "2021-03-31"))  # 6-7 Feb 2021 is a weekend
    raises(cfg(path, split=split), path, "column 'date'", "data.split.valid", "selects no dates")


def test_nan_label_rows_are_not_samples(tmp_path):
    frame = long_frame()
    frame.loc[[20, 21], "label"] = np.nan  # date 4, assets 0 and 1
    panel = load_panel(cfg(write(frame, tmp_path / "p.parquet")))
    pairs = {tuple(p) for p in panel.sample_index("train").tolist()}
    assert (4, 0) not in pairs and (4, 1) not in pairs and (4, 2) in pairs
    assert math.isnan(panel.y[4, 0]) and math.isnan(panel.y_raw[4, 1])


def test_arrow_table_with_nulls_and_int_features(tmp_path):
    dates = pa.array(np.repeat(pd.bdate_range("2021-01-04", periods=30).to_numpy(), 2))
    table = pa.table({
        "date": dates, "asset": pa.array(["X", "Y"] * 30).dictionary_encode(),
        "g": pa.array([1, None] * 30, pa.int32()), "label": pa.array([0.5, 0.25] * 30, pa.float64()),
    })
    path = tmp_path / "p.parquet"
    pq.write_table(table, path)
    panel = load_panel(cfg(path, feature_norm="none", label_norm="none"))
    assert panel.X[:, 0, 0].tolist() == [1.0] * 30 and panel.X[:, 1, 0].tolist() == [0.0] * 30
    assert list(panel.assets) == ["X", "Y"]


@pytest.mark.slow
def test_validate_accepts_yyyymmdd_integer_dates(tmp_path):
    import subprocess
    import sys

    import yaml

    from sweeper.data import synthetic_frame

    frame, _ = synthetic_frame(assets=12, dates=80, features=3, seed=0)
    frame["date"] = frame["date"].dt.strftime("%Y%m%d").astype(np.int64)  # 20100104, ...
    frame.to_parquet(tmp_path / "ashare.parquet", index=False)
    study = {"study": {"name": "ints"}, "data": {"path": "ashare.parquet", "lookback": 5},
             "model": {"name": "mlp", "hidden_size": 8}, "devices": {"gpus": "none", "cpu_workers": 1}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(study))
    env = real_env()
    out = subprocess.run([sys.executable, "-m", "sweeper.cli", "validate", "s.yaml"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "s.yaml: ok" in out.stdout and f"data: {tmp_path / 'ashare.parquet'} (" in out.stdout  # as stored
