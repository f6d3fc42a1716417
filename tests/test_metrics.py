from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sweeper.errors import DataError
from sweeper.quant.ic import (
    daily_ic,
    daily_ic_torch,
    ic_loss,
    ic_report,
    ic_report_torch,
    summarize,
)

# ------------------------------------------------------------ reference


def _constant_pred(g: pd.DataFrame) -> bool:
    """>= 2 complete pairs, the prediction exactly constant, the label not."""
    pairs = g[np.isfinite(g["pred"]) & np.isfinite(g["label"])]
    return len(pairs) >= 2 and pairs["pred"].nunique() == 1 and pairs["label"].nunique() > 1


def reference_daily(df: pd.DataFrame) -> pd.DataFrame:
    """Qlib's calc_ic (groupby date, Series.corr, pearson and spearman; NaN dates dropped),
    except that a date with a constant prediction scores 0 (sweeper's rule)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns on constant input
        grouped = df.groupby("date")
        constant = grouped.apply(_constant_pred)
        ic = grouped.apply(lambda g: g["pred"].corr(g["label"])).where(~constant, 0.0)
        rank_ic = grouped.apply(lambda g: g["pred"].corr(g["label"], method="spearman")).where(~constant, 0.0)
    out = pd.DataFrame({"ic": ic, "rank_ic": rank_ic, "constant": constant})
    return out[out["ic"].notna()]


def reference_report(df: pd.DataFrame) -> dict:
    daily = reference_daily(df)
    ic, rank_ic = daily["ic"], daily["rank_ic"]
    with np.errstate(divide="ignore", invalid="ignore"):
        return {
            "ic": ic.mean(),
            "rank_ic": rank_ic.mean(),
            "icir": _ir(ic),
            "rank_icir": _ir(rank_ic),
            "n_dates": len(ic),
            "n_constant_dates": int(daily["constant"].sum()),
        }


def _ir(daily: pd.Series) -> float:
    """mean / std (ddof=1); undefined (NaN) when the daily ICs have no spread beyond round-off:
    their std at most 1e-12 (ICs that are all zero up to ~1e-17 would give round-off / round-off)."""
    std = daily.std(ddof=1)
    return daily.mean() / std if std > 1e-12 else math.nan


def panel(seed: int, T: int, N: int, nan_frac: float, levels: int | None) -> tuple[np.ndarray, np.ndarray]:
    """A [T, N] pred/label pair; ``levels`` small integer values force many ties (and exact constants)."""
    rng = np.random.default_rng(seed)
    if levels:
        pred = rng.integers(0, levels, (T, N)).astype(np.float64)
        label = rng.integers(0, levels + 1, (T, N)).astype(np.float64) / 4
    else:
        pred = rng.normal(size=(T, N))
        label = 0.3 * pred + rng.normal(size=(T, N))
    pred[rng.random((T, N)) < nan_frac] = np.nan
    label[rng.random((T, N)) < nan_frac] = np.nan
    return pred, label


def to_frame(pred: np.ndarray, label: np.ndarray) -> pd.DataFrame:
    T, N = pred.shape
    dates = pd.date_range("2020-01-01", periods=T, freq="D")
    return pd.DataFrame({"date": np.repeat(dates, N), "pred": pred.ravel(), "label": label.ravel()})


def assert_reports_equal(got: dict, want: dict) -> None:
    assert got["n_dates"] == want["n_dates"]
    assert got["n_constant_dates"] == want["n_constant_dates"]
    for key in ("ic", "rank_ic", "icir", "rank_icir"):
        if not math.isfinite(want[key]) or abs(want[key]) > 1e9:
            # no spread across days (or spread at rounding level): ICIR is undefined
            assert math.isnan(got[key]), key
        else:
            assert got[key] == pytest.approx(want[key], abs=1e-6), key


def check_against_reference(pred: np.ndarray, label: np.ndarray) -> None:
    df = to_frame(pred, label)
    ref = reference_daily(df)
    got = daily_ic(df, flag_constant=True)
    assert list(got["date"]) == list(ref.index)
    np.testing.assert_allclose(got["ic"], ref["ic"], atol=1e-6)
    np.testing.assert_allclose(got["rank_ic"], ref["rank_ic"], atol=1e-6)
    assert got["constant_pred"].tolist() == ref["constant"].astype(int).tolist()

    pearson, spearman = daily_ic_torch(torch.tensor(pred), torch.tensor(label))
    ref_full = ref.reindex(pd.date_range("2020-01-01", periods=len(pred), freq="D"))
    np.testing.assert_allclose(pearson.numpy(), ref_full["ic"].to_numpy(), atol=1e-6, equal_nan=True)
    np.testing.assert_allclose(spearman.numpy(), ref_full["rank_ic"].to_numpy(), atol=1e-6, equal_nan=True)

    want = reference_report(df)
    assert_reports_equal(ic_report(df), want)
    assert_reports_equal(ic_report_torch(torch.tensor(pred), torch.tensor(label)), want)


# ------------------------------------------------------------ exact values


def hand_frame() -> pd.DataFrame:
    rows = [
        # d1: pearson = spearman = 0.5
        ("d1", 1, 1), ("d1", 2, 3), ("d1", 3, 2),
        # d2: pred tie -> ranks 1, 2.5, 2.5, 4
        ("d2", 1, 4), ("d2", 2, 3), ("d2", 2, 2), ("d2", 4, 1),
        # d3: one valid pair only -> skipped
        ("d3", 1, 1), ("d3", np.nan, 2), ("d3", 3, np.nan),
        # d4: constant prediction -> scored 0 (a collapsed model has no skill that day)
        ("d4", 5, 1), ("d4", 5, 2), ("d4", 5, 3),
        # d5: constant label -> skipped (there is nothing to rank)
        ("d5", 1, 2), ("d5", 2, 2), ("d5", 3, 2),
    ]
    return pd.DataFrame(rows, columns=["day", "score", "ret"])


def test_hand_computed_example() -> None:
    df = hand_frame()
    assert list(daily_ic(df, pred="score", label="ret", date="day").columns) == ["date", "ic", "rank_ic"]
    daily = daily_ic(df, pred="score", label="ret", date="day", flag_constant=True)
    assert list(daily["date"]) == ["d1", "d2", "d4"]
    assert daily["constant_pred"].tolist() == [0, 0, 1]
    d2_pearson = -4.5 / math.sqrt(4.75 * 5)
    d2_spearman = -3 / math.sqrt(10)
    np.testing.assert_allclose(daily["ic"], [0.5, d2_pearson, 0.0], rtol=1e-12)
    np.testing.assert_allclose(daily["rank_ic"], [0.5, d2_spearman, 0.0], rtol=1e-12)

    report = ic_report(df, pred="score", label="ret", date="day")
    assert report["n_dates"] == 3 and report["n_constant_dates"] == 1
    ics, ranks = np.array([0.5, d2_pearson, 0.0]), np.array([0.5, d2_spearman, 0.0])
    assert report["ic"] == pytest.approx(ics.mean(), rel=1e-12)
    assert report["icir"] == pytest.approx(ics.mean() / ics.std(ddof=1), rel=1e-12)
    assert report["rank_icir"] == pytest.approx(ranks.mean() / ranks.std(ddof=1), rel=1e-12)



def test_hand_example_in_torch() -> None:
    nan = math.nan
    pred = torch.tensor([[1, 2, 3, nan], [1, 2, 2, 4], [1, nan, 3, nan], [5, 5, 5, nan]], dtype=torch.float32)
    label = torch.tensor([[1, 3, 2, 7], [4, 3, 2, 1], [1, 2, nan, nan], [1, 2, 3, nan]], dtype=torch.float32)
    pearson, spearman = daily_ic_torch(pred, label)
    assert pearson.dtype == torch.float64
    np.testing.assert_allclose(pearson.numpy(), [0.5, -4.5 / math.sqrt(23.75), nan, 0.0], rtol=1e-12)
    np.testing.assert_allclose(spearman.numpy(), [0.5, -3 / math.sqrt(10), nan, 0.0], rtol=1e-12)
    report = ic_report_torch(pred, label)
    assert report["n_dates"] == 3 and report["n_constant_dates"] == 1
    # a constant label is still no correlation
    assert math.isnan(daily_ic_torch(torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 3.0]]))[0].item())


def test_single_date_has_no_icir_and_empty_frame_gives_nan() -> None:
    one = pd.DataFrame({"date": [1, 1, 1], "pred": [1.0, 2.0, 3.0], "label": [1.0, 2.0, 4.0]})
    report = ic_report(one)
    assert report["n_dates"] == 1 and math.isnan(report["icir"]) and report["rank_ic"] == pytest.approx(1.0)
    empty = ic_report(one.iloc[:0])
    assert empty["n_dates"] == 0 and math.isnan(empty["ic"])


def test_identical_daily_ics_give_nan_icir() -> None:
    df = pd.DataFrame({"date": [1, 1, 2, 2], "pred": [1.0, 2.0, 1.0, 2.0], "label": [1.0, 2.0, 3.0, 5.0]})
    report = ic_report(df)
    assert report["ic"] == 1.0 and math.isnan(report["icir"])
    # rounding-level spread is no spread either (pandas would give ~1e16 here)
    assert math.isnan(summarize(torch.tensor([0.3, 0.3 + 1e-16, 0.3 - 1e-16]))[1])


def test_rows_without_a_date_are_ignored() -> None:
    df = pd.DataFrame({"date": [pd.NaT] + [pd.Timestamp("2024-01-02")] * 3, "pred": [9.0, 1.0, 2.0, 3.0],
                       "label": [-9.0, 1.0, 3.0, 2.0]})
    assert daily_ic(df)["ic"].tolist() == [pytest.approx(0.5)]


def test_inf_counts_as_missing() -> None:
    df = pd.DataFrame({"date": [1] * 4, "pred": [1.0, 2.0, 3.0, math.inf], "label": [1.0, 3.0, 2.0, 0.0]})
    assert daily_ic(df)["ic"].tolist() == [pytest.approx(0.5)]


def test_missing_column_is_a_data_error() -> None:
    with pytest.raises(DataError, match="'score'.*the frame has 'date', 'pred', 'label'"):
        ic_report(pd.DataFrame({"date": [1], "pred": [1.0], "label": [1.0]}), pred="score")


def test_summarize_ignores_nan_days() -> None:
    mean, icir = summarize(torch.tensor([0.1, math.nan, 0.3]))
    assert mean == pytest.approx(0.2) and icir == pytest.approx(0.2 / math.sqrt(0.02))


# ------------------------------------------------------------ against pandas


@pytest.mark.parametrize(
    "seed,T,N,nan_frac,levels",
    [(0, 40, 30, 0.0, None), (1, 60, 25, 0.3, None), (2, 50, 12, 0.2, 3), (3, 30, 6, 0.5, 2), (4, 20, 200, 0.1, 7)],
)
def test_matches_pandas_on_fixed_panels(seed: int, T: int, N: int, nan_frac: float, levels: int | None) -> None:
    check_against_reference(*panel(seed, T, N, nan_frac, levels))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    T=st.integers(1, 12),
    N=st.integers(1, 15),
    nan_frac=st.sampled_from([0.0, 0.2, 0.6]),
    levels=st.sampled_from([None, 2, 4]),
)
def test_matches_pandas_on_random_panels(seed: int, T: int, N: int, nan_frac: float, levels: int | None) -> None:
    check_against_reference(*panel(seed, T, N, nan_frac, levels))


def test_float32_input_matches_float64_reference() -> None:
    pred, label = panel(7, 30, 500, 0.1, None)
    want = reference_report(to_frame(pred.astype(np.float32).astype(np.float64), label.astype(np.float32).astype(np.float64)))
    got = ic_report_torch(torch.tensor(pred, dtype=torch.float32), torch.tensor(label, dtype=torch.float32))
    assert_reports_equal(got, want)


def test_torch_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match=r"\[T, N\]"):
        daily_ic_torch(torch.zeros(3, 4), torch.zeros(3, 5))


# ------------------------------------------------------------ ic_loss


def reference_loss(pred: np.ndarray, label: np.ndarray, group: np.ndarray) -> float:
    df = pd.DataFrame({"date": group, "pred": pred, "label": label})
    return -reference_daily(df)["ic"].mean()


def test_ic_loss_value_matches_pandas() -> None:
    rng = np.random.default_rng(11)
    group = rng.integers(0, 9, 300)
    label = rng.normal(size=300)
    pred = 0.5 * label + rng.normal(size=300)
    label[rng.random(300) < 0.1] = np.nan
    group[:2] = 100  # a group of 2 rows, one of them without a label -> ignored
    label[0] = np.nan
    got = ic_loss(torch.tensor(pred), torch.tensor(label), torch.tensor(group))
    assert got.item() == pytest.approx(reference_loss(pred, label, group), abs=1e-9)


def test_ic_loss_ignores_constant_groups_and_keeps_float32() -> None:
    pred = torch.tensor([1.0, 2.0, 3.0, 7.0, 7.0, 7.0, 1.0, 2.0])
    label = torch.tensor([1.0, 3.0, 2.0, 1.0, 2.0, 3.0, 4.0, 4.0])
    group = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2])  # group 1: constant pred, group 2: constant label
    loss = ic_loss(pred, label, group)
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(-0.5)


def test_ic_loss_gradient() -> None:
    rng = np.random.default_rng(5)
    group = torch.tensor(np.repeat(np.arange(4), 6))
    label = torch.tensor(rng.normal(size=24))
    pred = torch.tensor(rng.normal(size=24), requires_grad=True)
    assert torch.autograd.gradcheck(lambda p: ic_loss(p, label, group), (pred,))
    # one gradient step along -grad raises the mean correlation
    loss = ic_loss(pred, label, group)
    loss.backward()
    stepped = ic_loss(pred.detach() - 0.1 * pred.grad, label, group)
    assert stepped.item() < loss.item()
    # the correlation is scale-free, so the gradient is orthogonal to pred within each group
    for g in range(4):
        rows = group == g
        assert float((pred.grad[rows] * (pred.detach()[rows] - pred.detach()[rows].mean())).sum()) == pytest.approx(0, abs=1e-12)


def test_ic_loss_of_perfect_prediction_is_minus_one_and_nan_pred_propagates() -> None:
    label = torch.tensor([0.1, 0.5, -0.2, 0.3, 0.0, 0.9])
    group = torch.tensor([3, 3, 3, 8, 8, 8])
    assert ic_loss(2 * label + 1, label, group).item() == pytest.approx(-1.0)
    pred = (2 * label).clone()
    pred[4] = math.nan
    assert math.isnan(ic_loss(pred, label, group).item())


def test_ic_loss_without_usable_group_is_a_backpropagating_zero() -> None:
    pred = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    loss = ic_loss(pred, torch.tensor([1.0, math.nan, 2.0]), torch.tensor([0, 1, 2]))
    assert loss.item() == 0.0
    loss.backward()
    assert pred.grad.tolist() == [0.0, 0.0, 0.0]


def test_inexact_constant_is_an_exact_zero_and_counted() -> None:
    # mean(0.1, 0.1, 0.1) != 0.1 in floating point: pandas sees tiny residuals and reports a
    # rounding-level 0.0; the exact test calls it constant, scores exactly 0 and counts it
    df = pd.DataFrame({"date": [1, 1, 1, 2, 2, 2], "pred": [0.1, 0.1, 0.1, 1.0, 2.0, 3.0], "label": [1.0, 2.0, 3.0] * 2})
    daily = daily_ic(df, flag_constant=True)
    assert daily["date"].tolist() == [1, 2] and daily["ic"].tolist()[0] == 0.0
    assert daily["constant_pred"].tolist() == [1, 0]
    pearson, spearman = daily_ic_torch(torch.tensor([[0.1, 0.1, 0.1]]), torch.tensor([[1.0, 2.0, 3.0]]))
    assert pearson.item() == 0.0 and spearman.item() == 0.0
