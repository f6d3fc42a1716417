"""The time split and the purge rule.

Invariant (docs/data.md): for a target date t of an earlier split and u of a
later split, t + horizon + embargo < u. So the label period (t, t+horizon] of
every training sample ends before the first valid (and test) target date, with
``embargo`` more dates to spare, and no two splits' label periods overlap.
Every target date t >= lookback - 1.
"""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sweeper.config import DataConfig, SplitConfig, SyntheticConfig
from sweeper.data import load_panel
from sweeper.data.scoring import date_range
from sweeper.data.split import fraction_sizes, fraction_splits, min_budget, split_dates
from sweeper.errors import DataError

DATES = pd.bdate_range("2020-01-01", periods=60).to_numpy("datetime64[ns]")


def assert_purged(targets: dict[str, np.ndarray], lookback: int, horizon: int, embargo: int) -> None:
    """The invariant, checked on explicit sets of target dates (not on split bounds)."""
    for name, ts in targets.items():
        assert len(ts) and ts.min() >= lookback - 1, name
    order = ["train", "valid", "test"]
    for early, late in itertools.combinations(order, 2):
        t, u = targets[early], targets[late]
        assert t.max() + horizon + embargo < u.min(), (early, late)
        # the same thing said with label periods: no label period of the earlier
        # split touches a later target date or a later label period
        periods = {int(d) for s in t for d in range(s + 1, s + horizon + 1)}
        later = {int(d) for s in u for d in range(s, s + horizon + 1)}
        assert not periods & later


def targets_of(splits: dict[str, tuple[int, int]]) -> dict[str, np.ndarray]:
    return {name: np.arange(a, b) for name, (a, b) in splits.items()}


def test_default_fractions_on_1000_dates():
    splits = split_dates(np.arange(1000), SplitConfig(), 20, 2, 0, "x")  # fractions only use the count
    # 1000 - 19 warm-up - 2*2 purged = 977 target dates: 586 / 195 / 196 after cumulative rounding
    assert splits == {"train": (19, 605), "valid": (607, 803), "test": (805, 1000)}


def test_exact_gap_between_fraction_splits():
    splits = fraction_splits(100, (0.5, 0.25, 0.25), lookback=10, gap=4, where="x")
    assert splits["valid"][0] - splits["train"][1] == 4
    assert splits["test"][0] - splits["valid"][1] == 4
    assert splits["train"][0] == 9 and splits["test"][1] == 100


def test_fractions_below_one_leave_the_tail_unused():
    splits = fraction_splits(110, (0.5, 0.2, 0.1), lookback=1, gap=0, where="x")
    assert splits == {"train": (0, 55), "valid": (55, 77), "test": (77, 88)}


def test_date_ranges_trim_the_end_of_the_earlier_split():
    split = SplitConfig(train=(str(DATES[0])[:10], str(DATES[29])[:10]),
                        valid=(str(DATES[30])[:10], str(DATES[44])[:10]),
                        test=(str(DATES[45])[:10], str(DATES[59])[:10]))
    splits = split_dates(DATES, split, lookback=5, horizon=2, embargo=1, where="f: column 'date'")
    assert splits == {"train": (4, 27), "valid": (30, 42), "test": (45, 60)}
    assert_purged(targets_of(splits), 5, 2, 1)


def test_date_ranges_with_a_wide_gap_are_not_trimmed():
    split = SplitConfig(train=("2020-01-01", "2020-01-31"), valid=("2020-02-14", "2020-02-28"),
                        test=("2020-03-13", "2020-03-20"))
    splits = split_dates(DATES, split, lookback=1, horizon=2, embargo=0, where="x")
    assert splits == {"train": (0, 23), "valid": (32, 43), "test": (52, 58)}


def test_days_outside_datetime64_ns_are_open_ends():
    """9999-12-31, the usual open end, wrapped around in datetime64[ns] to 1816-03-29 (and 1000-01-01 to
    2169): a test split to 9999-12-31 'selected no dates', predict --end 9999-12-31 found no row."""
    split = SplitConfig(train=("1000-01-01", "2020-01-31"), valid=("2020-02-14", "2020-02-28"),
                        test=("2020-03-13", "9999-12-31"))
    splits = split_dates(DATES, split, lookback=1, horizon=2, embargo=0, where="x")
    assert splits == {"train": (0, 23), "valid": (32, 43), "test": (52, 60)}
    assert date_range(DATES, ["2020-03-13", "9999-12-31"], 1) == (52, 60)
    assert date_range(DATES, ["0001-01-01", "2020-01-31"], 5) == (4, 23)


