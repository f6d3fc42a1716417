"""Cross-sectional IC metrics: daily Pearson IC and Spearman Rank IC, their means and ICIR.

Conventions (Qlib's ``calc_ic``, see docs/data.md): correlate prediction and raw label across assets on each
date; a pair where either side is missing (NaN or +-inf) is dropped; a date with fewer than 2 pairs, or a
constant label, has no correlation and is skipped. One departure from Qlib: a date whose *prediction* is
constant (and label not) scores IC 0 and Rank IC 0, because a model that collapses to a constant has no
skill that day (dropping the date would flatter it); such dates are counted (``n_constant_dates``). ``ic``
is the mean of the daily ICs, ``icir`` their mean / std (ddof=1), not annualised. A "constant" side means
all its values are exactly equal: pandas tests the residuals after subtracting a floating-point mean, so a
column of 0.1s gives it a spurious 0.0 where we give no correlation.

Two implementations give the same numbers: pandas for notebooks and reports (:func:`ic_report`,
:func:`daily_ic`) and vectorised torch on the tensors' own device for the training loop
(:func:`ic_report_torch`). :func:`ic_loss` is a differentiable per-date Pearson loss."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, TypedDict

import numpy as np
import pandas as pd

from sweeper.errors import DataError
from sweeper.quant.hac import finite
from sweeper.quant.ranks import average_ranks_torch

if TYPE_CHECKING:  # torch is imported where a function needs it: best and status never do
    import torch


class ICReport(TypedDict):
    """What :func:`ic_report` and :func:`ic_report_torch` return (NaN where undefined)."""

    ic: float
    rank_ic: float
    icir: float
    rank_icir: float
    n_dates: int
    n_constant_dates: int  # dates scored 0 for a constant prediction


def daily_ic(df: pd.DataFrame, pred: str = "pred", label: str = "label", date: str = "date",
             flag_constant: bool = False) -> pd.DataFrame:
    """Per-date Pearson IC and Spearman Rank IC, sorted by date: columns ``date, ic, rank_ic`` (the
    daily IC files'), plus ``constant_pred`` (1 on a date whose prediction was constant, else 0)
    with ``flag_constant``. Dates without a correlation are absent."""
    check_columns(df, (pred, label, date))
    x, y = (pd.to_numeric(df[c], errors="coerce").to_numpy(np.float64) for c in (pred, label))
    keep = np.isfinite(x) & np.isfinite(y) & df[date].notna().to_numpy()
    x, y = x[keep], y[keep]
    codes, uniques = pd.factorize(df[date].to_numpy()[keep], sort=True)
    n_groups = len(uniques)
    rx, ry = (pd.Series(v).groupby(codes).rank(method="average").to_numpy(np.float64) for v in (x, y))
    varies = _varies_by_group(codes, x, y, n_groups)  # ranks vary where the values do: one test for both
    constant = (np.bincount(codes, minlength=n_groups) >= 2) & ~varies[0] & varies[1]  # they score 0
    ic, rank_ic = (np.where(constant, 0.0, grouped_pearson(codes, a, b, n_groups, varies))
                   for a, b in ((x, y), (rx, ry)))
    ok = np.isfinite(ic) & np.isfinite(rank_ic)
    return pd.DataFrame({"date": uniques[ok], "ic": ic[ok], "rank_ic": rank_ic[ok],
                         **({"constant_pred": constant[ok].astype(np.int64)} if flag_constant else {})})


def ic_report(df: pd.DataFrame, pred: str = "pred", label: str = "label", date: str = "date") -> ICReport:
    """``{ic, rank_ic, icir, rank_icir, n_dates, n_constant_dates}`` of a long frame with one row
    per (date, asset)."""
    return report_of(daily_ic(df, pred=pred, label=label, date=date, flag_constant=True))


def report_of(daily: pd.DataFrame) -> ICReport:
    """:func:`ic_report` of a frame's ``daily_ic(..., flag_constant=True)``, for a caller that keeps
    the daily ICs too (so they are computed once)."""
    return _report(daily["ic"].to_numpy(), daily["rank_ic"].to_numpy(), int(daily["constant_pred"].sum()))


def check_columns(df: pd.DataFrame, columns: tuple[str, ...], what: str = "IC") -> None:
    if (missing := [repr(c) for c in columns if c not in df.columns]):
        raise DataError(f"{what} needs the column{'s' if len(missing) > 1 else ''} {', '.join(missing)}; "
                        f"the frame has {', '.join(map(repr, map(str, df.columns)))}")


def grouped_pearson(codes: np.ndarray, x: np.ndarray, y: np.ndarray, n_groups: int,
                    varies: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Pearson correlation per group code of finite ``x`` and ``y``; NaN for groups with < 2 rows
    or a constant side (``varies``: whether each side varies per group, where known). The one numpy
    Pearson of the package (the synthetic oracle uses it too)."""
    n = np.bincount(codes, minlength=n_groups).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        dx, dy = (v - (np.bincount(codes, v, n_groups) / n)[codes] for v in (x, y))
        sxy, sxx, syy = (np.bincount(codes, a * b, n_groups) for a, b in ((dx, dy), (dx, dx), (dy, dy)))
        corr = np.clip(sxy / np.sqrt(sxx * syy), -1.0, 1.0)
    x_varies, y_varies = varies or _varies_by_group(codes, x, y, n_groups)
    return np.where((n >= 2) & x_varies & y_varies, corr, np.nan)


def _varies_by_group(codes: np.ndarray, x: np.ndarray, y: np.ndarray,
                     n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    # exact constancy test (see module docstring): min == max within the group
    frame = pd.DataFrame({"x": x, "y": y}).groupby(codes)
    lo, hi = frame.min().reindex(range(n_groups)), frame.max().reindex(range(n_groups))
    return (hi["x"] > lo["x"]).to_numpy(), (hi["y"] > lo["y"]).to_numpy()


def _report(ic: np.ndarray, rank_ic: np.ndarray, n_constant: int = 0) -> ICReport:
    (mean_ic, icir), (mean_rank, rank_icir) = _mean_ir(ic), _mean_ir(rank_ic)
    return {"ic": mean_ic, "rank_ic": mean_rank, "icir": icir, "rank_icir": rank_icir,
            "n_dates": len(finite(ic)), "n_constant_dates": int(n_constant)}


ROUNDING_SPREAD = 1e-12  # a daily IC series' std at or below this is round-off, not spread


def _mean_ir(series: np.ndarray) -> tuple[float, float]:
    if len(values := finite(series)) == 0:
        return math.nan, math.nan
    mean = float(values.mean())
    if len(values) < 2:
        return mean, math.nan
    std = float(values.std(ddof=1))
    # a spread at rounding level is no spread: relative to the mean (every day exactly +-1 with
    # 2 assets), or absolute (daily ICs that are all zero up to round-off, ~1e-17: their ratio
    # would be one round-off over another)
    return mean, (mean / std if std > max(1e-10 * abs(mean), ROUNDING_SPREAD) else math.nan)


def daily_ic_torch(pred: torch.Tensor, label: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-date (Pearson, Spearman) of ``[T, N]`` tensors, as float64 ``[T]`` on their device.

    A NaN or inf in either tensor marks the pair missing. Dates with fewer than 2 pairs or a constant label
    are NaN; a constant prediction scores 0. Fully vectorised: no per-date Python loop, no host copy."""
    import torch
    x, y, valid = _pairs(pred, label)
    constant = _constant_torch(x, y, valid)
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    pearson = torch.where(constant, zero, _masked_pearson(x, y, valid))
    spearman = _masked_pearson(average_ranks_torch(x, valid), average_ranks_torch(y, valid), valid)
    return pearson, torch.where(constant, zero, spearman)


def ic_report_torch(pred: torch.Tensor, label: torch.Tensor) -> ICReport:
    """Same keys and numbers as :func:`ic_report`, from ``[T, N]`` tensors."""
    pearson, spearman = daily_ic_torch(pred, label)
    n_constant = int(_constant_torch(*_pairs(pred, label)).sum())
    return _report(pearson.cpu().numpy(), spearman.cpu().numpy(), n_constant)


def _pairs(pred: torch.Tensor, label: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    import torch
    if pred.shape != label.shape or pred.dim() != 2:
        raise ValueError(f"pred and label must both be [T, N]; "
                         f"got {tuple(pred.shape)} and {tuple(label.shape)}")
    x, y = pred.detach().to(torch.float64), label.detach().to(torch.float64)
    return x, y, torch.isfinite(x) & torch.isfinite(y)


def _constant_torch(x: torch.Tensor, y: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return (valid.sum(1) >= 2) & ~_varies(x, valid) & _varies(y, valid)


def summarize(daily: torch.Tensor) -> tuple[float, float]:
    """``(mean, mean / std(ddof=1))`` of a daily series, ignoring NaN days."""
    import torch
    return _mean_ir(daily.detach().to(torch.float64).cpu().numpy())


def _masked_pearson(x: torch.Tensor, y: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    import torch
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    n = valid.sum(dim=1).to(x.dtype)
    x, y = torch.where(valid, x, zero), torch.where(valid, y, zero)
    dx, dy = (torch.where(valid, v - v.sum(1, keepdim=True) / n.clamp(min=1)[:, None], zero) for v in (x, y))
    corr = ((dx * dy).sum(1) / torch.sqrt((dx * dx).sum(1) * (dy * dy).sum(1))).clamp(-1.0, 1.0)
    ok = (n >= 2) & _varies(x, valid) & _varies(y, valid)
    return torch.where(ok, corr, torch.full_like(corr, math.nan))


def _varies(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    import torch
    inf = torch.tensor(math.inf, dtype=x.dtype, device=x.device)
    return torch.where(valid, x, -inf).amax(1) > torch.where(valid, x, inf).amin(1)


def ic_loss(pred: torch.Tensor, label: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Negative mean per-group Pearson correlation: a differentiable training loss for ``train.loss: ic``.

    ``group`` holds the date id of each row. Rows whose label is not finite are ignored;
    groups with fewer than 2 rows or a constant side are left out of the mean. A
    non-finite prediction is kept, so the loss turns NaN and the trainer sees it. If no
    group is usable the loss is a zero that still backpropagates (all-zero gradients).
    Masks instead of boolean indexing keep host syncs to the one inside ``torch.unique``."""
    import torch
    dtype = torch.promote_types(pred.dtype, torch.float32)
    keep = torch.isfinite(label)
    zero = torch.zeros((), dtype=dtype, device=pred.device)
    x, y = (torch.where(keep, v.to(dtype), zero) for v in (pred, label))
    uniq, codes = torch.unique(group, return_inverse=True)

    def group_sum(v: torch.Tensor) -> torch.Tensor:
        return torch.zeros(uniq.numel(), dtype=v.dtype, device=v.device).index_add(0, codes, v)

    n = group_sum(keep.to(dtype))
    dx, dy = (torch.where(keep, v - (group_sum(v) / n.clamp(min=1))[codes], zero) for v in (x, y))
    sxx, syy, sxy = group_sum(dx * dx), group_sum(dy * dy), group_sum(dx * dy)
    tiny = torch.finfo(dtype).tiny
    # a NaN prediction makes sxx NaN: keep that group so the NaN reaches the loss
    ok = (n >= 2) & (syy > tiny) & ((sxx > tiny) | torch.isnan(sxx))
    # the masked-out groups divide by 1, so their (discarded) branch has a finite gradient
    corr = sxy / torch.sqrt(torch.where(ok, sxx * syy, torch.ones_like(sxx)))
    return -torch.where(ok, corr, zero).sum() / ok.sum().clamp(min=1)
