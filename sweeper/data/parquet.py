"""Reading the Parquet panel contract: schema checks, then only the needed columns.

Contract: long format, one row per (date, asset); a date column (timestamp,
date, ISO string or YYYYMMDD integer), an asset column (any type, compared as text), numeric
feature columns and a numeric label column (the forward return)."""

import contextlib
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sweeper.atomic import write_text
from sweeper.config import DataConfig
from sweeper.data.build import OracleFn
from sweeper.data.columns import Columns, Keys, factorize_assets, parse_dates
from sweeper.data.features import select as select_columns
from sweeper.data.features import shown
from sweeper.errors import DataError

ORACLE_KEY = b"sweeper.oracle_ic"
ORACLE_DAILY_KEY = b"sweeper.oracle_daily_ic"
T = TypeVar("T")


def read_schema(path: Path) -> pa.Schema:
    if not path.exists():
        raise DataError(f"{path}: data file not found (data.path)")
    if not path.is_file():
        raise DataError(f"{path}: is not a file; data.path must name a Parquet file")
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: not a Parquet file ({exc})") from None
    # pyarrow writes one name twice (a join's both sides); Arrow then finds neither by that name
    if twice := [name for name in dict.fromkeys(schema.names) if schema.names.count(name) > 1]:
        raise DataError(f"{path}: column '{twice[0]}' appears {schema.names.count(twice[0])} times; "
                        "expected each column name once")
    return schema


def is_numeric(dtype: pa.DataType) -> bool:  # a boolean is a 0/1 flag (halted, is_st): a number
    return any(is_kind(dtype) for is_kind in (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal,
                                              pa.types.is_boolean))


def _require(schema: pa.Schema, keys: Iterable[tuple[str, str]], path: Path) -> None:
    """DataError for the first column named by ``(key, column)`` that the file lacks."""
    for key, name in keys:
        if schema.get_field_index(name) < 0:
            raise DataError(f"{path}: column '{name}' ({key}) not found; the file has columns: "
                            f"{shown(schema.names)}")


def check_types(schema: pa.Schema, cfg: DataConfig, features: list[str], path: Path,
                label: bool = True) -> None:
    for name in [*features, *([cfg.label] if label else [])]:
        if not is_numeric(dtype := schema.field(name).type):
            what = "label" if label and name == cfg.label else "feature"
            raise DataError(f"{path}: {what} column '{name}' has type {dtype}; "
                            "expected a numeric type (int, float, decimal or bool)")
    dtype, t = schema.field(cfg.date_col).type, pa.types
    if not any(is_kind(dtype) for is_kind in (t.is_timestamp, t.is_date, t.is_string, t.is_large_string,
                                              t.is_dictionary, t.is_integer)):
        raise DataError(f"{path}: date column '{cfg.date_col}' has type {dtype}; "
                        "expected a timestamp, a date, ISO date strings or YYYYMMDD integers")


def read_plan(cfg: DataConfig) -> tuple[Path, list[str], dict[bytes, bytes]]:
    """The schema checks alone: the file, the feature columns ``data.features`` and ``data.exclude``
    select (:mod:`sweeper.data.features`) and its metadata."""
    path = Path(str(cfg.path))
    schema = read_schema(path)
    keys = {"data.date_col": cfg.date_col, "data.asset_col": cfg.asset_col, "data.label": cfg.label}
    if cfg.group_col is not None:  # it labels rows (group-neutral IC), it is never a feature
        keys["data.group_col"] = cfg.group_col
    _require(schema, keys.items(), path)
    candidates = [f.name for f in schema if f.name not in keys.values() and is_numeric(f.type)]
    if cfg.features is None and not candidates:
        raise DataError(f"{path}: no numeric feature columns besides '{cfg.date_col}', "
                        f"'{cfg.asset_col}' and '{cfg.label}' (data.features)")
    features = select_columns(candidates, list(schema.names), cfg.features, cfg.exclude, str(path))
    if named := [f"'{v}' ({k})" for k, v in keys.items() if v in features]:  # the label is the answer itself
        raise DataError(f"{path}: column {named[0]} cannot be a feature (data.features)")
    check_types(schema, cfg, features, path)
    return path, features, dict(schema.metadata or {})