def test_a_bare_end_day_keeps_its_row_when_the_panel_is_stamped_with_a_time():
    """A panel stamped at the 15:00 close: --end 2020-01-31 (or a split's end) meant midnight and dropped
    the 31st's row; a bare end day is all of that day, an end with a time is that instant."""
    closes = DATES + np.timedelta64(15, "h")
    assert date_range(closes, ["2020-01-01", "2020-01-31"], 1) == date_range(DATES, ["2020-01-01", "2020-01-31"], 1)
    assert date_range(closes, ["2020-01-01", "2020-01-31"], 1) == (0, 23)  # 23 business days, the 31st's kept
    assert date_range(closes, ["2020-01-02", "2020-01-31 14:59"], 1) == (1, 22)
    split = SplitConfig(train=("2020-01-01", "2020-01-31"), valid=("2020-02-14", "2020-02-28"),
                        test=("2020-03-13", "2020-03-24"))
    assert split_dates(closes, split, lookback=1, horizon=2, embargo=0, where="x") == split_dates(
        DATES, split, lookback=1, horizon=2, embargo=0, where="x") == {
        "train": (0, 23), "valid": (32, 43), "test": (52, 60)}


def test_overlapping_date_ranges_are_refused():
    split = SplitConfig(train=("2020-01-01", "2020-02-10"), valid=("2020-02-01", "2020-02-20"),
                        test=("2020-02-21", "2020-03-20"))
    with pytest.raises(DataError, match=r"f\.parquet: column 'date': data\.split\.train .* overlaps"):
        split_dates(DATES, split, 1, 0, 0, "f.parquet: column 'date'")


def test_date_range_swallowed_by_the_purge():
    split = SplitConfig(train=("2020-01-01", "2020-01-02"), valid=("2020-01-03", "2020-02-20"),
                        test=("2020-02-21", "2020-03-20"))
    with pytest.raises(DataError, match=r"data\.split\.train .* no target dates left .* purge gap of 3"):
        split_dates(DATES, split, 1, 2, 1, "f.parquet: column 'date'")


def test_unparseable_date_range():
    split = SplitConfig(train=("2020-01-01", "soon"), valid=("2020-02-01", "2020-02-20"),
                        test=("2020-02-21", "2020-03-20"))
    with pytest.raises(DataError, match=r"f: column 'date': data\.split\.train: cannot parse"):
        split_dates(DATES, split, 1, 0, 0, "f: column 'date'")


def test_min_budget_is_the_exact_threshold():
    for fractions in [(0.6, 0.2, 0.2), (0.8, 0.1, 0.1), (0.34, 0.33, 0.33), (0.5, 0.05, 0.05)]:
        b = min_budget(fractions)
        assert min(fraction_sizes(b, fractions)) >= 1
        assert b == 3 or min(fraction_sizes(b - 1, fractions)) < 1


def test_a_larger_budget_never_empties_a_split():
    # cumulative rounding alone gives 2/1/1 for 4 dates but 3/0/2 for 5 (hypothesis found it)
    fractions = (0.5, 1 / 6, 1 / 3)
    assert min_budget(fractions) == 4 and fraction_sizes(4, fractions) == [2, 1, 1]
    assert fraction_sizes(5, fractions) == [2, 1, 2]
    for fractions in [(0.5, 1 / 6, 1 / 3), (0.6, 0.2, 0.2), (0.8, 0.1, 0.1), (0.7, 0.05, 0.25)]:
        b = min_budget(fractions)
        assert all(min(fraction_sizes(n, fractions)) >= 1 for n in range(b, 400))
        # borrowing moves dates between splits, never adds or drops one
        assert all(sum(fraction_sizes(n, fractions)) == int(np.floor(np.cumsum(fractions)[-1] * n + 0.5 + 1e-9))
                   for n in range(b, 400))


@settings(max_examples=150, deadline=None)
@given(
    n_dates=st.integers(3, 400), lookback=st.integers(1, 30), horizon=st.integers(0, 6),
    embargo=st.integers(0, 4),
    fractions=st.tuples(st.floats(0.05, 0.8), st.floats(0.05, 0.5), st.floats(0.05, 0.5)),
)
def test_fraction_splits_property(n_dates, lookback, horizon, embargo, fractions):
    if sum(fractions) > 1:
        fractions = tuple(f / sum(fractions) for f in fractions)
    need = lookback - 1 + 2 * (horizon + embargo) + min_budget(fractions)
    try:
        splits = fraction_splits(n_dates, fractions, lookback, horizon + embargo, "f: column 'date'", (horizon, embargo))
    except DataError as exc:
        assert n_dates < need and f"need at least {need} dates" in str(exc)
        return
    assert n_dates >= need
    assert splits["test"][1] <= n_dates
    assert_purged(targets_of(splits), lookback, horizon, embargo)
    assert splits["valid"][0] - splits["train"][1] == horizon + embargo  # no more purged than needed


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(0, 59), min_size=6, max_size=6, unique=True).map(sorted),
       lookback=st.integers(1, 8), horizon=st.integers(0, 4), embargo=st.integers(0, 3))
