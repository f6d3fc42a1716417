"""The synthetic panel: determinism, shape of the data, the oracle IC, atomic writes."""
from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from sweeper.config import DataConfig, SplitConfig, SyntheticConfig
from sweeper.data import load_panel, synth, synthetic_frame, write_synthetic
from sweeper.errors import DataError


@pytest.fixture(scope="module")
def default_frame():
    """The default study size (SyntheticConfig defaults), generated once and timed."""
    start = time.perf_counter()
    frame, oracle = synthetic_frame(300, 1000, 16, 0)
    return frame, oracle, time.perf_counter() - start


def test_deterministic_for_a_seed():
    a, oa = synthetic_frame(30, 80, 4, seed=11)
    b, ob = synthetic_frame(30, 80, 4, seed=11)
    c, _ = synthetic_frame(30, 80, 4, seed=12)
    pd.testing.assert_frame_equal(a, b)
    assert oa == ob
    assert not a[["f00", "label"]].equals(c[["f00", "label"]])


def test_layout_names_and_missing_rows(default_frame):
    frame, _, _ = default_frame
    assert list(frame.columns) == ["date", "asset"] + [f"f{k:02d}" for k in range(16)] + ["label"]
    dates = frame["date"].drop_duplicates()
    assert dates.iloc[0] == pd.Timestamp("2010-01-04") and len(dates) == 1000
    assert (dates.dt.day_of_week < 5).all()
    assert sorted(frame["asset"].unique())[:2] == ["A0001", "A0002"] and frame["asset"].nunique() == 300
    missing = 1 - len(frame) / (300 * 1000)
    assert 0.02 < missing < 0.08  # listings, delistings and gaps: a few percent
    nan_share = frame["f00"].isna().mean()
    assert 0.002 < nan_share < 0.01
    last_two = frame["date"] >= dates.iloc[-2]
    assert frame.loc[last_two, "label"].isna().all()  # forward return not known yet
    assert frame.loc[~last_two, "label"].notna().all()


def test_features_are_persistent_and_heavy_tailed(default_frame):
    frame, _, _ = default_frame
    one = frame[frame["asset"] == "A0007"].set_index("date")["f03"].dropna()
    assert one.autocorr(1) > 0.8
    values = frame["f03"].dropna().to_numpy()
    kurtosis = ((values - values.mean()) ** 4).mean() / values.var() ** 2
    assert kurtosis > 3.2  # fatter than a normal's 3


def test_oracle_ic_about_ten_percent_and_fast(default_frame):
    _, oracle, seconds = default_frame
    assert set(oracle) == {"train", "valid", "test"}
    for value in oracle.values():
        assert 0.08 <= value <= 0.12
    assert seconds < 3.0  # about 0.5 s measured; slack for a loaded CI box


def test_oracle_ic_equals_a_pandas_recomputation():
    frame = synth.generate(40, 120, 3, seed=2)
    oracle = synth.default_oracle(frame, "x")
    dates = np.sort(frame["date"].unique())
    # default split on 120 dates: 120 - 19 - 4 = 97 target dates -> 58 / 20 / 19
    train = frame[(frame["date"] >= dates[19]) & (frame["date"] < dates[77])]
    daily = train.dropna(subset=["label"]).groupby("date").apply(lambda g: g["_signal"].corr(g["label"]))
    assert oracle["train"] == pytest.approx(daily.mean(), abs=1e-9)


def test_signal_uses_no_future_features():
    rng = np.random.default_rng(0)
    B = synth.BURN_IN
    x = synth.simulate_features(rng, 50, 6, 3)
    term1, term2 = synth.signal_terms(x)
    # exact values at date 20 from the definition
    mean10 = x[B + 11:B + 21, :, 0].mean(0)
    assert term1[20] == pytest.approx(np.tanh(mean10) * np.sign(x[B + 20, :, 1]), rel=1e-12)
    assert term2[20] == pytest.approx(x[B + 20, :, 2] - x[B + 15, :, 2], rel=1e-12)
    future = x.copy()
    future[B + 30:] += 1.0  # change every feature from date 30 on
    f1, f2 = synth.signal_terms(future)
    assert np.array_equal(f1[:30], term1[:30]) and np.array_equal(f2[:30], term2[:30])
    assert not np.array_equal(f2[30:], term2[30:])
    signal = synth.planted_signal(x)
    assert signal == pytest.approx(term1 / term1.std() + term2 / term2.std())


