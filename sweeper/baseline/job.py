"""Running the baseline for a study: the panel through the data layer, the fit, the files of the run
folder's ``baseline/`` (:class:`sweeper.store.layout.BaselineFiles`) and two study user attributes:

- ``baseline``: the result (val/test IC, Rank IC and ICIR, the daily ICs of both splits, elapsed
  time, LightGBM version, rows, whether the train rows were subsampled, best iteration, ...;
  under walk-forward folds also the per-fold figures, :func:`fold_summary`);
- ``baseline_state``: its state, kept by :mod:`sweeper.baseline.state` (the states, the one claim
  rule a sweep follows, the transitions). ``sweeper baseline`` computes it whenever asked.

``python -m sweeper.baseline.job`` is the subprocess a sweep starts (with the threads of one
slot); a failure there is recorded as ``failed`` with its error and ends nothing else. Its exit
codes are :class:`sweeper.baseline.state.ExitCode`."""

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import optuna

from sweeper import child
from sweeper import config as C
from sweeper.atomic import atomic_path, write_text
from sweeper.baseline.fit import BaselineResult, fit_study
from sweeper.baseline.state import ExitCode, State, _now, mark
from sweeper.errors import one_line
from sweeper.plain import plain
from sweeper.quant.selection import fold_standard_error
from sweeper.store import layout
from sweeper.store.identity import Identity
from sweeper.validation import contract as K
from sweeper.validation.grid import RunGrid

RESULT = "baseline"  # the study user attribute of the result


def fold_summary(folds: list[dict[str, Any]], spans: list[dict[str, list[str]]]) -> dict[str, Any]:
    """The walk-forward keys of the ``baseline`` attribute, named as the trials' (each ``fold_*`` one
    entry per fold; the mean of ``fold_val_ic`` is ``val_ic``), the fold layout and ``folds`` (k)."""
    ic = [f["val_ic"] for f in folds]
    finite = [v for v in ic if math.isfinite(v)]
    return {"folds": len(folds), "fold_val_ic": plain(ic), "val_ic_se": plain(fold_standard_error(ic)),
            "worst_fold_val_ic": plain(min(finite)) if finite else None,
            "fold_val_rank_ic": plain([f["val_rank_ic"] for f in folds]),
            "fold_val_icir": plain([f["val_icir"] for f in folds]),
            "fold_best_iteration": [f["best_iteration"] for f in folds],
            "fold_rows": [f["rows"] for f in folds], "fold_subsampled": [f["subsampled"] for f in folds],
            "fold_elapsed_s": [round(f["elapsed_s"], 3) for f in folds], K.FOLD_DATES: spans}


def summary(result: BaselineResult, cfg: C.SweeperConfig, threads: int,
            spans: list[dict[str, list[str]]] | None = None) -> dict[str, Any]:
    """The ``baseline`` study attribute of ``result`` (``spans``: its walk-forward folds' dates)."""
    out: dict[str, Any] = {k: plain(v) for k, v in result.scores.items()}
    if result.folds is not None:
        out.update(fold_summary(result.folds, spans or []))
    out.update(elapsed_s=round(result.elapsed_s, 3), lightgbm_version=result.lightgbm_version,
               rows=result.rows, subsampled=result.subsampled, best_iteration=result.best_iteration,
               n_features=result.n_features, lags=cfg.baseline.lags, threads=threads,
               constant_predictions=[split for split, f in result.predictions.items()  # no tree split
                                     if len(f) and f.groupby("date")["pred"].nunique().eq(1).all()],
               params={k: v for k, v in result.params.items() if k != "num_threads"},
               num_boost_round=cfg.baseline.num_boost_round,
               early_stopping_rounds=cfg.baseline.early_stopping_rounds,
               # "fold": walk-forward folds' valid blocks, as the trials' daily_ic_valid.csv
               daily={split: {"date": [str(d)[:10] for d in f["date"]],
                              **{k: plain(f[k].tolist()) for k in ("ic", "rank_ic", "fold") if k in f}}
                      for split, f in result.daily.items()}, finished=_now())
    return out


def write_files(result: BaselineResult, run_dir: str | Path) -> layout.BaselineFiles:
    files = layout.baseline_files(run_dir)
    files.folder.mkdir(parents=True, exist_ok=True)
    for split, frame in result.predictions.items():  # each file whole or not at all (a full disk)
        with atomic_path(files.predictions(split)) as tmp:
            frame.to_parquet(tmp, index=False)
        with atomic_path(files.daily_ic(split)) as tmp:
            result.daily[split].to_csv(tmp, index=False)
    if result.train_rows is not None:
        with atomic_path(files.train_rows) as tmp:
            result.train_rows.to_parquet(tmp, index=False)
    write_text(files.model, result.model_text)
    return files


