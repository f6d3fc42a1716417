"""Reading a study back: status, the best trial with its oracle fractions, and how
much of the best trial's IC survives the selection of the best of many.

Opening the study and picking its best trial live in :mod:`sweeper.store.studies`;
where each file is, in :mod:`sweeper.store.layout`.

Read-only: nothing here creates a study or a database file."""

import csv
import dataclasses
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
from optuna.trial import FrozenTrial, TrialState

from sweeper.config import SweeperConfig, objective_label
from sweeper.inspect import ic_views
from sweeper.inspect.trials import model_dates
from sweeper.plain import plain
from sweeper.quant.oracle import oracle_fractions
from sweeper.store import layout
from sweeper.store import optuna_private as private
from sweeper.store.run_folder import files_folder
from sweeper.store.studies import FINISHED, best_trial, n_infeasible
from sweeper.study import retention
from sweeper.validation import contract as K
from sweeper.validation.grid import RunGrid
from sweeper.worker.constraints import FIGURES

BEST_METRICS = ("val_ic", "val_rank_ic", "val_icir", "val_loss", "test_ic", "test_rank_ic", "test_icir",
                "best_epoch", "epochs_run", "batch_size", "micro_batch_size", "precision", "device")
# the trial's stack size, where it came from and the member-samples/s it was measured at; the trials
# it trained with as one stack (study.population); the samples/s its precision was chosen on (auto, a CPU)
STACK_KEYS = ("stack_size", "stack_size_from", "stack_rates", "population", "precision_rates")
# a trial's fold figures, with folds or seed repeats (docs/inspect.md, "Walk-forward")
FOLD_KEYS = (K.FOLD_VAL_IC, K.VAL_IC_SE, K.WORST_FOLD_VAL_IC, K.SEED_VAL_IC_SD, K.SEED_ENSEMBLE_VAL_IC,
             K.FOLD_SEED_ENSEMBLE_VAL_IC, K.FOLD_BEST_EPOCH, K.FOLDS_RUN)


def read_daily(path: Path) -> dict[str, np.ndarray] | None:
    """A daily IC file as arrays: ``date`` (str), ``ic`` and ``rank_ic`` (float64, empty
    cells NaN); None if there is no such file.

    The csv module, not pandas: a 500-trial report reads 500 of these, and pandas'
    import and per-call overhead would be most of the report's time."""
    try:
        with path.open(newline="") as fh:
            rows = list(csv.reader(fh))
    except FileNotFoundError:
        return None
    header, body = (rows[0], rows[1:]) if rows else ([], [])
    out = {}
    for k, name in enumerate(header):
        cells = [r[k] if len(r) > k else "" for r in body]
        out[name] = np.array(cells, dtype=object) if name == "date" else \
            np.array([float(c) if c else math.nan for c in cells], dtype=np.float64)
    return out if "ic" in out else None


def valid_daily_ics(trials: list[FrozenTrial], run_dir: str | Path) -> dict[int, pd.Series]:
    """Trial number -> daily validation IC indexed by date, for every finished trial that
    wrote the file (the cross-trial statistics line trials up by date).

    Pruned trials count: each one was a chance to look good by luck."""
    found = {t.number: read_daily(layout.trial_files(run_dir, t.number).daily_ic("valid"))
             for t in trials if t.state in FINISHED}
    return {n: pd.Series(d["ic"], index=pd.Index(d["date"] if "date" in d else np.arange(len(d["ic"]))))
            for n, d in found.items() if d is not None}


def trial_horizons(trials: list[FrozenTrial], cfg: SweeperConfig) -> dict[int, int]:
    """Each trial's label horizon: its ``data.horizon`` param, else the study's."""
    return {t.number: int(t.params.get("data.horizon", cfg.data.horizon)) for t in trials}


