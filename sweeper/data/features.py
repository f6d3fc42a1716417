"""Which columns are features: ``data.features`` names or glob patterns, minus ``data.exclude``.

- ``data.features: null`` takes every candidate column (for a Parquet file, every numeric
  column but the date, asset and label columns);
- an entry with a glob character (``*``, ``?``, ``[``) that is not a column's own name (``ret[5]``) is a
  pattern matched with :func:`fnmatch.fnmatchcase` against the candidates, in the file's column order; a
  pattern that matches nothing is an error (a typo should not silently drop features);
- any other entry is a column name and must exist (it may be of any type, so a text
  column named on purpose gets the type check's clear message);
- ``data.exclude`` patterns (or names) then drop columns from the result; one that matches no column of the
  file is an error too (a typo would keep the column it was meant to drop).

The result keeps the first occurrence of each column, in the order the entries select them."""

from fnmatch import fnmatchcase

from sweeper.errors import DataError

_GLOB = set("*?[")


def select(candidates: list[str], columns: list[str], features: list[str] | None, exclude: list[str],
           where: str) -> list[str]:
    """Feature names from ``candidates`` (numeric, not date/asset/label) and ``columns`` (all).

    ``where`` prefixes every error message, e.g. ``"data.parquet"``."""
    chosen: list[str] = []
    for entry in candidates if features is None else features:
        if features is not None and _GLOB & set(entry) and entry not in columns:
            if not (matched := [c for c in candidates if fnmatchcase(c, entry)]):
                raise DataError(f"{where}: the pattern '{entry}' (data.features) matches no numeric column; "
                                f"the candidates are: {shown(candidates)}")
            chosen.extend(matched)
        elif features is not None and entry not in columns:
            raise DataError(f"{where}: column '{entry}' (data.features) not found; the file has columns: "
                            f"{shown(columns)}")
        else:
            chosen.append(entry)
    if typos := [pat for pat in exclude if not any(fnmatchcase(c, pat) for c in columns)]:  # keeps a leak
        raise DataError(f"{where}: data.exclude {typos} matches no column; the file has: {shown(columns)}")
    if not (kept := [c for c in dict.fromkeys(chosen) if not any(fnmatchcase(c, pat) for pat in exclude)]):
        raise DataError(f"{where}: no feature column selected (data.features {features}, exclude {exclude})")
    return kept


def shown(names: list[str]) -> str:
    """The first 20 of ``names``, for an error message."""
    return ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")