def compute(cfg: C.SweeperConfig, study: optuna.Study, threads: int, host: str, driver: str,
            run_dir: str | Path | None = None) -> dict[str, Any]:
    """Fit the baseline of ``study`` (its config ``cfg``), write its files and attributes; returns
    the ``baseline`` attribute. Raises what the fit raises, after recording ``failed`` (``interrupted`` on
    Ctrl-C or SIGTERM: no fault of the baseline's, so a later sweep computes it again)."""
    from sweeper.data import load_panel
    from sweeper.data.folds import fold_layout, fold_spans

    here = Identity.current()  # its pid: a later sweep on this host takes over a run whose process is gone
    mark(study, State.RUNNING, host, driver, pid=here.pid, pid_ns=here.pid_ns)  # claimed, or asked by name
    try:
        panel = load_panel(cfg.data)
        result = fit_study(panel, cfg, threads=threads, seed=cfg.study.sampler.seed or 0)
        dates = fold_spans(panel, fold_layout(panel, cfg)) if RunGrid.of(cfg).folded else None
        del panel
        write_files(result, run_dir if run_dir is not None else layout.run_dir(cfg))
        attr = summary(result, cfg, threads, dates)
        study.set_user_attr(RESULT, attr)
    except BaseException as exc:
        stopped = State.INTERRUPTED if isinstance(exc, KeyboardInterrupt) else State.FAILED
        mark(study, stopped, host, driver, error=f"{type(exc).__name__}: {exc}")
        raise
    mark(study, State.DONE, host, driver)
    return attr


def run_command(cfg: C.SweeperConfig, study: optuna.Study) -> dict[str, Any]:
    """``sweeper baseline STUDY``: compute the baseline now, whatever its state (asked for by name),
    with the threads of one slot while a sweep runs trials of the study (it shares the machine
    with them), of all slots otherwise."""
    from optuna.trial import TrialState

    from sweeper.data.load import still_the_data
    from sweeper.devices.slots import cpu_count, plan_slots
    from sweeper.errors import DataError, SweeperError

    if (data := still_the_data(cfg.data, study.user_attrs.get("data_fingerprint")))[1] is False:
        raise DataError(f"{data[0]}: the data changed since the study ran (its fingerprint), so a "
                        "baseline would train and score on other dates than the study's trials; restore it")
    try:
        slots = plan_slots(cfg.devices)
    except SweeperError:  # the study's GPUs are not here: the CPU is what the baseline needs
        slots = []
    sweeping = any(t.state == TrialState.RUNNING for t in study.get_trials(deepcopy=False))
    threads = (cpu_count() if not slots else slots[0].threads if sweeping
               else min(cpu_count(), sum(s.threads for s in slots)))
    ident = Identity.current()
    return compute(cfg, study, threads, ident.host, ident.driver_id)


def caveats(attr: dict[str, Any]) -> list[str]:
    """What to know before reading the baseline's figures: a subsampled train split, and a model that
    predicted one value on every date (its IC 0 is no model's)."""
    lines = []
    if sub := attr.get("subsampled"):
        by, folds = sub.get("by", "baseline.max_rows"), sub.get("folds")  # folds: each subsampled alone
        where = f" in fold{'s' if len(folds) > 1 else ''} {', '.join(map(str, folds))} (summed)" \
            if folds else ""
        lines.append(f"baseline: train rows subsampled by dates ({by}){where}: {sub['rows_kept']} of "
                     f"{sub['rows_total']} rows, {sub['dates_kept']} of {sub['dates_total']} dates")
    if constant := attr.get("constant_predictions"):
        lines.append(f"baseline: LightGBM predicted one value on every date of {' and '.join(constant)}, "
                     f"so its IC there is 0 and no model's: no tree split its {attr['rows']['train']} train "
                     "rows. Its regularisation (Qlib's lambda_l1 and lambda_l2) is sized for panels of "
                     "millions of rows; on a small one set baseline.params: {lambda_l1: 0, lambda_l2: 0}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """The sweep's baseline subprocess: its :class:`~sweeper.baseline.state.ExitCode` (done and
    failed recorded on the study by the job; the store away left to the sweep to record)."""
    parser = argparse.ArgumentParser(prog="python -m sweeper.baseline.job")
    parser.add_argument("--config", required=True,
                        help="the study's resolved config (a JSON file, - for stdin)")
    parser.add_argument("--storage", default=None, help="the study's storage (default: the config's)")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--host", default="")
    parser.add_argument("--driver", default="")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from sweeper.store import open_storage

    text = sys.stdin.read() if args.config == "-" else Path(args.config).read_text()
    cfg = C.validate_config(json.loads(text), args.config)
    try:
        storage = open_storage(args.storage or cfg.study.resolved_storage, create=False,
                               outage_s=cfg.study.storage_outage_s, checked=True)  # by its driver
        study = optuna.load_study(study_name=cfg.study.name, storage=storage)
    except Exception as exc:  # noqa: BLE001 - the store is away: a later sweep tries again
        print(f"baseline: the study's storage cannot be opened: {one_line(exc)}", file=sys.stderr, flush=True)
        return ExitCode.STORE_AWAY
    try:
        attr = compute(cfg, study, args.threads, args.host, args.driver, args.run_dir)
    except Exception as exc:  # noqa: BLE001 - recorded as failed on the study; the sweep goes on
        # one line, as every sweeper process says what went wrong (the log is read by people)
        print(f"baseline: failed: {one_line(exc)}", file=sys.stderr, flush=True)
        return ExitCode.FAILED
    for line in caveats(attr):
        print(line, file=sys.stderr, flush=True)
    folds = f" (val: the mean of {attr['folds']} folds, one booster each; test: the last fold's)" \
        if attr.get("folds") else ""
    print(f"baseline: val ic {attr.get('val_ic')} test ic {attr.get('test_ic')} "
          f"in {attr['elapsed_s']:.1f} s{folds}", flush=True)
    return ExitCode.DONE


if __name__ == "__main__":
    sys.exit(child.main(main))