def test_range_splits_property(cuts, lookback, horizon, embargo):
    day = lambda k: str(DATES[k])[:10]  # noqa: E731
    split = SplitConfig(train=(day(cuts[0]), day(cuts[1])), valid=(day(cuts[2]), day(cuts[3])),
                        test=(day(cuts[4]), day(cuts[5])))
    try:
        splits = split_dates(DATES, split, lookback, horizon, embargo, "f: column 'date'")
    except DataError as exc:
        assert "no target dates left" in str(exc)
        return
    assert_purged(targets_of(splits), lookback, horizon, embargo)
    assert splits["train"][0] >= cuts[0] and splits["test"][1] == cuts[5] + 1


@pytest.mark.parametrize("lookback,horizon,embargo", [(1, 1, 0), (5, 1, 0), (20, 2, 0), (10, 5, 3), (3, 1, 4)])
def test_sample_index_obeys_the_invariant(lookback, horizon, embargo):
    panel = load_panel(DataConfig(synthetic=SyntheticConfig(assets=6, dates=120, features=3, seed=3),
                                  lookback=lookback, horizon=horizon, embargo=embargo))
    targets = {s: np.unique(panel.sample_index(s)[:, 0].numpy()) for s in ("train", "valid", "test")}
    assert_purged(targets, lookback, horizon, embargo)
    for s, (a, b) in panel.splits.items():
        idx = panel.sample_index(s)
        assert ((idx[:, 0] >= a) & (idx[:, 0] < b)).all()
        assert panel.mask[idx[:, 0], idx[:, 1]].all() and torch.isfinite(panel.y[idx[:, 0], idx[:, 1]]).all()


def test_a_null_bound_is_an_open_end():
    """``valid: [2020-02-14, null]`` (Qlib's segments write an open end so) was refused with pydantic's
    "data.split.valid.float: Input should be a valid number"; a null start or end is the file's first or
    last date, the same split as 0001-01-01 and 9999-12-31 give."""
    split = SplitConfig.model_validate({"train": [None, "2020-01-31"], "valid": ["2020-02-14", "2020-02-28"],
                                        "test": ["2020-03-13", None]})
    assert split.train == ("0001-01-01", "2020-01-31") and split.test == ("2020-03-13", "9999-12-31")
    assert split_dates(DATES, split, lookback=5, horizon=2, embargo=0, where="x") == {
        "train": (4, 23), "valid": (32, 43), "test": (52, 60)}


def test_a_split_bound_that_is_no_day_is_refused_naming_its_key():
    """The study file's ``valid: [2019-13-01, ...]`` reaches the split as text (tests/test_config.py)."""
    split = SplitConfig(train=("2020-01-01", "2020-01-31"), valid=("2020-13-01", "2020-02-28"),
                        test=("2020-03-13", "2020-03-31"))
    with pytest.raises(DataError) as exc:
        split_dates(DATES, split, lookback=1, horizon=2, embargo=0, where="p.parquet: column 'date'")
    assert str(exc.value) == ("p.parquet: column 'date': data.split.valid: cannot parse the date "
                              "'2020-13-01' (expected e.g. 2014-06-30)")


def test_a_valid_or_test_split_of_fewer_than_ten_dates_is_named_in_a_warning(tmp_path, monkeypatch):
    """A holdout valid split of a few dates (a range typed wrong, a short file) was taken without a word,
    where a walk-forward block that short is refused: the study's best trial would be picked on noise."""
    import yaml
    from click.testing import CliRunner

    from sweeper.cli import main
    from sweeper.study.summary import PanelSummary

    def thin_splits(n_dates: dict[str, int], walk_forward: bool) -> list[str]:
        return PanelSummary("s", "f", [], {}, None, n_dates=n_dates).thin_splits(walk_forward)

    assert thin_splits({"train": 3, "valid": 9, "test": 10}, walk_forward=False) == [
        "warning: data.split.valid has 9 target dates: a mean IC over fewer than 10 is mostly noise"]
    # under walk-forward data.split.valid is no block of its own (the folds' are checked there)
    assert thin_splits({"train": 3, "valid": 2, "test": 4}, walk_forward=True) == [
        "warning: data.split.test has 4 target dates: a mean IC over fewer than 10 is mostly noise"]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({  # 60 - 19 warm-up - 2 x 2 purged: 37 = 22 + 8 + 7
        "data": {"synthetic": {"assets": 20, "dates": 60, "features": 3}}, "devices": {"gpus": "none"}}))
    done = CliRunner().invoke(main, ["validate", "s.yaml"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    assert done.output.splitlines()[:2] == [
        "warning: data.split.valid has 8 target dates: a mean IC over fewer than 10 is mostly noise",
        "warning: data.split.test has 7 target dates: a mean IC over fewer than 10 is mostly noise"]
