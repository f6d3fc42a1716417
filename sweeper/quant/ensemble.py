"""Ensembles of prediction frames: the mean of the members' per-date z-scored predictions.

Models differ in scale (one predicts returns, another ranks), so each member's ``pred`` is
z-scored across each date's assets first (ddof=1, as ``cs_zscore``; 0 on a date where it is
constant). The ensemble's ``pred`` is the plain mean over the members, on the (date, asset) rows
that every member predicted; ``label`` is carried over unchanged."""

import numpy as np
import pandas as pd

KEYS = ["date", "asset"]


def zscore_by_date(frame: pd.DataFrame, pred: str = "pred", date: str = "date") -> np.ndarray:
    """``pred`` z-scored within each date (ddof=1); 0 where the date has no spread."""
    x = pd.to_numeric(frame[pred], errors="coerce").astype(np.float64)
    grouped = x.groupby(frame[date].to_numpy())
    mean, std = grouped.transform("mean"), grouped.transform("std")
    z = ((x - mean) / std).to_numpy()
    return np.where(~(std.to_numpy() > 0) & np.isfinite(x.to_numpy()), 0.0, z)  # no spread: 0


def ensemble(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """``date, asset, pred, label``: the mean per-date z-score of every frame's ``pred``."""
    if not frames:
        raise ValueError("an ensemble needs at least one prediction frame")
    merged = frames[0][[*KEYS, "label"]].assign(pred=zscore_by_date(frames[0]))
    for k, frame in enumerate(frames[1:], start=1):
        member = frame[KEYS].assign(**{f"pred_{k}": zscore_by_date(frame)})
        merged = merged.merge(member, on=KEYS, how="inner", sort=False)
    columns = ["pred", *(f"pred_{k}" for k in range(1, len(frames)))]
    merged["pred"] = merged[columns].mean(axis=1, skipna=False)
    return merged[[*KEYS, "pred", "label"]].sort_values(KEYS, kind="stable").reset_index(drop=True)