def selection_report(study: optuna.Study, run_dir: str | Path, best: FrozenTrial, trials: list[FrozenTrial],
                     horizons: dict[int, int] | int, daily: dict[int, pd.Series],
                     ) -> dict[str, int | float | str | None] | None:
    """:func:`sweeper.quant.selection.selection_summary` of the trials' ``daily`` validation ICs
    (:func:`valid_daily_ics`) and label ``horizons``; under walk-forward folds, of their ``fold_val_ic``
    and the best trial's ``fold`` column too. None when the best trial has no daily IC file (e.g. its
    run folder is elsewhere)."""
    from sweeper.quant.selection import selection_summary

    if best.number not in daily:
        return None
    # finished trials whose daily file study.keep removed (a refused config's never had one): left out, so
    # the bias is understated
    unread = {"trials_without_files": sum(t.state in FINISHED and t.number not in daily
                                          and t.user_attrs.get("fail_reason") != "config" for t in trials)}
    if not K.folded(study.user_attrs):  # one fold (or a study from before folds)
        return {**selection_summary(daily, best.number, horizons), **unread}
    fold_ics = {t.number: t.user_attrs.get(K.FOLD_VAL_IC) or [] for t in trials if t.number in daily}
    found = read_daily(layout.trial_files(run_dir, best.number).daily_ic("valid"))
    folds = found.get("fold") if found is not None else None
    return {**selection_summary(daily, best.number, horizons, fold_ics=fold_ics, folds=folds), **unread}


def study_oracle(study_attrs: dict[str, Any]) -> dict[str, float] | None:
    """The study's stored oracle IC per split, less the valid one under walk-forward (its stored fold
    layout): it covers data.split's valid block, where a trial's val_ic is the mean over the folds' own."""
    oracle = study_attrs.get("oracle_ic")
    return {k: v for k, v in oracle.items() if k != "valid" or not K.folded(study_attrs)} if oracle else None


def best_report(study: optuna.Study, cfg: SweeperConfig, *, portfolio: bool = False,
                study_file: str | None = None) -> dict[str, Any] | None:
    """The best trial in full. ``portfolio=True`` adds the long-short view and the top-3
    ensemble (:mod:`sweeper.inspect.longshort`), and with ``data.group_col`` the group-neutral
    IC (:mod:`sweeper.inspect.ic_views`), from the trials' stored predictions (the models are
    run on the data only for a trial without them); ``ic_by_year`` only reads the daily IC files. When the
    best trial's weights were removed (``study.keep``, ``sweeper gc``), ``weights_removed``
    and ``retrain``: the command that runs its params again (``study_file`` names the study)."""
    if (best := best_trial(study)) is None:
        return None
    ua, trials = best.user_attrs, study.get_trials(deepcopy=False)
    folder = files_folder(cfg, study)  # this study's files, wherever another study put them
    files = layout.trial_files(folder, best.number)
    out = _trial_report(cfg, study, best, folder, study_file)
    out.update(folds_report(study, cfg, best))
    out["scored_on"] = scored_on(study.user_attrs, portfolio)  # which dates each figure covers
    out.update({k: plain(ua[k]) for k in STACK_KEYS if k in ua})  # how its runs stacked, and why
    out.update(constraints_report(cfg, best, trials))
    if oracle := study_oracle(study.user_attrs):
        out.update(oracle_val_ic=oracle.get("valid"), oracle_test_ic=oracle.get("test"),
                   **oracle_fractions(ua, oracle))
    out["selection"] = selection_report(study, folder, best, trials, trial_horizons(trials, cfg),
                                        valid_daily_ics(trials, folder))
    out["ic_by_year"] = ic_views.ic_by_year_report(ic_views.daily_frames(files))
    out["baseline"] = baseline_report(study, cfg, best, files)
    out["baseline_state"] = study.user_attrs.get("baseline_state")
    if portfolio:
        from sweeper.inspect.frames import TrialFrames
        from sweeper.inspect.longshort import portfolio_report

        # the trials' stored predictions; a trial without them is predicted, with one load of the data
        frames = TrialFrames(cfg, study, study_file=study_file)  # named in a retrain command
        out.update(portfolio_report(cfg, study, best, frames))
        out.update(ic_views.group_neutral_report(cfg, frames, best))
    return out


def _trial_report(cfg: SweeperConfig, study: optuna.Study, best: FrozenTrial, folder: Path,
                  study_file: str | None) -> dict[str, Any]:
    """The best trial's number, value, params, metrics and weights (its retrain's, or how to retrain it)."""
    files = layout.trial_files(folder, best.number)
    out = {"trial": best.number, "value": best.value, "metric": cfg.study.metric,
           "objective": objective_label(cfg.study.metric, cfg.validation),  # what "value" is
           "params": best.params,
           "metrics": {k: plain(best.user_attrs.get(k)) for k in BEST_METRICS if k in best.user_attrs},
           "weights": str(files.weights) if files.weights.exists() else None}
    if retention.weights_removed(best, files):
        if (twin := retention.stand_in(best, study.get_trials(deepcopy=False), folder)) is not None:
            out["weights"] = str(layout.trial_files(folder, twin.number).weights)
        else:
            out.update(weights_removed=True, retrain=retention.retrain_command(best, study_file, study,
                                                                               cfg.study.n_trials))
    return out


