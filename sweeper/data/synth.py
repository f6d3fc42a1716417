"""A synthetic panel with a planted, learnable signal and a known oracle IC.

Features are persistent AR(1) processes with student-t innovations. The label (a 2-day forward return,
conceptually) is a per-date z-scored signal plus overlapping noise, mixed so the oracle daily IC (Pearson of
the true signal vs the label, per date, averaged) is about ``TARGET_IC``. The signal needs the input window:
``tanh(mean of f0 over 10 dates) * sign(f1_t)`` plus ``f2_t - f2_{t-5}``, each scaled to unit variance; it
uses features up to t only."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from sweeper.atomic import atomic_path
from sweeper.data.parquet import ORACLE_DAILY_KEY, ORACLE_KEY, daily_oracle_json
from sweeper.data.split import fraction_splits, purge_gap
from sweeper.errors import DataError
from sweeper.quant.ic import grouped_pearson

GENERATOR_VERSION = 1
START_DATE = "2010-01-04"
PHI_RANGE = (0.90, 0.98)
FEATURE_DOF = 4          # student-t innovations: heavy tails, finite variance
NOISE_DOF = 5
TARGET_IC = 0.10
MEAN_WINDOW = 10
DIFF_LAG = 5
LABEL_HORIZON = 2
LABEL_SCALE = 0.02       # a daily-return-like magnitude for the raw label
BURN_IN = 64             # AR warm-up, so every date has a full signal history
LATE_LISTING, EARLY_DELISTING, GAP_RATE, NAN_RATE = 0.10, 0.05, 0.015, 0.005
# the split rule the stored oracle IC uses: DataConfig's defaults
DEFAULT_LOOKBACK, DEFAULT_HORIZON, DEFAULT_EMBARGO = 20, 2, 0
DEFAULT_FRACTIONS = (0.6, 0.2, 0.2)
SIGNAL_COL = "_signal"


def describe(assets: int, dates: int, features: int, seed: int) -> str:
    return f"synthetic(assets={assets},dates={dates},features={features},seed={seed})"


def feature_names(features: int) -> list[str]:
    width = max(2, len(str(features - 1)))
    return [f"f{k:0{width}d}" for k in range(features)]


def check_params(assets: int, dates: int, features: int, where: str) -> None:
    for name, value, low in (("assets", assets, 2), ("dates", dates, 10), ("features", features, 2)):
        if int(value) < low:
            raise DataError(f"{where}: {name} must be >= {low} (got {value})")


def simulate_features(rng: np.random.Generator, dates: int, assets: int, features: int) -> np.ndarray:
    """[BURN_IN + dates, assets, features] unit-variance AR(1) paths."""
    phi = rng.uniform(*PHI_RANGE, size=(assets, features))
    gain = np.sqrt(1.0 - phi**2)
    shocks = rng.standard_t(FEATURE_DOF, size=(BURN_IN + dates, assets, features))
    shocks *= math.sqrt((FEATURE_DOF - 2) / FEATURE_DOF)
    x = np.empty_like(shocks)
    x[0] = shocks[0]
    for s in range(1, len(x)):
        x[s] = phi * x[s - 1] + gain * shocks[s]
    return x


def signal_terms(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unscaled [dates, assets] terms at each date from features up to that date:
    ``tanh(mean of f0 over the last 10 dates) * sign(f1_t)`` and ``f2_t - f2_{t-5}``."""
    f0, f1 = x[:, :, 0], x[:, :, 1]
    f2 = x[:, :, 2 if x.shape[2] > 2 else 0]
    csum = np.cumsum(f0, axis=0)
    mean = (csum[MEAN_WINDOW:] - csum[:-MEAN_WINDOW]) / MEAN_WINDOW   # mean over (s-10, s]
    term1 = np.tanh(mean[BURN_IN - MEAN_WINDOW:]) * np.sign(f1[BURN_IN:])
    return term1, f2[BURN_IN:] - f2[BURN_IN - DIFF_LAG:-DIFF_LAG]


def planted_signal(x: np.ndarray) -> np.ndarray:
    """[dates, assets] signal, burn-in dropped: both terms at unit variance. The two scales are constants of
    the whole sample; per date, the signal depends only on features up to that date."""
    term1, term2 = signal_terms(x)
    return term1 / term1.std() + term2 / term2.std()


def forward_label(rng: np.random.Generator, signal: np.ndarray) -> np.ndarray:
    """Raw label: ``TARGET_IC`` of the per-date z-scored signal plus the sum of the next two daily shocks
    (neighbouring labels overlap); NaN on the last ``LABEL_HORIZON`` dates, whose return is not yet known."""
    dates, assets = signal.shape
    z = (signal - signal.mean(1, keepdims=True)) / signal.std(1, keepdims=True)
    daily = rng.standard_t(NOISE_DOF, size=(dates + LABEL_HORIZON, assets))
    daily *= math.sqrt((NOISE_DOF - 2) / NOISE_DOF)
    noise = sum(daily[k:k + dates] for k in range(1, LABEL_HORIZON + 1)) / math.sqrt(LABEL_HORIZON)
    label = LABEL_SCALE * (TARGET_IC * z + math.sqrt(1 - TARGET_IC**2) * noise)
    label[dates - LABEL_HORIZON:] = np.nan
    return label


