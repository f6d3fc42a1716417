"""Feature and label normalisation: exact values, mask handling, train-only fitting."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from sweeper.config import DataConfig
from sweeper.data import load_panel
from sweeper.data.normalize import normalize_features, normalize_label
from sweeper.quant.ranks import average_ranks

SQRT12 = math.sqrt(12.0)


def random_panel(T=8, N=7, F=2, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(T, N, F)).astype(np.float32)
    x[rng.random((T, N, F)) < 0.1] = np.nan
    mask = rng.random((T, N)) > 0.15
    x[~mask] = np.nan
    return torch.from_numpy(x), torch.from_numpy(mask)


def long_of(x: torch.Tensor, mask: torch.Tensor) -> pd.DataFrame:
    t, i = np.nonzero(mask.numpy())
    frame = pd.DataFrame(x.numpy()[t, i].astype(np.float64), columns=[f"f{k}" for k in range(x.shape[2])])
    return frame.assign(t=t, i=i)


def test_cs_zscore_matches_pandas_groupby():
    x, mask = random_panel()
    out = normalize_features(x, mask, "cs_zscore", (0, 8))
    frame = long_of(x, mask)
    for col in ("f0", "f1"):
        g = frame.groupby("t")[col]
        expected = ((frame[col] - g.transform("mean")) / g.transform("std")).fillna(0.0)  # ddof=1
        k = int(col[1])
        np.testing.assert_allclose(out.numpy()[frame.t, frame.i, k], expected, rtol=1e-5, atol=1e-6)
    assert (out[~mask] == 0).all()


def test_cs_rank_exact_values_with_ties():
    x = torch.tensor([[3.0, 1.0, 2.0, 2.0, float("nan"), 7.0]]).T[None]  # [1 date, 6 assets, 1]
    mask = torch.tensor([[True, True, True, True, True, False]])
    out = normalize_features(x, mask, "cs_rank", (0, 1))[0, :, 0]
    # valid ranks 0-based: 3 -> 3, 1 -> 0, 2,2 -> 1.5 each; n = 4 -> r/3 - 0.5
    expected = [0.5 * SQRT12, -0.5 * SQRT12, 0.0, 0.0, 0.0, 0.0]
    assert out.tolist() == pytest.approx(expected, abs=1e-6)


def test_cs_rank_matches_pandas_rank_average():
    x, mask = random_panel(T=6, N=9, seed=4)
    x = torch.round(x * 2) / 2  # plenty of ties
    out = normalize_features(x, mask, "cs_rank", (0, 6))
    frame = long_of(x, mask)
    for k, col in enumerate(("f0", "f1")):
        g = frame.groupby("t")[col]
        expected = ((g.rank(method="average") - 1) / (g.transform("count") - 1) - 0.5) * SQRT12
        np.testing.assert_allclose(out.numpy()[frame.t, frame.i, k], expected.fillna(0.0), rtol=1e-5, atol=1e-6)


def test_average_ranks_with_and_without_ties():
    v = np.array([[[1.0, 5.0, 5.0, 5.0, 0.0], [2.0, 9.0, 4.0, 3.0, 1.0]]], dtype=np.float32)
    assert average_ranks(v).tolist() == [[[1.0, 3.0, 3.0, 3.0, 0.0], [1.0, 4.0, 3.0, 2.0, 0.0]]]
    padded = np.array([[7.0, np.inf, 7.0, np.inf]], dtype=np.float32)  # ties of the padding only
    assert average_ranks(padded)[0, [0, 2]].tolist() == [0.5, 0.5]


def test_rows_outside_the_mask_do_not_enter_the_statistics():
    x, mask = random_panel()
    poisoned = x.clone()
    poisoned[~mask] = 1e6  # a finite value in an absent row
    for method in ("cs_zscore", "cs_rank", "robust_zscore", "none"):
        a = normalize_features(x, mask, method, (0, 5))
        b = normalize_features(poisoned, mask, method, (0, 5))
        assert torch.equal(a, b), method
        assert (b[~mask] == 0).all()


def test_none_passes_values_and_zero_fills():
    x, mask = random_panel()
    out = normalize_features(x, mask, "none", (0, 8))
    valid = mask[:, :, None] & torch.isfinite(x)
    assert torch.equal(out[valid], x[valid]) and (out[~valid] == 0).all()


def test_single_asset_date_gives_zero_features_and_nan_label():
    x = torch.tensor([[[1.0], [2.0]], [[5.0], [float("nan")]]])
    mask = torch.tensor([[True, True], [True, True]])
    out = normalize_features(x, mask, "cs_zscore", (0, 2))
    assert out[1].tolist() == [[0.0], [0.0]] and out[0, :, 0].tolist() == pytest.approx([-math.sqrt(0.5), math.sqrt(0.5)])
    y = normalize_label(x[:, :, 0], mask, "cs_zscore")
    assert math.isnan(y[1, 0]) and math.isnan(y[1, 1])


@pytest.mark.parametrize("method", ["cs_rank", "cs_zscore", "none"])
def test_label_normalisation(method):
    rng = np.random.default_rng(1)
    y = torch.from_numpy(rng.normal(size=(5, 6)).astype(np.float32))
    y[2, 3] = float("nan")
    mask = torch.ones(5, 6, dtype=torch.bool)
    mask[0, 0] = False
    out = normalize_label(y, mask, method)
    assert math.isnan(out[2, 3]) and math.isnan(out[0, 0])
    row = y[1].double()
    if method == "none":
        expected = row
    elif method == "cs_zscore":
        expected = (row - row.mean()) / row.std()
    else:
        expected = (torch.tensor(pd.Series(row.numpy()).rank().to_numpy()) - 1) / 5 - 0.5
        expected = expected * SQRT12
    assert out[1].double().tolist() == pytest.approx(expected.tolist(), abs=1e-5)


# ---------------------------------------------------------------- robust_zscore on real files


def panel_file(path, values: np.ndarray) -> None:
    T, N = values.shape
    dates = pd.bdate_range("2022-01-03", periods=T)
    frame = pd.DataFrame({
        "date": np.repeat(dates.to_numpy(), N), "asset": np.tile([f"A{k}" for k in range(N)], T),
        "f": values.reshape(-1), "label": np.tile(np.linspace(-1, 1, N), T),
    })
    frame.to_parquet(path, index=False)


def robust_cfg(path) -> DataConfig:
    return DataConfig(path=str(path), lookback=4, horizon=2, embargo=1, feature_norm="robust_zscore")


def test_robust_zscore_is_fitted_on_the_train_windows_only(tmp_path):
    rng = np.random.default_rng(7)
    values = rng.standard_t(3, size=(60, 5))
    panel_file(tmp_path / "a.parquet", values)
    panel = load_panel(robust_cfg(tmp_path / "a.parquet"))
    start, stop = panel.splits["train"]
    assert (start, stop) == (3, 34)  # 60 - 3 warm-up - 2*3 purged = 51 target dates -> 31 / 10 / 10

    fit = values[start - 3:stop].reshape(-1)  # the dates train windows can see
    median = np.median(fit)
    scale = (np.median(np.abs(fit - median)) + 1e-12) * 1.4826
    expected = np.clip((values - median) / scale, -3, 3)
    np.testing.assert_allclose(panel.X[:, :, 0].numpy(), expected, rtol=1e-5, atol=1e-5)
    assert (panel.X.abs() <= 3).all() and (panel.X.abs() == 3).any()

    wild = values.copy()
    wild[stop:] = wild[stop:] * 1000 + 50  # purge gap, valid and test go wild
    panel_file(tmp_path / "b.parquet", wild)
    changed = load_panel(robust_cfg(tmp_path / "b.parquet"))
    assert torch.equal(changed.X[:stop], panel.X[:stop])
    np.testing.assert_allclose(changed.X[:, :, 0].numpy(), np.clip((wild - median) / scale, -3, 3), rtol=1e-5, atol=1e-5)

    moved = values.copy()
    moved[stop - 1] += 5.0  # a train date: the statistics must move
    panel_file(tmp_path / "c.parquet", moved)
    assert not torch.equal(load_panel(robust_cfg(tmp_path / "c.parquet")).X[:start], panel.X[:start])


def test_robust_zscore_ignores_missing_rows_in_the_fit(tmp_path):
    values = np.arange(60 * 5, dtype=np.float64).reshape(60, 5) % 7
    values[0:34, 4] = np.nan  # asset A4 has no feature during train (dates 0..33)
    panel_file(tmp_path / "a.parquet", values)
    panel = load_panel(robust_cfg(tmp_path / "a.parquet"))
    fit = values[0:34, :4].reshape(-1)
    median = np.median(fit)
    scale = (np.median(np.abs(fit - median)) + 1e-12) * 1.4826
    assert panel.X[40, 1, 0].item() == pytest.approx(np.clip((values[40, 1] - median) / scale, -3, 3), rel=1e-6)
    assert (panel.X[0:34, 4] == 0).all()
