"""Reading the Parquet panel contract: schema checks, then only the needed columns.

Contract: long format, one row per (date, asset); a date column (timestamp,
date or ISO string), an asset column (any type, compared as text), numeric
feature columns and a numeric label column (the forward return).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sweeper.config import DataConfig
from sweeper.data.layout import Columns
from sweeper.errors import DataError

ORACLE_KEY = b"sweeper.oracle_ic"
_HASH_CHUNK = 1 << 20


def read_schema(path: Path) -> pa.Schema:
    if not path.exists():
        raise DataError(f"{path}: data file not found (data.path)")
    if not path.is_file():
        raise DataError(f"{path}: is not a file; data.path must name a Parquet file")
    try:
        return pq.read_schema(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: not a Parquet file ({exc})") from None


def is_numeric(dtype: pa.DataType) -> bool:
    return pa.types.is_integer(dtype) or pa.types.is_floating(dtype)


def select_features(schema: pa.Schema, cfg: DataConfig, path: Path) -> list[str]:
    """cfg.features, or every numeric column but the date, asset and label."""
    for key, name in (("data.date_col", cfg.date_col), ("data.asset_col", cfg.asset_col), ("data.label", cfg.label)):
        _require(schema, name, key, path)
    if cfg.features is None:
        skip = {cfg.date_col, cfg.asset_col, cfg.label}
        names = [f.name for f in schema if f.name not in skip and is_numeric(f.type)]
        if not names:
            raise DataError(f"{path}: no numeric feature columns besides '{cfg.date_col}', "
                            f"'{cfg.asset_col}' and '{cfg.label}' (data.features)")
        return names
    for name in cfg.features:
        _require(schema, name, "data.features", path)
    return list(cfg.features)


def _require(schema: pa.Schema, name: str, key: str, path: Path) -> None:
    if schema.get_field_index(name) < 0:
        shown = ", ".join(schema.names[:20]) + (", ..." if len(schema.names) > 20 else "")
        raise DataError(f"{path}: column '{name}' ({key}) not found; the file has columns: {shown}")


def check_types(schema: pa.Schema, cfg: DataConfig, features: list[str], path: Path) -> None:
    for name in [*features, cfg.label]:
        dtype = schema.field(name).type
        if not is_numeric(dtype):
            what = "label" if name == cfg.label else "feature"
            raise DataError(f"{path}: {what} column '{name}' has type {dtype}; expected a numeric type (int or float)")
    dtype = schema.field(cfg.date_col).type
    if not (pa.types.is_timestamp(dtype) or pa.types.is_date(dtype) or pa.types.is_string(dtype)
            or pa.types.is_large_string(dtype) or pa.types.is_dictionary(dtype)):
        raise DataError(f"{path}: date column '{cfg.date_col}' has type {dtype}; "
                        "expected a timestamp, a date or ISO date strings")


def read_columns(cfg: DataConfig) -> tuple[Columns, dict[bytes, bytes]]:
    """Validated columns of ``cfg.path`` and the file's key-value metadata."""
    path = Path(str(cfg.path))
    schema = read_schema(path)
    features = select_features(schema, cfg, path)
    check_types(schema, cfg, features, path)
    needed = list(dict.fromkeys([cfg.date_col, cfg.asset_col, cfg.label, *features]))
    try:
        table = pq.read_table(path, columns=needed)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: cannot read the Parquet data ({exc})") from None
    matrix = np.empty((table.num_rows, len(features)), dtype=np.float32)
    for k, name in enumerate(features):
        matrix[:, k] = _floats(table.column(name))
    cols = Columns(
        source=str(path), date_col=cfg.date_col, asset_col=cfg.asset_col, label_col=cfg.label,
        dates=_values(table.column(cfg.date_col)), assets=_values(table.column(cfg.asset_col)),
        features=matrix, label=_floats(table.column(cfg.label)), feature_names=features,
    )
    return cols, dict(schema.metadata or {})


def _floats(col: pa.ChunkedArray) -> np.ndarray:
    # nulls become NaN once the column is floating point
    # unsafe: a large int64 may round to the nearest float32, which is what we want
    return pc.cast(col, pa.float32(), safe=False).to_numpy(zero_copy_only=False)


def _values(col: pa.ChunkedArray) -> np.ndarray:
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    return col.to_numpy(zero_copy_only=False)


def oracle_from_metadata(metadata: dict[bytes, bytes]) -> dict[str, float] | None:
    raw = metadata.get(ORACLE_KEY)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
        return {str(k): float(v) for k, v in value.items()}
    except (ValueError, TypeError, AttributeError):
        return None  # a foreign or damaged entry: the panel simply has no oracle


def file_fingerprint(path: str | Path, selection: dict) -> str:
    """sha256 of the file bytes (read in chunks) plus the column selection."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_HASH_CHUNK), b""):
            digest.update(chunk)
    digest.update(json.dumps(selection, sort_keys=True).encode())
    return digest.hexdigest()
