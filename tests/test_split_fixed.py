"""Comparable trials: the split of a study is computed once, from the widest lookback, horizon
and embargo its search space allows, so every trial is scored on the same dates."""
from __future__ import annotations

import numpy as np
import pytest
import yaml

from conftest import TINY, merge
from sweeper.config import DataConfig, SyntheticConfig, validate_config, with_overrides
from sweeper.data import load_panel

SPACE = {"data.lookback": {"type": "categorical", "choices": [10, 20]},
         "data.horizon": {"type": "int", "low": 1, "high": 4},
         "train.lr": {"type": "float", "low": 1e-3, "high": 1e-2, "log": True}}


def study_config(**over):
    return validate_config(merge(TINY, {"search_space": SPACE, **over}), "study.yaml")


def test_the_widest_values_are_resolved_into_the_config():
    cfg = study_config()
    split = cfg.data.split
    assert (split.lookback, split.horizon, split.embargo) == (20, 4, 0)
    # a trial's own values do not move it: its params are inside the search space
    trial = with_overrides(cfg, {"data.lookback": 10, "data.horizon": 1}, "trial 0 params")
    assert trial.data.lookback == 10 and trial.data.horizon == 1
    assert trial.data.split == cfg.data.split
    # no search over them: the config's own values, so an untuned study keeps its split
    plain = validate_config(TINY, "tiny")
    assert (plain.data.split.lookback, plain.data.split.horizon, plain.data.split.embargo) == (5, 2, 0)
    # an explicit wider value is kept; a narrower one is raised to what the trials need
    wide = study_config(data={**TINY["data"], "split": {"lookback": 30, "embargo": 3}})
    assert (wide.data.split.lookback, wide.data.split.embargo) == (30, 3)
    narrow = study_config(data={**TINY["data"], "split": {"lookback": 2}})
    assert narrow.data.split.lookback == 20


def test_trials_with_different_lookbacks_share_valid_and_test_dates():
    cfg = study_config()
    panels = {lb: load_panel(with_overrides(cfg, {"data.lookback": lb, "data.horizon": h}, "t").data)
              for lb, h in ((10, 1), (20, 4))}
    short, long = panels[10], panels[20]
    assert short.splits == long.splits
    for split in ("valid", "test"):
        dates = [set(short.dates[p.sample_index(split)[:, 0].numpy()]) for p in (short, long)]
        assert dates[0] == dates[1]
    # the trial's own lookback still shapes its windows
    assert short.lookback == 10 and long.lookback == 20
    # what went wrong before: each trial's own split moves the valid window
    own = [load_panel(DataConfig(synthetic=SyntheticConfig(**TINY["data"]["synthetic"]), lookback=lb, horizon=h))
           for lb, h in ((10, 1), (20, 4))]
    assert own[0].splits["valid"] != own[1].splits["valid"]


def test_the_oracle_is_computed_on_the_studys_split():
    cfg = study_config()
    panel = load_panel(cfg.data)
    from sweeper.data import synth

    params = cfg.data.synthetic
    frame = synth.generate(params.assets, params.dates, params.features, params.seed)
    daily = synth.oracle_daily(frame, panel.dates)
    for split, (a, b) in panel.splits.items():
        assert panel.oracle_ic[split] == pytest.approx(float(np.nanmean(daily[a:b])), rel=1e-12)


def test_date_range_splits_are_pinned_too():
    ranges = {"train": ["2010-01-04", "2010-05-31"], "valid": ["2010-06-01", "2010-07-15"],
              "test": ["2010-07-16", "2010-08-31"]}
    cfg = study_config(data={**TINY["data"], "split": ranges})
    a = load_panel(with_overrides(cfg, {"data.lookback": 10, "data.horizon": 1}, "t").data)
    b = load_panel(with_overrides(cfg, {"data.lookback": 20, "data.horizon": 4}, "t").data)
    assert a.splits == b.splits
    # train stops 4 dates (the widest purge) before valid starts
    assert a.splits["valid"][0] - a.splits["train"][1] == 4


def test_an_old_trial_config_keeps_the_split_it_was_trained_with(tmp_path):
    from sweeper.inspect.trial_model import trial_config
    from sweeper.store.layout import TrialFiles

    raw = merge(TINY, {"search_space": SPACE, "data": {"lookback": 10, "horizon": 1}})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw))  # no data.split.lookback: written before pinning
    old = trial_config(TrialFiles(tmp_path))
    assert (old.data.split.lookback, old.data.split.horizon) == (10, 1)
    raw["data"]["split"] = {"lookback": 20, "horizon": 4, "embargo": 0}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw))
    assert trial_config(TrialFiles(tmp_path)).data.split.lookback == 20
