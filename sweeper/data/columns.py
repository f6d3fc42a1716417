"""A panel's long columns (one row per date and asset) and each row's place in the dense
[dates, assets, columns] layout.

Vectorised: dates are parsed once per distinct value and dates and assets are factorised to integer codes,
with no per-row Python; :func:`sweeper.data.build.scatter` then puts the values where the codes say."""

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sweeper.errors import DataError

# a key column: plain values, or text as a pd.Categorical (parquet.read_keys: one string per distinct value)
Keys = np.ndarray | pd.Categorical


@dataclass
class Columns:
    """The columns of a long panel, as read from a file or generated."""

    source: str              # the file path, or the synthetic description
    date_col: str
    asset_col: str
    label_col: str
    dates: Keys              # [R] dates (datetime64, date objects, strings or YYYYMMDD numbers)
    assets: Keys             # [R] asset ids
    features: np.ndarray     # [R, F] float32, NaN = missing
    label: np.ndarray        # [R] float32, NaN = missing
    feature_names: list[str]


@dataclass
class Codes:
    """Each row's date and asset position in the dense layout."""

    date: np.ndarray         # [R] int date index
    asset: np.ndarray        # [R] int asset index
    dates: np.ndarray        # [T] datetime64[ns], ascending
    assets: np.ndarray       # [N] str (object), sorted as text


def row_codes(cols: Columns) -> Codes:
    """Parse the dates, factorise the assets and refuse duplicated (date, asset) rows."""
    d_code, dates = parse_dates(cols.dates, cols.source, cols.date_col)
    a_code, assets = factorize_assets(cols.assets, cols.source, cols.asset_col)
    if (dup := pd.Series(d_code.astype(np.int64) * len(assets) + a_code).duplicated().to_numpy()).any():
        first = int(np.flatnonzero(dup)[0])
        day = np.datetime_as_string(dates[d_code[first]], unit="D")
        raise DataError(f"{cols.source}: columns '{cols.date_col}', '{cols.asset_col}': {int(dup.sum())} "
                        f"duplicated (date, asset) rows, e.g. ({day}, {assets[a_code[first]]}); expected one "
                        "row per date and asset")
    days, day_code = np.unique(dates.astype("datetime64[D]"), return_inverse=True)
    # several times of one day, almost every asset's rows at one of them: one day's rows stamped two ways
    # (two sources merged), not intraday bars (where an illiquid asset may trade once a day); each time
    # would count as a date, and the purge in dates shrink. One asset in both sources must not hide it
    if len(days) < len(dates) and _rows_in_shared_cells(day_code[d_code] * len(assets) + a_code) < 0.05:
        first = int(np.flatnonzero(np.diff(day_code) == 0)[0])
        times = " and ".join(np.datetime_as_string(dates[first:first + 2], unit="m"))
        raise DataError(f"{cols.source}: column '{cols.date_col}': a day's rows at several times ({times}), "
                        "most assets' at one; expected one time a day (normalise the timestamps to the day)")
    return Codes(d_code, a_code, dates, assets)


def _rows_in_shared_cells(cells: np.ndarray) -> float:
    """The share of rows whose (day, asset) cell holds other rows too."""
    _, inverse, counts = np.unique(cells, return_inverse=True, return_counts=True)
    return float((counts[inverse] > 1).mean())


def parse_dates(values: Keys, source: str, col: str) -> tuple[np.ndarray, np.ndarray]:
    """Row codes into the sorted unique dates (datetime64[ns]); DataError on bad dates.

    Only the distinct values are parsed, then re-factorised, so two spellings of
    one day ("2020-01-02", "2020-01-02 00:00") become one date."""
    plain = np.asarray(values, dtype=object) if _is_text(values) else values
    codes, uniques = _factorize(plain, source, col, "date")
    parsed = _to_datetime(pd.Index(uniques))
    if getattr(parsed, "tz", None) is not None:  # wall time: a Shanghai midnight is its day, not 16:00 UTC
        parsed = parsed.tz_localize(None)
    if (bad := np.asarray(parsed.isna())).any():
        sample = uniques[int(np.flatnonzero(bad)[0])]
        sample = sample.item() if isinstance(sample, np.generic) else sample
        raise DataError(f"{source}: column '{col}': cannot parse {int(bad.sum())} distinct date value(s), "
                        f"e.g. {sample!r}; expected dates, timestamps, ISO date strings or YYYYMMDD integers "
                        "(text dates in one format, which the first one sets: 2024-06-03 is never ambiguous)")
    remap, dates = pd.factorize(parsed.astype("datetime64[ns]"), sort=True)
    return remap[codes], np.asarray(dates, dtype="datetime64[ns]")


