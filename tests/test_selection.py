from __future__ import annotations

import json
import math
from statistics import NormalDist

import numpy as np
import pytest

from sweeper.quant.selection import deflated_sharpe, expected_max, null_max_ic, pbo, selection_summary

PHI = NormalDist()


# ------------------------------------------------------------ expected_max


@pytest.mark.parametrize("n,value", [(10, 1.58), (100, 2.53), (1000, 3.26)])
def test_expected_max_literature_values(n: int, value: float) -> None:
    assert expected_max(n) == pytest.approx(value, abs=0.01)
    # the cruder sqrt(2 ln N) overstates it by about half a standard deviation
    assert 0.4 < math.sqrt(2 * math.log(n)) - expected_max(n) < 0.6


def test_expected_max_matches_simulation() -> None:
    draws = np.random.default_rng(0).standard_normal((20_000, 100))
    assert expected_max(100) == pytest.approx(draws.max(axis=1).mean(), abs=0.03)


def test_expected_max_single_trial_is_zero_and_zero_trials_is_an_error() -> None:
    assert expected_max(1) == 0.0
    assert expected_max(2) > 0
    with pytest.raises(ValueError, match="n >= 1"):
        expected_max(0)


# ------------------------------------------------------------ null_max_ic


def test_null_max_ic_exact() -> None:
    # std(ddof=1) of [0, k, 0, k] is k/sqrt(3); SE = k/sqrt(3)/2; the median trial has k=2
    trials = [np.array([0.0, k, 0.0, k]) for k in (1.0, 2.0, 30.0)] + [np.array([np.nan, 5.0])]
    assert null_max_ic(trials) == pytest.approx(2 / math.sqrt(3) / 2 * expected_max(4), rel=1e-12)
    assert math.isnan(null_max_ic([np.array([1.0])]))


def test_null_max_ic_matches_the_best_of_simulated_null_trials() -> None:
    rng = np.random.default_rng(1)
    n_trials, n_days, reps = 50, 250, 300
    daily = rng.normal(0.0, 0.1, (reps, n_days, n_trials))
    best_means = daily.mean(axis=1).max(axis=1)  # the best trial's mean IC in each repetition
    predicted = null_max_ic(list(daily[0].T))
    assert predicted == pytest.approx(best_means.mean(), rel=0.05)


# ------------------------------------------------------------ deflated Sharpe


def test_deflated_sharpe_exact() -> None:
    x = np.array([-1.0, 0.0, 1.0, 2.0, 3.0])  # mean 1, std sqrt(2.5), skew 0, kurtosis 6.8/4
    sr = 1 / math.sqrt(2.5)
    sr0 = 0.2 * expected_max(10)  # sd of [0, 0.2, 0.4] is 0.2
    z = (sr - sr0) * math.sqrt(4) / math.sqrt(1 + (1.7 - 1) / 4 * sr**2)
    out = deflated_sharpe(x, [0.0, 0.2, 0.4], 10, null_ic=0.5)
    assert out["sr"] == pytest.approx(sr, rel=1e-12)
    assert out["sr0"] == pytest.approx(sr0, rel=1e-12)
    assert out["dsr"] == pytest.approx(PHI.cdf(z), rel=1e-12)
    assert out["p_fluke"] == pytest.approx(1 - PHI.cdf(z), rel=1e-12)
    assert out["deflated_ic"] == pytest.approx(0.5)
    # without null_ic, the trial's own SE stands in: sqrt(2.5)/sqrt(5) * E[max_10]
    assert deflated_sharpe(x, [0.0, 0.2, 0.4], 10)["deflated_ic"] == pytest.approx(1 - math.sqrt(0.5) * expected_max(10))


def test_skew_enters_the_dsr() -> None:
    x = np.array([0.0, 0.0, 0.0, 0.0, 4.0, 1.0])  # right-skewed
    out = deflated_sharpe(x, [], 1)
    c = x - x.mean()
    skew, kurt = np.mean(c**3) / np.mean(c**2) ** 1.5, np.mean(c**4) / np.mean(c**2) ** 2
    sr = x.mean() / x.std(ddof=1)
    assert out["sr0"] == 0.0
    assert out["dsr"] == pytest.approx(PHI.cdf(sr * math.sqrt(5) / math.sqrt(1 - skew * sr + (kurt - 1) / 4 * sr**2)))


