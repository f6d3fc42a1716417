"""The leak guard: a feature that correlates with the label on the same date is refused
(sweeper.data.leak), by load_panel and, from the outside, by `sweeper validate`."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml

from conftest import real_env
from sweeper.config import DataConfig
from sweeper.data import load_panel, synthetic_frame
from sweeper.data.leak import mean_daily_corr
from sweeper.errors import DataError


def panel_with(extra: dict[str, float], seed: int = 0, dates: int = 120, assets: int = 30) -> pd.DataFrame:
    """The synthetic panel plus columns ``name = sign * label + noise`` (noise as large as the label)."""
    frame, _ = synthetic_frame(assets=assets, dates=dates, features=3, seed=seed)
    rng = np.random.default_rng(seed + 100)
    scale = float(frame["label"].std())
    for name, sign in extra.items():
        frame[name] = sign * frame["label"] + rng.normal(0, scale, len(frame))
    return frame


def test_mean_daily_corr_is_the_per_date_pearson_averaged() -> None:
    frame = panel_with({"fut": 1.0}, dates=40, assets=12)
    frame = frame[frame["label"].notna()]
    days = sorted(frame["date"].unique())[5:25]
    want = frame[frame["date"].isin(days)].groupby("date").apply(lambda g: g["fut"].corr(g["label"])).mean()
    wide = frame.pivot(index="date", columns="asset")
    x = wide["fut"].to_numpy(np.float32)[:, :, None]
    y = wide["label"].to_numpy(np.float32)
    start = list(wide.index).index(days[0])
    corr, rows = mean_daily_corr(x, y, np.isfinite(y), (start, start + 20))
    assert corr[0] == pytest.approx(want, rel=1e-5)
    assert rows[0] == len(frame[frame["date"].isin(days)])


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_future_return_feature_is_refused_by_name(tmp_path, sign: float) -> None:
    panel_with({"fut_ret": sign}).to_parquet(tmp_path / "p.parquet", index=False)
    with pytest.raises(DataError) as info:
        load_panel(DataConfig(path=str(tmp_path / "p.parquet"), lookback=5))
    msg = str(info.value)
    assert "feature column 'fut_ret'" in msg and "data.max_feature_label_corr 0.3" in msg
    assert f"{'+' if sign > 0 else '-'}0.7" in msg  # label + equal noise: correlation ~0.71
    assert "data.exclude" in msg


def test_excluding_or_raising_the_threshold_lets_it_through(tmp_path) -> None:
    panel_with({"fut_ret": 1.0}).to_parquet(tmp_path / "p.parquet", index=False)
    path = str(tmp_path / "p.parquet")
    assert load_panel(DataConfig(path=path, lookback=5, exclude=["fut_*"])).features == ["f00", "f01", "f02"]
    panel = load_panel(DataConfig(path=path, lookback=5, max_feature_label_corr=0.9))
    assert panel.features == ["f00", "f01", "f02", "fut_ret"]


def test_honest_features_pass_and_tiny_panels_are_not_refused_by_chance(tmp_path) -> None:
    panel_with({}).to_parquet(tmp_path / "p.parquet", index=False)
    corr, _ = mean_daily_corr(*_dense(tmp_path / "p.parquet"))
    assert np.abs(corr).max() < 0.1  # the synthetic features are honest
    # 5 assets on 2 train dates: a chance correlation of 0.4 is noise, not a leak
    rng = np.random.default_rng(1)
    tiny = pd.DataFrame({"date": np.repeat(pd.bdate_range("2021-01-04", periods=10), 5), "asset": list("ABCDE") * 10,
                         "f": rng.normal(size=50), "label": rng.normal(size=50)})
    tiny.to_parquet(tmp_path / "t.parquet", index=False)
    load_panel(DataConfig(path=str(tmp_path / "t.parquet"), lookback=5, horizon=1, max_feature_label_corr=0.05))


def _dense(path):
    """The raw dense arrays as load_panel scatters them (the file recipe's readers)."""
    from sweeper.data.build import in_memory, scatter
    from sweeper.data.columns import row_codes
    from sweeper.data.parquet import feature_blocks, read_keys, read_plan

    cfg = DataConfig(path=str(path))
    path, features, _ = read_plan(cfg)
    keys = read_keys(path, cfg, features)
    X, y, mask = scatter(keys, row_codes(keys), feature_blocks(path, features, len(keys.label)), in_memory)
    return X, y, mask, (19, 80)


@pytest.mark.slow
def test_validate_refuses_it_from_the_outside(tmp_path, monkeypatch) -> None:
    panel_with({"fut_ret": 1.0}).to_parquet(tmp_path / "p.parquet", index=False)
    study = {"study": {"name": "leak"}, "data": {"path": "p.parquet", "lookback": 5},
             "model": {"name": "mlp", "hidden_size": 8}, "devices": {"gpus": "none", "cpu_workers": 1}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(study))
    env = real_env()
    out = subprocess.run([sys.executable, "-m", "sweeper.cli", "validate", "s.yaml"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "feature column 'fut_ret'" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "runs").exists()  # validate writes nothing
    # `sweeper run` runs the same checks before it creates anything
    from click.testing import CliRunner

    from sweeper.cli import main

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["run", "s.yaml"])
    assert result.exit_code == 2 and "feature column 'fut_ret'" in result.output
    assert not (tmp_path / "runs").exists()


def test_the_threshold_is_validated_with_the_config():
    from sweeper.config import validate_config
    from sweeper.errors import ConfigError

    for bad in (0, 1.5):
        with pytest.raises(ConfigError, match="data.max_feature_label_corr"):
            validate_config({"data": {"synthetic": {}, "max_feature_label_corr": bad}}, "s.yaml")
    with pytest.raises(ConfigError, match="data.exclude"):
        validate_config({"data": {"synthetic": {}, "exclude": "fut_ret"}}, "s.yaml")
    assert validate_config({"data": {"synthetic": {}}}, "s.yaml").data.max_feature_label_corr == 0.3