def presence(rng: np.random.Generator, dates: int, assets: int) -> np.ndarray:
    """[dates, assets] bool: late listings, early delistings and random gaps."""
    start = np.where(rng.random(assets) < LATE_LISTING, rng.integers(1, max(dates // 2, 2), assets), 0)
    end = np.where(rng.random(assets) < EARLY_DELISTING, rng.integers(dates // 2, dates, assets), dates)
    t = np.arange(dates)[:, None]
    return (t >= start) & (t < end) & (rng.random((dates, assets)) >= GAP_RATE)


def generate(assets: int, dates: int, features: int, seed: int) -> pd.DataFrame:
    """The long frame plus the hidden true signal in column ``_signal``."""
    check_params(assets, dates, features, describe(assets, dates, features, seed))
    rng = np.random.default_rng(seed)
    x = simulate_features(rng, dates, assets, features)
    signal = planted_signal(x)
    label, present = forward_label(rng, signal), presence(rng, dates, assets)
    t_idx, a_idx = np.nonzero(present)
    values = x[BURN_IN:][t_idx, a_idx].astype(np.float32)
    values[rng.random(values.shape) < NAN_RATE] = np.nan
    frame = pd.DataFrame(values, columns=feature_names(features))
    frame.insert(0, "date", pd.bdate_range(START_DATE, periods=dates).to_numpy("datetime64[ns]")[t_idx])
    width = max(4, len(str(assets)))
    frame.insert(1, "asset", np.array([f"A{k:0{width}d}" for k in range(1, assets + 1)], dtype=object)[a_idx])
    frame["label"] = label[t_idx, a_idx].astype(np.float32)
    frame[SIGNAL_COL] = signal[t_idx, a_idx]
    return frame


def oracle_daily(frame: pd.DataFrame, all_dates: np.ndarray) -> np.ndarray:
    """[T] daily Pearson IC of ``_signal`` vs the raw label (NaN where undefined)."""
    codes = np.searchsorted(all_dates, frame["date"].to_numpy("datetime64[ns]"))
    a, b = frame[SIGNAL_COL].to_numpy(np.float64), frame["label"].to_numpy(np.float64)
    ok = np.isfinite(a) & np.isfinite(b)
    return grouped_pearson(codes[ok], a[ok], b[ok], len(all_dates))


def oracle_ic(frame: pd.DataFrame, all_dates: np.ndarray,
              splits: dict[str, tuple[int, int]]) -> dict[str, float]:
    """Mean daily Pearson IC of ``_signal`` vs the raw label over each split's target dates."""
    daily = oracle_daily(frame, all_dates)
    return {name: float(np.nanmean(daily[a:b])) for name, (a, b) in splits.items()}


def default_oracle(frame: pd.DataFrame, where: str) -> dict[str, float]:
    """Oracle IC under DataConfig's default split (lookback 20, horizon 2, embargo 0, 0.6/0.2/0.2)."""
    all_dates = np.unique(frame["date"].to_numpy("datetime64[ns]"))
    splits = fraction_splits(len(all_dates), DEFAULT_FRACTIONS, DEFAULT_LOOKBACK,
                             purge_gap(DEFAULT_HORIZON, DEFAULT_EMBARGO), f"{where}: column 'date'",
                             (DEFAULT_HORIZON, DEFAULT_EMBARGO))
    return oracle_ic(frame, all_dates, splits)


def synthetic_frame(assets: int, dates: int, features: int,
                    seed: int) -> tuple[pd.DataFrame, dict[str, float]]:
    """(long frame: date, asset, f00.., label; oracle IC per split). Deterministic for a seed."""
    frame = generate(assets, dates, features, seed)
    return frame.drop(columns=[SIGNAL_COL]), default_oracle(frame, describe(assets, dates, features, seed))


def write_synthetic(path: str | Path, assets: int, dates: int, features: int, seed: int) -> dict[str, float]:
    """Write the synthetic panel to ``path`` atomically; returns the oracle IC dict (default split), also
    stored in the file metadata under ``b"sweeper.oracle_ic"``. The oracle's daily IC goes under
    ``b"sweeper.oracle_daily_ic"``, so ``load_panel`` gives the oracle of whatever split the study uses."""
    path = Path(path)
    check_params(assets, dates, features, str(path))
    if not path.parent.is_dir():
        raise DataError(f"{path}: the folder {path.parent} does not exist")
    if path.is_file() and path.stat().st_size:  # only a panel (or an empty file) is replaced, never notes
        with path.open("rb") as old:
            if old.read(4) != b"PAR1":
                raise DataError(f"{path}: exists and is not a Parquet file; write the panel to another file")
    full = generate(assets, dates, features, seed)
    all_dates = np.unique(full["date"].to_numpy("datetime64[ns]"))
    oracle = default_oracle(full, describe(assets, dates, features, seed))
    table = pa.Table.from_pandas(full.drop(columns=[SIGNAL_COL]), preserve_index=False)
    params = {"assets": assets, "dates": dates, "features": features, "seed": seed,
              "generator": GENERATOR_VERSION}
    meta = {**(table.schema.metadata or {}), ORACLE_KEY: json.dumps(oracle).encode(),
            ORACLE_DAILY_KEY: daily_oracle_json(all_dates, oracle_daily(full, all_dates)),
            b"sweeper.synthetic": json.dumps(params).encode()}
    try:
        with atomic_path(path) as tmp:
            pq.write_table(table.replace_schema_metadata(meta), tmp)
    except OSError as exc:
        raise DataError(f"{path}: cannot write the Parquet file ({exc})") from None
    return oracle
