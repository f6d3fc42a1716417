"""``sweeper export``: the study's trials as one table (Parquet or CSV).

One row per trial: ``number, state, value, datetime_start, datetime_complete, duration_s``, then
``params.<name>`` and ``user_attrs.<name>`` for every param and user attribute any trial has (missing: null).
Dotted names keep their dots (``params.train.lr``), the names the study file and ``--set`` use.

Parquet needs one type per column. A column whose values mix kinds (numbers and strings, or lists and dicts
such as the study config) holds JSON text instead; a column of numbers, of strings or of booleans keeps its
type. CSV, as ever, cannot tell an empty string from a missing value.

A fold list (a ``fold_*`` user attribute of numbers: ``fold_val_ic``, ``fold_best_epoch``, ..., one entry per
walk-forward fold) is JSON text like every list, and is also spread over one float column per fold right after
it, 1-based: ``user_attrs.fold_val_ic_1``, ``user_attrs.fold_val_ic_2``, ... (NaN where a trial has fewer
folds, e.g. a pruned one)."""

import json
import math
from pathlib import Path

import optuna
import pandas as pd

from sweeper.atomic import atomic_path
from sweeper.errors import ConfigError

FIXED = ("number", "state", "value", "datetime_start", "datetime_complete", "duration_s")
FORMATS = (".parquet", ".csv")


def trials_frame(study: optuna.Study) -> pd.DataFrame:
    """One row per trial (see the module docstring)."""
    attrs = ("number", "state", "value", "datetime_start", "datetime_complete", "duration", "params",
             "user_attrs")
    if (raw := study.trials_dataframe(attrs=attrs, multi_index=True)).empty:
        return pd.DataFrame({c: pd.Series(dtype="float64" if c in ("value", "duration_s") else "object")
                             for c in FIXED})
    # the value's column is ("value", the study's metric name) once the study names its metric
    frame = pd.DataFrame({"value" if col[0] == "value" else ".".join(p for p in col if p): raw[col]
                          for col in raw.columns})
    frame["duration_s"] = pd.to_timedelta(frame.pop("duration")).dt.total_seconds()  # None while all run
    names = [str(c) for c in frame.columns]  # the dotted names made just above
    params, user = (sorted(c for c in names if c.startswith(p)) for p in ("params.", "user_attrs."))
    frame = frame[[c for c in FIXED if c in frame] + params + user]
    spread = {c: _per_fold(frame[c]) for c in user if c.startswith("user_attrs.fold_")}
    for column in params + user:
        frame[column] = _one_type(frame[column])
    pieces = [frame[[c]] if not spread.get(c) else pd.concat([frame[[c]], pd.DataFrame(spread[c])], axis=1)
              for c in frame.columns]
    return pd.concat(pieces, axis=1).reset_index(drop=True)


def _per_fold(column: pd.Series) -> dict[str, pd.Series]:
    """``{name_1: ..., name_k: ...}`` of a column of lists of numbers; empty for any other column."""
    values = [v for v in column if not _missing(v)]
    if not values or not all(isinstance(v, list) and all(x is None or _kind(x) == "number" for x in v)
                             for v in values):
        return {}
    width = max(len(v) for v in values)
    rows = [[math.nan] * width if _missing(v) else [math.nan if x is None else float(x) for x in v]
            + [math.nan] * (width - len(v)) for v in column]
    return {f"{column.name}_{k + 1}": pd.Series([r[k] for r in rows], index=column.index, dtype="float64")
            for k in range(width)}


def _one_type(column: pd.Series) -> pd.Series:
    kinds = {_kind(v) for v in column if not _missing(v)}
    if len(kinds) <= 1 and kinds <= {"number", "string", "bool"}:
        return column
    return pd.Series([None if _missing(v) else json.dumps(v, default=str) for v in column],
                     index=column.index, dtype="object")


def _kind(value: object) -> str:
    return ("bool" if isinstance(value, bool) else "number" if isinstance(value, (int, float))
            else "string" if isinstance(value, str) else "json")


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def table_format(out: Path) -> str:
    """The suffix of a table's file name, which says its format (the CLI asks before a command's work)."""
    if (suffix := out.suffix.lower()) not in FORMATS:
        raise ConfigError(f"{out}: expected a .parquet or .csv file name")
    return suffix


def write_table(frame: pd.DataFrame, out: str | Path) -> None:
    suffix = table_format(out := Path(out))
    with atomic_path(out) as tmp:
        (frame.to_csv if suffix == ".csv" else frame.to_parquet)(tmp, index=False)


def read_table(path: str | Path) -> pd.DataFrame:
    """An exported table read back, with the datetime columns parsed for CSV too."""
    return (pd.read_csv(path, parse_dates=["datetime_start", "datetime_complete"])
            if Path(path).suffix.lower() == ".csv" else pd.read_parquet(path))
