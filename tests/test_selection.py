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