def scored_on(study_attrs: dict[str, Any], portfolio: bool) -> dict[str, Any]:
    """``best --json``'s ``scored_on``: for each block (``metrics``, ``group_neutral``; with ``portfolio``,
    the ``portfolio`` and the ``ensemble``) the dates of its valid and test figures: ``over`` (``valid``:
    the valid split; under walk-forward ``all folds``, the mean over every fold's valid block, or
    ``last fold``, the model run's block; ``test``) and ``dates`` ([first, last])."""
    folds, model = K.layout(study_attrs), model_dates(study_attrs)
    test = {"over": "test", "dates": model.get("test")}
    own = {"over": "last fold" if folds else "valid", "dates": model.get("valid")}
    mean = {"over": "all folds", "dates": [folds[0]["valid"][0], folds[-1]["valid"][-1]]} if folds else own
    return {"metrics": {"valid": mean, "test": test}, "group_neutral": {"valid": own, "test": test},
            **({"portfolio": {"valid": own, "test": test}, "ensemble": {"valid": own, "test": test}}
               if portfolio else {})}


def folds_report(study: optuna.Study, cfg: SweeperConfig, trial: FrozenTrial) -> dict[str, Any]:
    """``best --json``'s fold keys: ``validation`` (the scheme block), the trial's :data:`FOLD_KEYS`
    (and a ``study.metric`` other than val_ic's), the fold layout (the trial's, else the study's), and
    ``test_model``: the run whose model scores test_ic and is in weights.pt (the grid's model run:
    ``fold``, ``repeat`` 1-based as in ``runs/fold-<f>.seed-<r>/``, and its ``seed``). Empty for a
    trial that recorded no fold figures (a trial of one run), whose output stays as it was."""
    if K.FOLD_VAL_IC not in (ua := trial.user_attrs):
        return {}
    grid, metric = RunGrid.of(cfg), cfg.study.metric
    extra = (K.fold_key(metric), K.se_key(metric), K.worst_key(metric)) if metric != "val_ic" else ()
    out: dict[str, Any] = {"validation": cfg.validation.model_dump(),
                           **{k: plain(ua[k]) for k in FOLD_KEYS + extra if k in ua}}
    if K.folded(study.user_attrs):
        out[K.FOLD_DATES] = K.layout(ua) or K.layout(study.user_attrs)
    fold, seed = grid.model_run
    # with seed repeats the model is the fold's seed ensemble: ``members`` seeds from ``seed`` on
    out["test_model"] = {"fold": fold + 1, "repeat": seed + 1,
                         "seed": int(trial.params.get("train.seed", cfg.train.seed)) + seed,
                         "members": grid.repeats}
    return out


def baseline_report(study: optuna.Study, cfg: SweeperConfig, best: FrozenTrial,
                    files: layout.TrialFiles) -> dict[str, Any] | None:
    """The best trial against the study's LightGBM baseline (:func:`sweeper.baseline.compare.comparison`
    on the best trial's daily IC files); None while the study has no baseline."""
    from sweeper.baseline.compare import comparison

    if not (attr := study.user_attrs.get("baseline")):
        return None
    found = {split: read_daily(files.daily_ic(split)) for split in ("valid", "test")}
    daily = {split: (f["date"], f["ic"]) for split, f in found.items() if f is not None and "date" in f}
    return comparison(attr, best.user_attrs, daily, trial_horizons([best], cfg)[best.number])


def constraints_report(cfg: SweeperConfig, best: FrozenTrial, trials: list[FrozenTrial]) -> dict[str, Any]:
    """``infeasible``: the COMPLETE trials outside ``study.constraints``, which the best is not
    picked from; with constraints, ``constraints``: each bound and the best trial's valid figure."""
    out: dict[str, Any] = {"infeasible": n_infeasible(trials)}
    if cfg.study.constraints:
        out["constraints"] = {name: {**bound.model_dump(exclude_none=True),
                                     "best": plain(best.user_attrs.get(FIGURES[name]))}
                              for name, bound in sorted(cfg.study.constraints.items())}
    return out


