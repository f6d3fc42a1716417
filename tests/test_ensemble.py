"""Ensembles: the mean of the members' per-date z-scored predictions (sweeper.quant.ensemble)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sweeper.quant.ensemble import ensemble, zscore_by_date


def member(preds: dict[tuple[str, str], float], label: float = 0.0) -> pd.DataFrame:
    rows = [(d, a, p, label) for (d, a), p in preds.items()]
    return pd.DataFrame(rows, columns=["date", "asset", "pred", "label"])


def test_zscore_by_date_exact_and_constant_dates_are_zero() -> None:
    frame = member({("d1", "A"): 1.0, ("d1", "B"): 2.0, ("d1", "C"): 6.0, ("d2", "A"): 5.0, ("d2", "B"): 5.0,
                    ("d3", "A"): 7.0})
    z = zscore_by_date(frame)
    d1 = np.array([1.0, 2.0, 6.0])
    np.testing.assert_allclose(z[:3], (d1 - d1.mean()) / d1.std(ddof=1), rtol=1e-12)
    assert z[3:].tolist() == [0.0, 0.0, 0.0]  # a constant date and a one-row date carry no view


def test_mean_of_zscores_on_the_rows_every_member_has() -> None:
    a = member({("d1", "A"): 1.0, ("d1", "B"): 2.0, ("d1", "C"): 3.0, ("d2", "A"): 0.0, ("d2", "B"): 1.0})
    b = member({("d1", "A"): 30.0, ("d1", "B"): 10.0, ("d1", "C"): 20.0, ("d2", "A"): 4.0, ("d2", "B"): 4.0,
                ("d2", "C"): 9.0})
    a["label"], b["label"] = [0.1, 0.2, 0.3, 0.4, 0.5], [9.0] * 6
    out = ensemble([a, b])
    assert out.columns.tolist() == ["date", "asset", "pred", "label"]
    assert list(zip(out["date"], out["asset"])) == [("d1", "A"), ("d1", "B"), ("d1", "C"), ("d2", "A"), ("d2", "B")]
    za = zscore_by_date(a)
    zb = zscore_by_date(b)[[0, 1, 2, 3, 4]]  # b's (d2, C) has no partner: left out
    np.testing.assert_allclose(out["pred"], (za + zb) / 2, rtol=1e-12)
    assert out["label"].tolist() == [0.1, 0.2, 0.3, 0.4, 0.5]  # the first member's labels
    # scale does not matter: ten times b is the same ensemble
    b10 = b.assign(pred=b["pred"] * 10)
    np.testing.assert_allclose(ensemble([a, b10])["pred"], out["pred"], rtol=1e-12)


def test_one_member_is_its_own_zscore_and_none_is_an_error() -> None:
    a = member({("d1", "A"): 1.0, ("d1", "B"): 3.0})
    assert ensemble([a])["pred"].tolist() == pytest.approx([-1 / np.sqrt(2), 1 / np.sqrt(2)])
    with pytest.raises(ValueError, match="at least one"):
        ensemble([])