def read_keys(path: Path, cfg: DataConfig, features: list[str]) -> Columns:
    """The date, asset and label columns; ``features`` is an empty ``[R, 0]`` matrix, the feature values
    come later in blocks (:func:`feature_blocks`) so they are never all held twice."""
    table = _table(path, [cfg.date_col, cfg.asset_col, cfg.label])
    return Columns(source=str(path), date_col=cfg.date_col, asset_col=cfg.asset_col, label_col=cfg.label,
                   dates=_keys(table.column(cfg.date_col)), assets=_keys(table.column(cfg.asset_col)),
                   features=np.empty((table.num_rows, 0), dtype=np.float32),
                   label=_floats(table.column(cfg.label)), feature_names=features)


def read_groups(cfg: DataConfig) -> pd.DataFrame:
    """``date, asset, group`` of every row of ``data.path``, keyed as the panel is (dates
    parsed to datetime64[ns], asset ids as text), for :func:`sweeper.quant.ic_time.demean_within`.
    The group column stays out of the panel's tensors: only the IC reports read it."""
    path = Path(str(cfg.path))
    if cfg.group_col is None:
        raise DataError(f"{path}: read_groups needs data.group_col")
    _require(read_schema(path), (("data.date_col", cfg.date_col), ("data.asset_col", cfg.asset_col),
                                 ("data.group_col", cfg.group_col)), path)
    table = _table(path, [cfg.date_col, cfg.asset_col, cfg.group_col])
    d_code, dates = parse_dates(_keys(table.column(cfg.date_col)), str(path), cfg.date_col)
    a_code, assets = factorize_assets(_keys(table.column(cfg.asset_col)), str(path), cfg.asset_col)
    return pd.DataFrame({"date": dates[d_code], "asset": assets[a_code],
                         "group": _values(table.column(cfg.group_col))})