def test_write_synthetic_stores_the_oracle_and_loads_back(tmp_path):
    path = tmp_path / "s.parquet"
    oracle = write_synthetic(path, assets=25, dates=70, features=4, seed=3)
    meta = pq.read_schema(path).metadata
    assert json.loads(meta[b"sweeper.oracle_ic"]) == oracle
    assert json.loads(meta[b"sweeper.synthetic"])["seed"] == 3
    frame, same = synthetic_frame(25, 70, 4, 3)
    assert same == oracle
    pd.testing.assert_frame_equal(pd.read_parquet(path), frame, check_dtype=False)
    assert [p.name for p in tmp_path.iterdir()] == ["s.parquet"]  # no temp file left


def test_load_panel_synthetic_oracle_uses_the_actual_split():
    params = SyntheticConfig(assets=40, dates=150, features=3, seed=4)
    _, default = synthetic_frame(40, 150, 3, 4)
    same = load_panel(DataConfig(synthetic=params))
    assert same.oracle_ic == pytest.approx(default, abs=1e-12)
    other = load_panel(DataConfig(synthetic=params, lookback=5, split=SplitConfig(train=0.5, valid=0.3, test=0.2)))
    assert other.oracle_ic["train"] != pytest.approx(default["train"], abs=1e-6)
    assert other.fingerprint == same.fingerprint  # same data, other split
    assert load_panel(DataConfig(synthetic=params.model_copy(update={"seed": 5}))).fingerprint != same.fingerprint


def test_load_panel_synthetic_feature_selection():
    params = SyntheticConfig(assets=10, dates=60, features=3, seed=1)
    panel = load_panel(DataConfig(synthetic=params, lookback=5, features=["f02", "f00"]))
    assert panel.features == ["f02", "f00"] and panel.X.shape[2] == 2
    with pytest.raises(DataError, match=r"synthetic\(assets=10,dates=60,features=3,seed=1\): column 'f7' \(data\.features\)"):
        load_panel(DataConfig(synthetic=params, features=["f7"]))


def test_write_into_a_missing_folder_leaves_nothing(tmp_path):
    path = tmp_path / "nope" / "s.parquet"
    with pytest.raises(DataError, match="nope"):
        write_synthetic(path, assets=5, dates=40, features=2, seed=0)
    assert list(tmp_path.iterdir()) == []


def test_failed_write_leaves_no_partial_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    path = tmp_path / "s.parquet"
    path.write_bytes(b"PAR1 old")  # a panel: the only file a synth replaces

    def half_then_fail(table, where, **kw):
        with open(where, "wb") as fh:
            fh.write(b"PAR1 partial")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", half_then_fail)
    with pytest.raises(DataError, match=r"s\.parquet: cannot write the Parquet file \(disk full\)"):
        write_synthetic(path, assets=5, dates=40, features=2, seed=0)
    assert [p.name for p in tmp_path.iterdir()] == ["s.parquet"] and path.read_bytes() == b"PAR1 old"


@pytest.mark.parametrize("kw,needle", [({"assets": 1}, "assets must be >= 2"), ({"dates": 5}, "dates must be >= 10"),
                                       ({"features": 1}, "features must be >= 2")])
def test_bad_parameters(tmp_path, kw, needle):
    args = {"assets": 5, "dates": 40, "features": 2, "seed": 0, **kw}
    with pytest.raises(DataError, match=needle) as info:
        write_synthetic(tmp_path / "s.parquet", **args)
    assert str(tmp_path / "s.parquet") in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_too_few_dates_for_the_default_oracle_split(tmp_path):
    with pytest.raises(DataError, match="26 dates are too few.*need at least 27 dates"):
        write_synthetic(tmp_path / "s.parquet", assets=5, dates=26, features=2, seed=0)
    assert list(tmp_path.iterdir()) == []
