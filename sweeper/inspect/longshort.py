"""The long-short view and the top-K ensemble of a study, beside its best trial.

Both are computed from the frames ``sweeper predict`` writes: ``portfolio`` is
:func:`sweeper.quant.portfolio.long_short` of ``predict --trial best --split valid|test``, and ``ensemble``
scores ``predict --trial top3``. The frames are read by :class:`~sweeper.inspect.frames.TrialFrames` (stored
predictions, else the model run again). ``sweeper best`` and ``sweeper report`` compute them and ``sweeper
status`` does not. When they cannot be computed (no weights, data gone), the reason is given instead."""

from typing import Any

import optuna
from optuna.trial import FrozenTrial

from sweeper.config import SweeperConfig
from sweeper.errors import SweeperError
from sweeper.inspect.frames import TrialFrames
from sweeper.inspect.trials import top_trials
from sweeper.plain import plain
from sweeper.quant.ensemble import ensemble
from sweeper.quant.ic import ic_report
from sweeper.quant.portfolio import LongShort, long_short

SCORED = ("valid", "test")
ENSEMBLE_K = 3
IC_KEYS = ("ic", "rank_ic", "icir", "n_dates", "n_constant_dates")


def best_long_short(cfg: SweeperConfig, predictor: TrialFrames, best: FrozenTrial) -> dict[str, LongShort]:
    """``{"valid"|"test": LongShort}`` of the best trial (raises SweeperError when it cannot)."""
    horizon = predictor.config(best).data.horizon
    return {split: long_short(predictor.frame(best, split), horizon, cfg.report.quantiles)
            for split in SCORED}


def portfolio_report(cfg: SweeperConfig, study: optuna.Study, best: FrozenTrial,
                     predictor: TrialFrames) -> dict[str, Any]:
    """The ``best --json`` keys ``portfolio``, ``constant_pred_dates``, ``ensemble`` (each None
    with a ``*_unavailable`` reason when it cannot be computed)."""
    out: dict[str, Any] = {}
    try:
        views = best_long_short(cfg, predictor, best)
        out["portfolio"] = {split: view.summary() for split, view in views.items()}
        out["constant_pred_dates"] = {s: ic_report(predictor.frame(best, s))["n_constant_dates"]
                                      for s in SCORED}
    except SweeperError as exc:
        out.update(portfolio=None, portfolio_unavailable=str(exc), constant_pred_dates=None)
    try:
        out["ensemble"] = ensemble_report(cfg, study, predictor)
    except SweeperError as exc:
        out.update(ensemble=None, ensemble_unavailable=str(exc))
    return out


def ensemble_report(cfg: SweeperConfig, study: optuna.Study, predictor: TrialFrames) -> dict[str, Any]:
    """The top-K ensemble's IC and long-short figures on valid and test, and ``alone``: its best
    member's IC on the same rows (under walk-forward both are the last fold's valid block, not
    the dates of the best trial's val_ic, the mean over every fold's).

    The horizon of the long-short step is the longest of the members' (a study that tunes
    ``data.horizon`` has one label, whose overlap the widest setting describes best)."""
    members = top_trials(study, ENSEMBLE_K)
    horizon = max(predictor.config(t).data.horizon for t in members)
    out: dict[str, Any] = {"k": ENSEMBLE_K, "trials": [t.number for t in members], "portfolio": {},
                           "alone": {"trial": members[0].number}}
    for split in SCORED:
        frame = ensemble([predictor.frame(t, split) for t in members])
        out[split] = _ics(frame)
        out["alone"][split] = _ics(predictor.frame(members[0], split))
        out["portfolio"][split] = long_short(frame, horizon, cfg.report.quantiles).summary()
    return out


def _ics(frame: Any) -> dict[str, Any]:
    return {key: plain(value) for key, value in ic_report(frame).items() if key in IC_KEYS}