def status_report(study: optuna.Study, cfg: SweeperConfig, study_file: str | None = None) -> dict[str, Any]:
    """``status --json``: counts by state, the best trial, the running trials (:func:`running`), the
    devices' last samples and the run folder's size; with stale running trials, what reaps them; with
    folds or seed repeats, the scheme, the fold layout and the fold, seed and epoch of each running trial."""
    trials = study.get_trials(deepcopy=False)
    counts = {s.name: sum(t.state == s for t in trials) for s in TrialState}
    fails = Counter(t.user_attrs.get("fail_reason", "unknown") for t in trials if t.state == TrialState.FAIL)
    folder = layout.run_dir(cfg)
    report: dict[str, Any] = {
        "study": cfg.study.name, "n_trials": cfg.study.n_trials,
        "finished": counts["COMPLETE"] + counts["PRUNED"], "counts": counts,
        "fail_reasons": dict(fails), "best": best_report(study, cfg, study_file=study_file),
        "last_failure": next(({"number": t.number, "error": t.user_attrs.get("error")}
                              for t in reversed(trials) if t.state == TrialState.FAIL), None),
        "running": running(study, trials, cfg.study.grace_period),
        "baseline_state": study.user_attrs.get("baseline_state"),
        "baseline_done": "baseline" in study.user_attrs,
        "devices": latest_telemetry(layout.devices_csv(folder)),
        "run_folder": {"path": str(folder), "bytes": retention.folder_size(folder)}}
    stale = [row["trial"] for row in report["running"] if row["stale"]]
    if stale:  # their driver or host died: the next sweep fails them as interrupted and retries them
        report.update(stale=stale, grace_period=cfg.study.grace_period,
                      reap=f"sweeper run {study_file or 'STUDY'}")
    # a study of one run per trial (holdout, one seed) has no folds or seeds to show: its status
    # stays as it was before either existed
    if not RunGrid.of(cfg).single:
        report.update({"validation": cfg.validation.model_dump(), "metric": cfg.study.metric,
                       K.FOLD_DATES: K.layout(study.user_attrs)})
        for row in report["running"]:  # with several runs the step runs on across folds and seeds
            row.update(run_position(row["epoch"], cfg, row["params"], row["stack_size"]))
    return report


def run_position(step: int | None, cfg: SweeperConfig, params: dict[str, Any],
                 stack: int | None = None) -> dict[str, int | None]:
    """Which fold, seed (both 1-based) and epoch a running trial is in, from its last intermediate step (the
    grid's position of it, in stacks of the trial's ``stack`` size); all None before its first epoch ends."""
    if step is None or step < 1 or (stack is None and cfg.train.max_stack == "auto"):
        return {"fold": None, "seed": None, "epoch": None}
    epochs = int(params.get("train.epochs", cfg.train.epochs))
    fold, seed, epoch = dataclasses.replace(RunGrid.of(cfg, stack), epochs=epochs).position(step)
    return {"fold": fold + 1, "seed": seed + 1, "epoch": epoch}


def running(study: optuna.Study, trials: list[FrozenTrial], grace: float) -> list[dict[str, Any]]:
    """The RUNNING trials, each with ``heartbeat_age_s`` (by the store's clock; None before its
    first beat) and ``stale``: no beat for longer than ``grace`` (``study.grace_period``), the rule by
    which a sweep fails another driver's trials (:func:`sweeper.dispatch.retries.fail_stale`)."""
    live = [t for t in trials if t.state == TrialState.RUNNING]
    ages = private.heartbeat_ages(private.backend(study), private.study_id(study)) if live else {}
    return [{"trial": t.number, "device": t.user_attrs.get("device"), "host": t.user_attrs.get("host"),
             "epoch": max(t.intermediate_values) if t.intermediate_values else None,
             "params": t.params, "stack_size": t.user_attrs.get("stack_size"),
             "heartbeat_age_s": (age := ages.get(private.trial_id(t))),
             "stale": age is not None and age > grace} for t in live]


def latest_telemetry(path: Path) -> list[dict[str, Any]]:
    """The last sample of each GPU in devices.csv."""
    if not path.exists():
        return []
    with path.open() as fh:  # a later row of a GPU replaces its earlier ones
        return list({row.get("uuid") or row.get("index", ""): row for row in csv.DictReader(fh)}.values())