def feature_blocks(path: Path, features: list[str], rows: int,
                   budget: int = 64 << 20) -> Iterator[tuple[int, np.ndarray]]:
    """``(first column, [R, C] float32)`` blocks of the feature columns, read ``C`` at a time so that a
    block holds at most about ``budget`` bytes and an eighth of the features (at least one column)."""
    per = max(1, min(budget // max(4 * rows, 1), len(features) // 8))
    for k0 in range(0, len(features), per):
        names = features[k0:k0 + per]
        table = _table(path, names)
        block = np.empty((table.num_rows, len(names)), dtype=np.float32)
        for k, name in enumerate(names):
            block[:, k] = _floats(table.column(name))
        del table
        yield k0, block


def _table(path: Path, columns: list[str]) -> pa.Table:
    try:
        return pq.read_table(path, columns=list(dict.fromkeys(columns)))
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: cannot read the Parquet data ({exc})") from None


def read_scoring_columns(path: Path, cfg: DataConfig, features: list[str]) -> Columns:
    """The columns of a file to score with a trained model: exactly ``features`` (the
    trial's), and the label when the file has one (NaN otherwise: live data has none)."""
    schema = read_schema(path)
    _require(schema, [("data.date_col", cfg.date_col), ("data.asset_col", cfg.asset_col),
                      *(("the trial's features", name) for name in features)], path)
    label = schema.get_field_index(cfg.label) >= 0
    check_types(schema, cfg, features, path, label=label)
    table = _table(path, [cfg.date_col, cfg.asset_col, *([cfg.label] if label else []), *features])
    matrix = np.empty((table.num_rows, len(features)), dtype=np.float32)
    for k, name in enumerate(features):
        matrix[:, k] = _floats(table.column(name))
    y = _floats(table.column(cfg.label)) if label else np.full(table.num_rows, np.nan, dtype=np.float32)
    return Columns(source=str(path), date_col=cfg.date_col, asset_col=cfg.asset_col, label_col=cfg.label,
                   dates=_values(table.column(cfg.date_col)), assets=_values(table.column(cfg.asset_col)),
                   features=matrix, label=y, feature_names=features)


def _floats(col: pa.ChunkedArray) -> np.ndarray:
    # nulls become NaN once the column is floating point
    # unsafe: a large int64 may round to the nearest float32, which is what we want
    return pc.cast(col, pa.float32(), safe=False).to_numpy(zero_copy_only=False)


def _keys(col: pa.ChunkedArray) -> Keys:
    """A key column; text as a ``pd.Categorical`` encoded by Arrow, so that millions of rows
    never become millions of Python strings (only the distinct values do)."""
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        return _values(col)
    uniques = pc.drop_null(pc.unique(col))
    codes = pc.index_in(col, value_set=uniques).fill_null(-1).to_numpy()
    categories = pd.Index(uniques.to_numpy(zero_copy_only=False), dtype=object)
    return pd.Categorical.from_codes(codes, categories=categories)


def _values(col: pa.ChunkedArray) -> np.ndarray:
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    if pa.types.is_timestamp(col.type) and col.type.tz:  # wall time: a Shanghai midnight is its day
        col = pc.local_timestamp(col)
    return col.to_numpy(zero_copy_only=False)


def oracle_from_metadata(metadata: dict[bytes, bytes]) -> OracleFn:
    """The oracle IC of a file, as a function of the panel's dates and actual split.

    A file from :func:`~sweeper.data.synth.write_synthetic` stores the oracle's daily IC
    (``b"sweeper.oracle_daily_ic"``): the oracle of each split is its mean over that
    split's target dates. An older file has only the figures of the default split
    (``b"sweeper.oracle_ic"``), which are returned as they are. None without either."""
    daily = _entry(metadata.get(ORACLE_DAILY_KEY), lambda v: (
        np.array(v["dates"], dtype="datetime64[ns]"),
        np.array([np.nan if x is None else float(x) for x in v["ic"]], dtype=np.float64)))
    if daily is not None and len(daily[0]) == len(daily[1]):  # else: fall back to the fixed figures
        days, values = daily
        return lambda dates, splits: oracle_on_splits(days, values, dates, splits)
    fixed = _entry(metadata.get(ORACLE_KEY), lambda v: {str(k): float(x) for k, x in v.items()})
    return lambda dates, splits: fixed


def oracle_on_splits(days: np.ndarray, values: np.ndarray, dates: np.ndarray,
                     splits: dict[str, tuple[int, int]]) -> dict[str, float]:
    """Mean of the daily oracle IC over each split's target dates (NaN days left out)."""
    picked = {name: values[np.isin(days, dates[a:b])] for name, (a, b) in splits.items()}
    return {name: float(p[np.isfinite(p)].mean()) if np.isfinite(p).any() else float("nan")
            for name, p in picked.items()}


def daily_oracle_json(days: np.ndarray, values: np.ndarray) -> bytes:
    """The metadata value of the daily oracle IC: ISO days and ICs (null for none)."""
    return json.dumps({"dates": [str(d) for d in np.datetime_as_string(days, unit="D")],
                       "ic": [float(v) if np.isfinite(v) else None for v in values]}).encode()


def _entry(raw: bytes | None, read: Callable[[Any], T]) -> T | None:
    """``read`` of a JSON metadata entry; None for none, or a foreign or damaged one."""
    try:
        return read(json.loads(raw or ""))  # none: a ValueError, as a damaged one
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def file_fingerprint(path: str | Path, selection: Mapping[str, object], memo: Path | None = None) -> str:
    """sha256 of the file bytes (read in chunks, hashlib.file_digest) plus the column selection.

    With ``memo`` (the panel cache's folder), the fingerprint of a file whose path, inode, size and
    modification time (in ns) are unchanged is read back instead of re-reading the file: every worker would
    otherwise hash a multi-GB panel before its first step. Those are the signs ``make`` and ``rsync`` trust.
    """
    path = Path(path)
    chosen = json.dumps(selection, sort_keys=True)
    st = path.stat()
    sign = f"{path.resolve()}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{chosen}"
    record = memo / ".fingerprints" / hashlib.sha256(sign.encode()).hexdigest()[:32] if memo else None
    if record is not None and record.exists() and len(known := record.read_text().strip()) == 64:
        return known
    with open(path, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256")
    digest.update(chosen.encode())
    if record is not None:  # a memo: one that cannot be kept is not (the cache's own check says why)
        with contextlib.suppress(OSError):
            record.parent.mkdir(parents=True, exist_ok=True)
            write_text(record, digest.hexdigest())
    return digest.hexdigest()