def test_deflated_sharpe_undefined_cases() -> None:
    assert math.isnan(deflated_sharpe(np.array([0.1, 0.2]), [0.1, 0.3], 5)["dsr"])  # too few days
    assert math.isnan(deflated_sharpe(np.array([0.1, 0.1, 0.1]), [0.1, 0.3], 5)["dsr"])  # no spread
    assert math.isnan(deflated_sharpe(np.array([0.1, 0.2, 0.4]), [0.1], 5)["sr0"])  # one SR for 5 trials


def noise_study(seed: int, planted: float = 0.0) -> tuple[dict[int, np.ndarray], int]:
    rng = np.random.default_rng(seed)
    daily = rng.normal(0.0, 0.1, (250, 50))
    daily[:, 7] += planted
    best = 7 if planted else int(np.argmax(daily.mean(axis=0)))
    return {k: daily[:, k] for k in range(50)}, best


def test_best_of_pure_noise_looks_like_a_fluke() -> None:
    daily, best = noise_study(seed=0)
    summary = selection_summary(daily, best)
    # naively (one trial, no deflation) the winner looks significant ...
    assert deflated_sharpe(daily[best], [], 1)["p_fluke"] < 0.05
    # ... but not once the 50 tries are accounted for
    assert summary["p_fluke"] > 0.5
    assert abs(summary["deflated_ic"]) < 0.005 < summary["best_val_ic"]


def test_planted_signal_survives_deflation() -> None:
    daily, best = noise_study(seed=0, planted=0.05)
    summary = selection_summary(daily, best)
    assert summary["p_fluke"] < 1e-3 and summary["pbo"] == 0.0
    assert summary["deflated_ic"] > 0.03


# ------------------------------------------------------------ PBO


def test_pbo_small_exact_case() -> None:
    # two blocks; whichever half is in-sample, the in-sample winner is last out of sample
    m = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 2.0], [0.0, 2.0]])
    assert pbo(m, n_blocks=2) == 1.0
    assert pbo(m[:, [0]].repeat(2, axis=1) + [[0.0, 1.0]], n_blocks=2) == 0.0


def test_pbo_is_one_when_every_trial_has_the_same_total() -> None:
    # each column sums to zero, so the in-sample mean is minus the out-of-sample mean:
    # the in-sample winner is always the out-of-sample loser
    m = np.random.default_rng(2).normal(size=(64, 20))
    m -= m.mean(axis=0)
    assert pbo(m, n_blocks=16) == 1.0


def test_pbo_is_zero_with_a_dominant_trial() -> None:
    m = np.random.default_rng(3).normal(size=(64, 20))
    m[:, 5] += 5.0
    assert pbo(m, n_blocks=8) == 0.0


def test_pbo_of_noise_is_near_one_half() -> None:
    values = [pbo(np.random.default_rng(seed).normal(size=(80, 30)), n_blocks=10) for seed in range(8)]
    assert 0.35 < float(np.mean(values)) < 0.65


def test_pbo_median_rank_counts_half() -> None:
    # 3 trials, 2 blocks: the in-sample winner lands exactly on the median rank (2 of 3)
    m = np.array([[3.0, 2.0, 1.0], [2.0, 3.0, 1.0]])
    assert pbo(m, n_blocks=2) == 0.5


def test_pbo_ignores_nan_days_and_ranks_empty_trials_last() -> None:
    m = np.array([[1.0, 0.0, np.nan], [np.nan, 0.0, np.nan], [1.0, 0.0, 5.0], [1.0, 0.0, np.nan]])
    # first half in-sample: trial 0 wins (mean 1 over its one finite day; trial 2 has none);
    #   out of sample it ranks 2 of 3 (0 < 1 < 5): the median, counts 1/2
    # second half in-sample: trial 2 wins (5); out of sample it has no day, ranks last: counts 1
    assert pbo(m, n_blocks=2) == 0.75


