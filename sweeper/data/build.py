"""Building a panel's arrays with bounded memory: the rows' keys first, then the
features scattered block by block into the one full-size array, normalised where it lies.

Peak memory is about the final arrays plus one block of feature columns and one chunk of dates of
temporaries: no full ``[rows, features]`` matrix sits beside the dense ``[dates, assets, features]`` one,
and normalisation writes back into it. ``alloc`` says where the arrays live: plain memory
(``data.cache: false``) or the files of a panel cache entry being written (:mod:`sweeper.data.cache`), so
both paths run the same code and give the same bits."""

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch

from sweeper.config import DataConfig
from sweeper.data.columns import Codes, Columns, row_codes
from sweeper.data.leak import judge_leaks, mean_daily_corr
from sweeper.data.normalize import NormStats, fit_stats, normalize_inplace, normalize_label
from sweeper.data.panel import Panel
from sweeper.data.split import split_dates, split_widths
from sweeper.errors import DataError

Alloc = Callable[[str, tuple[int, ...], np.dtype], np.ndarray]  # (array name, shape, dtype) -> the array
# the oracle IC of each split, from the panel's dates and its splits ([start, stop) date indices)
OracleFn = Callable[[np.ndarray, dict[str, tuple[int, int]]], dict[str, float] | None]
ARRAYS = ("X", "y", "y_raw", "mask")
_DATES = 128  # dates per chunk of the NaN fill and the infinity clean-up


@dataclass
class Built:
    """A panel's arrays and everything it carries besides them (what a cache entry stores)."""

    X: np.ndarray            # [T, N, F] float32 normalised, NaN -> 0
    y: np.ndarray            # [T, N] float32 normalised label
    y_raw: np.ndarray        # [T, N] float32 raw label
    mask: np.ndarray         # [T, N] bool
    dates: np.ndarray        # [T] datetime64[ns]
    assets: np.ndarray       # [N] str (object)
    features: list[str]
    splits: dict[str, tuple[int, int]]
    norm_stats: NormStats
    oracle_ic: dict[str, float] | None
    leak_corr: list[float]   # the leak guard's figures, judged again at every load
    leak_rows: list[float]


def in_memory(name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The ``alloc`` of an uncached panel: plain process memory."""
    return np.empty(shape, dtype=dtype)


def build(keys: Columns, blocks: Iterable[tuple[int, np.ndarray]], cfg: DataConfig, oracle: OracleFn,
          alloc: Alloc, splits: dict[str, tuple[int, int]] | None = None) -> Built:
    """Dense layout, split, leak guard and normalisation; raises DataError.

    ``keys``: the rows' dates, assets and label (its ``features`` unused); ``blocks``:
    ``(first column, [R, C] values)`` of the feature columns ``keys.feature_names``. ``splits``:
    target-date indices the caller chose (``sweeper refit``'s window, with empty valid and
    test); by default ``data.split``'s (:mod:`sweeper.data.split`)."""
    check_usable(keys)
    codes = row_codes(keys)
    if splits is None:
        lookback, horizon, embargo = split_widths(cfg)
        splits = split_dates(codes.dates, cfg.split, lookback, horizon, embargo,
                             f"{keys.source}: column '{keys.date_col}'")
    X, y_raw, mask = scatter(keys, codes, blocks, alloc)
    corr, rows = mean_daily_corr(X, y_raw, mask, splits["train"])
    judge_leaks(corr, rows, cfg.max_feature_label_corr, keys.feature_names, keys.source, keys.label_col)
    train_start, train_stop = splits["train"]
    fit_dates = (max(train_start - cfg.lookback + 1, 0), train_stop)  # what train windows can see
    stats = fit_stats(torch.from_numpy(X), torch.from_numpy(mask), cfg.feature_norm, fit_dates,
                      list(keys.feature_names))
    normalize_inplace(X, mask, cfg.feature_norm, stats)
    y = alloc("y", y_raw.shape, np.dtype(np.float32))
    y[...] = normalize_label(torch.from_numpy(y_raw), torch.from_numpy(mask), cfg.label_norm).numpy()
    return Built(X=X, y=y, y_raw=y_raw, mask=mask, dates=codes.dates, assets=codes.assets,
                 features=list(keys.feature_names), splits=splits, norm_stats=stats,
                 oracle_ic=oracle(codes.dates, splits), leak_corr=[float(c) for c in corr],
                 leak_rows=[float(r) for r in rows])


def check_usable(keys: Columns) -> None:
    """The data has rows, some with a finite label (the builder's first check, and a refit's)."""
    if len(keys.label) == 0:
        raise DataError(f"{keys.source}: no usable rows: the data has no rows")
    if not np.isfinite(keys.label).any():
        raise DataError(f"{keys.source}: column '{keys.label_col}': no usable rows: "
                        f"none of the {len(keys.label)} rows has a finite label")


def scatter(keys: Columns, codes: Codes, blocks: Iterable[tuple[int, np.ndarray]],
            alloc: Alloc) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The raw dense ``(X [T, N, F], y_raw [T, N], mask [T, N])``: every row's features
    (``blocks`` as in :func:`build`) and label put at its codes, NaN where a row is absent
    or a value is missing or infinite. The one scatter of training and of scoring new data."""
    T, N, F = len(codes.dates), len(codes.assets), len(keys.feature_names)
    X = alloc("X", (T, N, F), np.dtype(np.float32))
    for a in range(0, T, _DATES):
        X[a:a + _DATES] = np.nan
    for k0, block in blocks:
        X[codes.date, codes.asset, k0:k0 + block.shape[1]] = block
        del block
    y_raw = alloc("y_raw", (T, N), np.dtype(np.float32))
    y_raw[...] = np.nan
    y_raw[codes.date, codes.asset] = keys.label
    mask = alloc("mask", (T, N), np.dtype(bool))
    mask[...] = False
    mask[codes.date, codes.asset] = True
    # inf is as unusable as NaN (it poisons every statistic); a feature with no finite value is a broken file
    seen = np.zeros(F, dtype=bool)
    for a in range(0, T, _DATES):
        part = X[a:a + _DATES]
        part[bad := ~np.isfinite(part)] = np.nan
        seen |= ~bad.all(axis=(0, 1))
    if empty := [name for name, value in zip(keys.feature_names, seen) if not value]:
        raise DataError(f"{keys.source}: feature column '{empty[0]}' has no finite value; mend the file "
                        "(or drop it from training with data.exclude)")
    y_raw[~np.isfinite(y_raw)] = np.nan
    return X, y_raw, mask


def to_panel(b: Built, cfg: DataConfig, fingerprint: str, source: str, entry: str | None = None) -> Panel:
    """The Panel over ``b``'s arrays, sharing their memory (a cache entry's maps stay maps)."""
    return Panel(X=tensor(b.X), y=tensor(b.y), y_raw=tensor(b.y_raw), mask=tensor(b.mask), dates=b.dates,
                 assets=b.assets, features=list(b.features), splits=dict(b.splits), lookback=cfg.lookback,
                 oracle_ic=b.oracle_ic, source=source, fingerprint=fingerprint, norm_stats=b.norm_stats,
                 cache_entry=entry)


def tensor(a: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy`` without a copy, also of a read-only map.

    torch warns that it cannot make a read-only array read-only; the panel's tensors are
    never written in place (normalisation happened while building), and the kernel
    refuses a write to a read-only map outright, so the cache cannot be corrupted."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(a)
