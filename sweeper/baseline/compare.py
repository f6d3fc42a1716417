"""The best trial against the baseline: the difference of their val and test IC, and a
Newey-West t-statistic of the daily IC difference (best - baseline) over the dates both were
scored on (:mod:`sweeper.quant.hac`, lag ``horizon - 1`` as the selection figures use).

Under walk-forward folds both sides' ``val_ic`` are means over the same valid blocks
(:mod:`sweeper.baseline.fit`), so ``val_ic_diff`` compares like with like, ``fold_val_ic_diff``
is the difference fold by fold, and the valid t-statistic runs over the dates of every block.

Pure: the daily ICs come in as arrays (the inspect layer reads the trial's files), the
baseline's from its study attribute (:mod:`sweeper.baseline.job`)."""

import math
from typing import Any, TypeGuard

import numpy as np

from sweeper.quant.hac import hac_standard_error, lag_for_horizon

SPLITS = {"valid": "val", "test": "test"}
KEPT = ("val_ic", "val_rank_ic", "val_icir", "test_ic", "test_rank_ic", "test_icir", "best_iteration",
        "elapsed_s", "lightgbm_version", "rows", "subsampled", "n_features", "lags", "threads",
        "constant_predictions",
        # walk-forward folds (sweeper.baseline.job.fold_summary)
        "folds", "fold_val_ic", "val_ic_se", "worst_fold_val_ic", "fold_best_iteration")


def paired_t(dates_a: np.ndarray, ic_a: np.ndarray, dates_b: np.ndarray, ic_b: np.ndarray,
             lag: int) -> dict[str, Any]:
    """``{mean_diff, t_stat, n_dates}`` of ``a - b`` on the dates both have a finite IC."""
    a = {str(d)[:10]: float(v) for d, v in zip(dates_a, ic_a) if math.isfinite(float(v))}
    b = {str(d)[:10]: float(v) for d, v in zip(dates_b, ic_b) if math.isfinite(float(v))}
    diff = np.array([a[d] - b[d] for d in sorted(set(a) & set(b))], dtype=np.float64)
    mean, se = (float(diff.mean()) if len(diff) else None), hac_standard_error(diff, lag)  # NaN under 2 dates
    t = mean / se if mean is not None and math.isfinite(se) and se > 0 else None
    return {"mean_diff": mean, "t_stat": t, "n_dates": len(diff)}


def baseline_daily(attr: dict[str, Any], split: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The baseline's daily ICs of ``split`` from its study attribute: ``(dates, ics)``, NaN for none."""
    if not (series := (attr.get("daily") or {}).get(split)):
        return None
    ic = np.array([math.nan if v is None else v for v in series["ic"]], dtype=np.float64)
    return np.asarray(series["date"], dtype=object), ic


def comparison(attr: dict[str, Any], best_metrics: dict[str, Any],
               best_daily: dict[str, tuple[np.ndarray, np.ndarray]], horizon: int) -> dict[str, Any]:
    """``best --json``'s ``baseline``: the baseline's figures, ``{val,test}_ic_diff`` (best -
    baseline), ``{val,test}_t_stat`` (Newey-West, lag ``horizon - 1``, on the shared dates) and
    ``t_stat``: the test split's, the out-of-sample one."""
    out: dict[str, Any] = {k: attr.get(k) for k in KEPT if k in attr}
    out["nw_lag"] = lag = lag_for_horizon(horizon)
    for split, p in SPLITS.items():
        mine, theirs = best_metrics.get(f"{p}_ic"), attr.get(f"{p}_ic")
        out[f"{p}_ic_diff"] = float(mine) - float(theirs) if finite(mine) and finite(theirs) else None
        base, trial = baseline_daily(attr, split), best_daily.get(split)
        paired = paired_t(*trial, *base, lag) if base is not None and trial is not None else \
            {"mean_diff": None, "t_stat": None, "n_dates": 0}
        out[f"{p}_t_stat"], out[f"{p}_shared_dates"] = paired["t_stat"], paired["n_dates"]
    out["t_stat"] = out["test_t_stat"]
    mine, theirs = best_metrics.get("fold_val_ic"), attr.get("fold_val_ic")
    if "fold_val_ic" in attr:  # best - baseline fold by fold; None unless both have as many folds
        same = isinstance(mine, list) and isinstance(theirs, list) and len(mine) == len(theirs)
        out["fold_val_ic_diff"] = [float(a) - float(b) if finite(a) and finite(b) else None
                                   for a, b in zip(mine or [], theirs or [])] if same else None
    return out


def finite(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and math.isfinite(value)


def state_words(state: dict[str, Any] | None, attr: dict[str, Any] | None) -> str:
    """Whether the study's baseline is done, in words (``sweeper status`` and ``best``)."""
    if state is None:
        return "not computed (`sweeper baseline STUDY` computes it)" if attr is None else "done"
    where = f" on {state['host']}" if state.get("host") else ""
    error = state.get("error", "?")
    return {"failed": f"failed{where}: {error}", "running": f"running{where} since {state.get('at', '?')}",
            "interrupted": f"interrupted{where} ({error}): the next sweep that runs a trial computes it, "
                           "as `sweeper baseline STUDY` does"}.get(str(state.get("state")), "done")