def test_pbo_argument_errors() -> None:
    with pytest.raises(ValueError, match=">= 2 trials"):
        pbo(np.zeros((10, 1)))
    with pytest.raises(ValueError, match="even n_blocks"):
        pbo(np.zeros((10, 3)), n_blocks=3)
    with pytest.raises(ValueError, match="at least that many dates"):
        pbo(np.zeros((10, 3)), n_blocks=16)


# ------------------------------------------------------------ summary


def test_summary_keys_and_json_safety() -> None:
    daily, best = noise_study(seed=4)
    summary = selection_summary(daily, best)
    assert set(summary) == {
        "n_trials", "expected_max_null_ic", "best_val_ic", "deflated_ic", "sr", "sr0", "dsr", "p_fluke", "pbo",
    }
    assert summary["n_trials"] == 50
    assert summary["best_val_ic"] == pytest.approx(daily[best].mean())
    assert summary["deflated_ic"] == pytest.approx(summary["best_val_ic"] - summary["expected_max_null_ic"])
    assert summary["pbo"] == pbo(np.column_stack(list(daily.values())), n_blocks=16)
    json.dumps(summary, allow_nan=False)


def test_summary_single_trial_and_short_series() -> None:
    one = selection_summary({3: np.array([0.1, 0.2, 0.05, 0.15] * 5)}, 3)
    assert one["pbo"] is None and one["expected_max_null_ic"] == 0.0 and one["sr0"] == 0.0
    assert one["deflated_ic"] == pytest.approx(one["best_val_ic"])
    short = selection_summary({0: np.arange(10.0), 1: np.ones(10)}, 0)
    assert short["pbo"] is None  # fewer than 16 dates
    # trial 1 never varies, so only one trial has a Sharpe ratio: no spread across trials, no DSR
    assert short["sr0"] is None and short["dsr"] is None and short["p_fluke"] is None
    assert short["best_val_ic"] == 4.5 and short["n_trials"] == 2


# ------------------------------------------------------------ overlapping labels (Newey-West)


def newey_west_reference(x: np.ndarray, lag: int) -> float:
    """Newey-West standard error of the mean, written out term by term from its definition:
    s^2 (ddof=1) times 1 + 2 sum_k (1 - k/(lag+1)) rho_k, rho_k = sum_t c_t c_{t-k} / sum_t c_t^2."""
    c = x - x.mean()
    rho = [sum(c[t] * c[t - k] for t in range(k, len(x))) / sum(v * v for v in c) for k in range(1, lag + 1)]
    ratio = 1 + 2 * sum((1 - k / (lag + 1)) * r for k, r in enumerate(rho, start=1))
    return math.sqrt(x.var(ddof=1) * max(ratio, 1.0) / len(x))


def test_newey_west_standard_error_exact() -> None:
    from sweeper.quant.hac import effective_days, hac_standard_error, lag_for_horizon

    x = np.array([0.3, 0.5, 0.4, 0.1, -0.2, -0.1, 0.2, 0.6, 0.5, 0.1])
    for lag in (1, 2, 4):
        assert hac_standard_error(x, lag) == pytest.approx(newey_west_reference(x, lag), rel=1e-12)
    assert hac_standard_error(x, 0) == pytest.approx(x.std(ddof=1) / math.sqrt(10), rel=1e-12)
    assert effective_days(x, 0) == 10
    assert effective_days(x, 2) == pytest.approx(10 * x.var(ddof=1) / 10 / newey_west_reference(x, 2) ** 2)
    assert [lag_for_horizon(h) for h in (0, 1, 2, 5)] == [0, 0, 1, 4]
    # NaN days are dropped; a negative autocorrelation never shrinks the error below the plain one
    alternating = np.array([1.0, -1.0] * 10 + [np.nan])
    assert hac_standard_error(alternating, 3) == pytest.approx(np.nanstd(alternating, ddof=1) / math.sqrt(20))