def user_day(value: object, where: str, end: bool = False) -> np.datetime64:
    """A day given by hand (a split bound, --until, --start, --end) at its wall time, as the panel's dates;
    an ``end`` given as a bare day is its last instant (a panel stamped at 15:00 keeps that day's row).
    Past datetime64[ns]'s years 1677-2262 it is clamped: 9999-12-31, the usual open end, wrapped to 1816."""
    try:
        day = pd.Timestamp(str(value))
    except (ValueError, TypeError):
        day = None
    if not isinstance(day, pd.Timestamp):  # None, or NaT
        raise DataError(f"{where}: cannot parse the date {value!r} (expected e.g. 2014-06-30)")
    day = min(max(day.tz_localize(None), pd.Timestamp.min), pd.Timestamp.max)  # Shanghai midnight: its day
    if end and not any(c in str(value) for c in ":T") and day < pd.Timestamp.max - pd.Timedelta(days=1):
        day += pd.Timedelta(days=1) - pd.Timedelta(1, "ns")  # a bare day, with no time: all of it
    return day.as_unit("ns").to_datetime64()


def _to_datetime(uniques: pd.Index) -> pd.DatetimeIndex:
    if pd.api.types.is_integer_dtype(uniques.dtype) or pd.api.types.is_float_dtype(uniques.dtype):
        # integers such as 20200102 (the usual date form of A-share data) as dates. A number is
        # never read as nanoseconds since 1970: anything that is not an 8-digit YYYYMMDD fails
        values = uniques.to_numpy(np.float64)
        whole = np.isfinite(values) & (values == np.floor(values)) & (values >= 1e7) & (values < 1e8)
        text = np.where(whole, np.where(whole, values, 0).astype(np.int64).astype(str), "")
        return pd.DatetimeIndex(pd.to_datetime(pd.Index(text), errors="coerce", format="%Y%m%d"))
    if not _is_text(uniques):
        return pd.DatetimeIndex(pd.to_datetime(uniques, errors="coerce"))
    # ISO first (fast, unambiguous); what fails is read in one format, pandas' guess from the first such
    # value: guessed per value, 04/01/2010 was 1 April and 13/01/2010 13 January in one column
    parsed = pd.Series(pd.to_datetime(uniques, errors="coerce", format="ISO8601"))
    if (retry := parsed.isna().to_numpy()).any():
        with warnings.catch_warnings(action="ignore", category=UserWarning):  # the error says its guess
            parsed[retry] = pd.to_datetime(uniques[retry], errors="coerce")
    return pd.DatetimeIndex(parsed)


def _is_text(values: object) -> bool:
    dtype = getattr(values, "dtype", None)
    return dtype is not None and (dtype == np.dtype(object) or pd.api.types.is_string_dtype(dtype))


def _factorize(values: Keys, source: str, col: str, what: str) -> tuple[np.ndarray, np.ndarray]:
    """Row codes into the distinct values; DataError for rows that have none (a null)."""
    if isinstance(values, pd.Categorical):  # text encoded by Arrow (parquet.read_keys): its distinct values
        codes, uniques = values.codes, values.categories.to_numpy()
    else:
        codes, uniques = pd.factorize(values)
    if (codes < 0).any():
        raise DataError(f"{source}: column '{col}': {int((codes < 0).sum())} rows have no {what} "
                        f"(e.g. row {int(np.flatnonzero(codes < 0)[0])})")
    return codes, uniques


def factorize_assets(values: Keys, source: str, col: str) -> tuple[np.ndarray, np.ndarray]:
    codes, uniques = _factorize(values, source, col, "asset id")
    names = np.asarray([str(u) for u in uniques], dtype=object)
    rank, ordered = pd.factorize(names, sort=True)
    if len(ordered) != len(names):
        # e.g. 1 and "1" in an object column: the same id once written out as text
        raise DataError(f"{source}: column '{col}': asset ids collide when converted to text")
    return rank[codes], np.asarray(ordered, dtype=object)