def test_horizon_sets_the_lag_of_every_figure() -> None:
    rng = np.random.default_rng(5)
    shocks = rng.normal(0.01, 0.1, 300)
    overlapping = np.convolve(shocks, np.ones(5) / 5, mode="valid")  # a 5-day moving sum: MA(4)
    daily = {0: overlapping, 1: rng.normal(0, 0.05, len(overlapping))}
    plain, hac = selection_summary(daily, 0, horizon=1), selection_summary(daily, 0, horizon=5)
    assert hac["best_val_ic"] == plain["best_val_ic"] and hac["sr"] == plain["sr"]
    assert hac["expected_max_null_ic"] > plain["expected_max_null_ic"]
    assert hac["p_fluke"] > plain["p_fluke"]
    per_trial = selection_summary(daily, 0, horizon={0: 5, 1: 1})
    assert per_trial["dsr"] == hac["dsr"]  # the best trial's own horizon drives its DSR


def no_signal_daily_ics(seeds: int, dates: int, assets: int, horizon: int, seed: int = 0) -> np.ndarray:
    """[seeds, dates] daily ICs of a persistent prediction (AR(1), phi 0.95, as a model's
    output is) against an h-day forward return, with no relation between them at all."""
    rng = np.random.default_rng(seed)
    returns = rng.standard_normal((seeds, dates + horizon, assets)).astype(np.float32)
    label = sum(returns[:, k:k + dates] for k in range(1, horizon + 1))
    shocks = rng.standard_normal((seeds, dates, assets)).astype(np.float32)
    pred = np.empty_like(shocks)
    pred[:, 0] = shocks[:, 0]
    for t in range(1, dates):
        pred[:, t] = 0.95 * pred[:, t - 1] + math.sqrt(1 - 0.95**2) * shocks[:, t]
    zp = (pred - pred.mean(2, keepdims=True)) / pred.std(2, keepdims=True)
    zy = (label - label.mean(2, keepdims=True)) / label.std(2, keepdims=True)
    return (zp * zy).mean(2).astype(np.float64)


def test_five_day_label_on_no_signal_keeps_false_positives_near_five_percent() -> None:
    ics = no_signal_daily_ics(seeds=2000, dates=250, assets=30, horizon=5)
    p_hac = np.array([selection_summary({0: x}, 0, horizon=5)["p_fluke"] for x in ics])
    p_iid = np.array([selection_summary({0: x}, 0, horizon=1)["p_fluke"] for x in ics])
    rate_hac, rate_iid = float((p_hac < 0.05).mean()), float((p_iid < 0.05).mean())
    # treating overlapping days as independent calls ~1 in 4 pure-noise models significant;
    # Newey-West with lag h-1 brings it near the nominal 5% (Bartlett weights leave it a little above)
    assert rate_iid > 0.18
    assert 0.03 < rate_hac < 0.11


def test_trials_are_lined_up_by_date_not_by_position() -> None:
    import pandas as pd

    rng = np.random.default_rng(6)
    days = pd.bdate_range("2022-01-03", periods=60).strftime("%Y-%m-%d")
    values = {k: rng.normal(0.02 * (k == 0), 0.1, 60) for k in range(4)}
    # trial 0 (the best) and 1 were scored on days 0-39, trial 2 on days 2-41, trial 3 on days 10-49
    spans = {0: (0, 40), 1: (0, 40), 2: (2, 42), 3: (10, 50)}
    daily = {k: pd.Series(values[k][a:b], index=days[a:b]) for k, (a, b) in spans.items()}
    by_hand = {}
    for k, (a, b) in spans.items():
        lookup = dict(zip(days[a:b], values[k][a:b]))
        by_hand[k] = np.array([lookup.get(d, np.nan) for d in days[:40]])
    summary = selection_summary(daily, 0)
    assert summary == pytest.approx(selection_summary(by_hand, 0), rel=1e-12)
    # trial 3 shares only 30 of the 40 dates (< 90%): it counts toward N but stays out of PBO
    assert summary["n_trials"] == 4
    assert summary["pbo"] == pbo(np.column_stack([by_hand[0], by_hand[1], by_hand[2]]), n_blocks=10)
    # by position, trial 2's day 2 would be compared with the best trial's day 0
    positional = selection_summary({k: v.to_numpy() for k, v in daily.items()}, 0)
    assert positional["pbo"] != summary["pbo"] or positional["expected_max_null_ic"] != summary["expected_max_null_ic"]
