"""The printed summaries of ``sweeper status`` and ``sweeper best`` (rich, on stdout),
and the selection-bias lines that the report shows too."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from sweeper.baseline.compare import state_words
from sweeper.validation import contract as K

if TYPE_CHECKING:
    from rich.console import Console

    from sweeper.config import DataConfig
    from sweeper.study.summary import PanelSummary


def fmt(value: object, spec: str = ".4f") -> str:
    """``value`` formatted with ``spec``; ``-`` for None and non-finite floats."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)  # True is no "1.0000"
    return format(value, spec) if numeric else str(value)


def print_status(report: dict[str, Any]) -> None:
    from rich.console import Console

    console = Console()
    counts = ", ".join(f"{k.lower()} {v}" for k, v in report["counts"].items() if v)
    console.print(f"study {report['study']!r}: {report['finished']}/{report['n_trials']} finished "
                  f"({counts or 'no trials'})")
    if folder := report.get("run_folder"):
        from sweeper.study.retention import human_bytes

        console.print(f"run folder {folder['path']}: {human_bytes(folder['bytes'])}", highlight=False,
                      soft_wrap=True)
    console.print("baseline: " + state_words(report.get("baseline_state"),
                                             {} if report.get("baseline_done") else None),
                  highlight=False, soft_wrap=True)
    if report["fail_reasons"]:
        last = report["last_failure"]
        console.print("failed: " + ", ".join(f"{k} {v}" for k, v in report["fail_reasons"].items())
                      + f"; the last, trial {last['number']}: {(last['error'] or '-').splitlines()[0]}",
                      highlight=False, soft_wrap=True)
    if "validation" in report:
        console.print(validation_line(report["validation"], report.get("metric", "the metric"),
                                      K.folded(report)), highlight=False, soft_wrap=True)
        for k, dates in enumerate(K.layout(report), 1):
            console.print("  " + fold_line(k, dates), highlight=False)
    if report["best"]:
        print_best(report["best"], console, scheme="validation" not in report)
    if report["running"]:
        console.print(_running_table(report["running"], folds="validation" in report))
    if report.get("stale"):  # the RUNNING trials whose heartbeat stopped: how long ago, what reaps them
        ages = {r["trial"]: r.get("heartbeat_age_s") or 0.0 for r in report["running"]}
        which = ", ".join(f"trial {n} (no heartbeat for {duration(ages.get(n, 0.0))})"
                          for n in report["stale"])
        console.print(f"stale: {which}, longer than study.grace_period ({report['grace_period']} s): its "
                      f"driver or host is gone. `{report['reap']}` fails such a trial as interrupted and "
                      "runs it again", highlight=False, soft_wrap=True)
    for d in report["devices"]:
        console.print(f"GPU {d.get('index')} {d.get('uuid', '')}: util {d.get('util')}% "
                      f"mem {d.get('mem_used_mb')}/{d.get('mem_total_mb')} MB, {d.get('n_procs')} processes")


def _running_table(running: list[dict[str, Any]], folds: bool) -> Any:
    from rich.table import Table

    table = Table("trial", "host", "device", *(("fold", "seed") if folds else ()), "epoch", "heartbeat",
                  title="running")
    for r in running:
        at = (fmt(r.get("fold"), "d"), fmt(r.get("seed"), "d")) if folds else ()
        age = r.get("heartbeat_age_s")
        beat = "-" if age is None else f"STALE {duration(age)}" if r.get("stale") else f"{duration(age)} ago"
        table.add_row(str(r["trial"]), str(r["host"]), str(r["device"]), *at, fmt(r["epoch"], "d"), beat)
    return table


def duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 \
        else f"{seconds / 3600:.1f} h"


def print_best(best: dict[str, Any], console: Console | None = None, scheme: bool = True) -> None:
    """The best trial in words; ``scheme=False`` leaves out the validation line (status prints it)."""
    from rich.console import Console

    console = console or Console()
    objective = best.get("objective", best["metric"])  # lcb(val_ic) under validation.aggregate: lcb
    console.print(f"best: trial {best['trial']}  {objective}={fmt(best['value'])}")
    lines = metric_lines(best)
    for split, key in (("valid", "val"), ("test", "test")):
        oracle, frac = best.get(f"oracle_{key}_ic"), best.get(f"{key}_ic_oracle_fraction")
        if oracle:
            lines.append(f"oracle {split} IC {oracle:.4f}{'' if frac is None else f': {frac:.0%} reached'}")
    lines += fold_lines(best)[0 if scheme else 1:]
    stacked = best.get("stack_size_from") not in (None, "one run per trial") or "precision_rates" in best
    lines += [stack_line(best)] if stacked else []
    if shared := best.get("population"):
        lines.append(f"trained as one stack with trials {', '.join(map(str, shared))} (study.population)")
    lines += [constraints_line(best)] if "constraints" in best or best.get("infeasible") else []
    lines += selection_lines(best.get("selection")) + baseline_lines(best.get("baseline"),
                                                                     best.get("baseline_state"))
    lines += ic_time_lines(best)
    if "portfolio" in best:  # best --portfolio: the long-short view, constant predictions, the top-K ensemble
        lines += portfolio_lines(best["portfolio"], best.get("portfolio_unavailable"),
                                 _scope(best, "portfolio"))
        if any((constant := best.get("constant_pred_dates") or {}).values()):
            lines.append("constant predictions (scored IC 0): " + ", ".join(
                f"{split} {n} dates" for split, n in constant.items()))
    if "ensemble" in best:
        lines += ensemble_lines(best["ensemble"], best.get("ensemble_unavailable"), _scope(best, "ensemble"))
    # 4 significant digits: a sampled lr's 17 digits say nothing (best --json keeps them all)
    lines.append("params: " + ", ".join(f"{k}={fmt(v, '.4g') if isinstance(v, float) else v}"
                                        for k, v in best["params"].items()))
    removed = best.get("weights_removed") and f"gone (study.keep, gc, or by hand); retrain: {best['retrain']}"
    for line in [*lines, f"weights: {removed or best['weights'] or '-'}"]:
        console.print("  " + line, highlight=False, soft_wrap=True)


def metric_lines(best: dict[str, Any]) -> list[str]:
    """The best trial's valid and test IC; under walk-forward the valid figures say their dates
    (the mean over every fold's block: not the dates of the long-short view and the ensemble)."""
    m, said = best["metrics"], scope_words(_scope(best, "metrics"))
    return [f"{label} ic {fmt(m.get(f'{key}_ic'))}  rank_ic {fmt(m.get(f'{key}_rank_ic'))}  "
            f"icir {fmt(m.get(f'{key}_icir'))}" + (f"  ({said})" if said and key == "val" else "")
            for label, key in (("valid:", "val"), ("test: ", "test"))]


def _scope(best: dict[str, Any], block: str) -> dict[str, Any] | None:
    return ((best.get("scored_on") or {}).get(block) or {}).get("valid")


def scope_words(scope: dict[str, Any] | None) -> str:
    """The dates of a valid figure (a ``scored_on`` entry) in words where they are not the valid
    split's, which needs no label: under walk-forward, every fold's block or the last fold's."""
    if not scope or scope.get("over") not in ("all folds", "last fold"):
        return ""
    every = scope["over"] == "all folds"
    what = "mean over every fold's valid block" if every else "the last fold's valid block"
    return f"{what}, {' to '.join(scope.get('dates') or []) or 'dates -'}"


def stack_line(best: dict[str, Any]) -> str:
    """How the trial's runs stacked: the size, where it came from, the rates it was measured at."""
    rates = best.get("stack_rates") or {}  # None: that size did not fit
    shown = ", ".join(f"{k}: {'no room' if v is None else f'{v:.0f}'}" for k, v in rates.items())
    measured = f"; member-samples/s by stack size {shown}" if shown else ""
    line = f"runs stacked by {best['stack_size']} ({best['stack_size_from']}{measured})"
    if prec := best.get("precision_rates"):  # train.precision: auto, measured on this CPU
        chosen = best.get("precision") or best["metrics"]["precision"]  # a choice's, or best's report's
        line += f"; precision {chosen} (samples/s {', '.join(f'{k} {v:.0f}' for k, v in prec.items())})"
    return line


def validation_line(validation: dict[str, Any], metric: str, walk: bool) -> str:
    """The validation scheme and how the objective aggregates it, in words (``walk``: the study
    has walk-forward folds, :func:`~sweeper.validation.contract.folded`)."""
    parts = [f"{validation['folds']} folds ({validation['window']} window)"] if walk else []
    parts += [f"{validation['repeats']} seed repeats"] if validation["repeats"] > 1 else []
    over = "folds" if walk else "seeds"
    ensemble = "each fold's seed ensemble, mean over folds" if walk else "the seed ensemble"
    how = {"lcb": f"mean - 1 se over {over}", "ensemble": ensemble}.get(validation["aggregate"],
                                                                        f"mean over {over}")
    return f"validation: {validation['scheme']}, {', '.join(parts)}; objective = {how} of {metric}"


def fold_line(k: int, dates: dict[str, list[str]] | None, score: object = None, metric: str = "") -> str:
    """One fold's date ranges (1-based ``k``), with its score when given."""
    ranges = (f"train {' to '.join(dates['train'])}, valid {' to '.join(dates['valid'])}"
              if dates else "dates -")
    return f"fold {k}: {metric} {fmt(score)}  ({ranges})" if metric else f"fold {k}: {ranges}"


def fold_lines(best: dict[str, Any]) -> list[str]:
    """The best trial's folds and seeds (``sweeper best`` and ``status``): the scheme, each
    fold's val IC and dates, their mean, se and worst, the seeds' spread, and which model
    scores test; nothing for a study of one run per trial."""
    if "validation" not in best:
        return []
    walk = K.folded(best)
    lines = [validation_line(best["validation"], best["metric"], walk)]
    folds, dates = best.get(K.FOLD_VAL_IC) or [], K.layout(best)
    if walk:
        lines += [fold_line(k, dates[k - 1] if k <= len(dates) else None, v, "val_ic")
                  for k, v in enumerate(folds, 1)]
    finite = [(v, k) for k, v in enumerate(folds, 1) if isinstance(v, (int, float))]
    worst = f"  worst {fmt(min(finite)[0])} (fold {min(finite)[1]})" if walk and finite else ""
    over = f"{len(folds)} folds" if walk else f"{best['validation']['repeats']} seeds"
    lines.append(f"val_ic over {over}: mean {fmt(best['metrics'].get('val_ic'))}  "
                 f"se {fmt(best.get('val_ic_se'))}{worst}")
    if (metric := best["metric"]) != "val_ic" and f"fold_{metric}" in best:  # the objective's own folds
        lines.append(f"{metric} per fold: " + ", ".join(fmt(v) for v in best[f"fold_{metric}"])
                     + f"  se {fmt(best.get(f'{metric}_se'))}")
    if "seed_val_ic_sd" in best or "seed_ensemble_val_ic" in best:
        lines.append(f"seeds: val_ic sd {fmt(best.get('seed_val_ic_sd'))} within a fold, "
                     f"seed-ensemble val_ic {fmt(best.get('seed_ensemble_val_ic'))}")
    model = best.get("test_model") or {}
    members, first = int(model.get("members") or 1), int(model.get("seed") or 0)
    seed, fold = f"seed {model.get('repeat')} = train.seed {model.get('seed')}", f"fold {model.get('fold')}"
    # members > 1: the model is the seed ensemble (a study stored before has no members key)
    lines.append(f"test IC: the seed ensemble of {members} seeds (train.seed {first}..{first + members - 1}"
                 + (f", {fold})" if walk else ")") if members > 1
                 else f"test IC: the last fold's model ({fold}, {seed})" if walk
                 else f"test IC: the first seed's model ({seed})")
    return lines


def split_lines(panel: PanelSummary, data: DataConfig) -> list[str]:
    """``validate``'s lines on the study's split, under every scheme: the features, the purge, and
    each split's (or walk-forward fold's) target dates with how many there are."""
    from sweeper.data.split import purge_gap, split_widths

    lookback, horizon, embargo = split_widths(data)  # the widest the search space allows

    def span(dates: list[str], count: int | None) -> str:
        return f"{' to '.join(dates) or '-'} ({fmt(count, 'd')} dates)"
    names = ", ".join(panel.features[:8]) + (f", ... ({len(panel.features) - 8} more)"
                                             if len(panel.features) > 8 else "")
    lines = [f"features: {len(panel.features)} ({names})",
             f"purge: {purge_gap(horizon, embargo)} dates dropped before each valid block and before test "
             f"(horizon {horizon} + embargo {embargo}: no label reaches into the next split); "
             f"lookback {lookback}"]
    counts = panel.fold_n_dates or [{}] * len(panel.folds)
    lines += [f"fold {k}: train {span(f['train'], n.get('train'))}, valid {span(f['valid'], n.get('valid'))}"
              for k, (f, n) in enumerate(zip(panel.folds, counts), 1)]
    splits = ("test",) if panel.folds else ("train", "valid", "test")
    return lines + [f"{s}: {span(panel.split_dates.get(s, []), panel.n_dates.get(s))}" for s in splits]


def constraints_line(best: dict[str, Any]) -> str:
    """``study.constraints`` in words: each bound with the best trial's valid figure, and how
    many COMPLETE trials were left out as infeasible."""
    bounds = []
    for name, bound in (best.get("constraints") or {}).items():
        low = f"{bound['min']:g} <= " if "min" in bound else ""
        high = f" <= {bound['max']:g}" if "max" in bound else ""
        bounds.append(f"{low}{name}{high} (best {fmt(bound.get('best'))})")
    return (f"constraints (valid split): {', '.join(bounds) or '-'}; infeasible: {best.get('infeasible', 0)} "
            "completed trials, not ranked")


def selection_lines(sel: dict[str, Any] | None) -> list[str]:
    """The selection-bias figures in words (``sweeper best``, ``status`` and the report)."""
    if not sel:
        return ["selection bias: - (the best trial has no daily IC file)"]
    lines = [f"selection bias over {sel['n_trials']} trials: no-signal best val IC "
             f"{fmt(sel.get('expected_max_null_ic'))}",
             f"  deflated val IC {fmt(sel.get('deflated_ic'))}  P(fluke) {fmt(sel.get('p_fluke'), '.1%')}  "
             f"PBO {fmt(sel.get('pbo'), '.2f')}"]
    if unread := sel.get("trials_without_files"):
        lines.append(f"  {unread} more finished trials have no daily IC file (study.keep): "
                     "the bias is understated")
    if sel.get("se_from") == "folds":
        blocks = "the folds" if sel.get("pbo_blocks") == "folds" else "the dates"
        lines.append(f"  standard errors from the fold ICs (best: se {fmt(sel.get('best_val_ic_se'))} over "
                     f"{sel.get('n_folds')} folds); PBO's blocks cut along {blocks}")
    return lines


def ic_time_lines(best: dict[str, Any]) -> list[str]:
    """The best trial's mean daily IC per year (one line per split) and, with
    ``data.group_col``, its group-neutral IC (``sweeper best`` and the report)."""
    lines = [f"{split} IC by year: " + ", ".join(f"{year} {fmt(v)}" for year, v in years.items())
             for split, years in (best.get("ic_by_year") or {}).items() if years]
    if "group_neutral" in best:
        if (neutral := best["group_neutral"]) is None:
            lines.append(f"group-neutral IC: - ({best.get('group_neutral_unavailable')})")
        else:
            where = {"valid": f" ({w})" if (w := scope_words(_scope(best, "group_neutral"))) else ""}
            splits = "  ".join(f"{split}{where.get(split, '')} ic {fmt(v.get('ic'))} "
                               f"rank_ic {fmt(v.get('rank_ic'))}" for split, v in neutral.items())
            lines.append(f"group-neutral IC (demeaned within {best.get('group_col')} per date): {splits}")
    return lines


def baseline_lines(base: dict[str, Any] | None, state: dict[str, Any] | None = None) -> list[str]:
    """The best trial against the LightGBM baseline (``sweeper best`` and ``status``)."""
    if not base:
        return [f"baseline: - ({state_words(state, None)})"]
    lines = [f"baseline LightGBM: valid ic {fmt(base.get('val_ic'))}  test ic {fmt(base.get('test_ic'))}  "
             f"(best iteration {base.get('best_iteration')}, {fmt(base.get('elapsed_s'), '.1f')} s, "
             f"LightGBM {base.get('lightgbm_version')})",
             f"  best - baseline: valid {fmt(base.get('val_ic_diff'), '+.4f')} "
             f"(t {fmt(base.get('val_t_stat'), '.2f')})  test {fmt(base.get('test_ic_diff'), '+.4f')} "
             f"(t {fmt(base.get('test_t_stat'), '.2f')}), "
             f"Newey-West lag {base.get('nw_lag')} on the shared dates"]
    if base.get("fold_val_ic"):  # walk-forward: one booster per fold, on the trial's folds
        diff = base.get("fold_val_ic_diff") or []
        lines.append("  baseline val_ic per fold: " + ", ".join(fmt(v) for v in base["fold_val_ic"])
                     + "; best - baseline per fold: " + (", ".join(fmt(v, "+.4f") for v in diff) or "-"))
    if sub := base.get("subsampled"):
        lines.append(f"  baseline train rows subsampled by dates ({sub.get('by', 'baseline.max_rows')}): "
                     f"{sub['rows_kept']} of {sub['rows_total']}")
    if constant := base.get("constant_predictions"):  # sweeper baseline says why and what to set
        lines.append(f"  baseline: one value a date on {' and '.join(constant)} (no tree split): no model IC")
    return lines


def portfolio_lines(portfolio: dict[str, Any] | None, why: str | None = None,
                    scope: dict[str, Any] | None = None) -> list[str]:
    """The long-short figures of valid and test in words (``sweeper best`` and the report);
    ``scope``: the dates of the valid figures (a ``scored_on`` entry), said where they differ."""
    if not portfolio:
        return [f"long-short: - ({why or 'not computed'})"]
    first = next(iter(portfolio.values()))
    apart = max(first.get("horizon") or 1, 1)
    said = scope_words(scope)
    return [f"long-short, q={first.get('quantiles')} buckets, dates {apart} apart "
            "(gross: equal weights, no costs)" + (f"; valid: {said}:" if said else ":")] + [
        f"  {split + ':':<6} ann. return {fmt(p.get('long_short_ann_return'), '.1%')}  "
        f"Sharpe {fmt(p.get('long_short_sharpe'), '.2f')}  "
        f"max drawdown {fmt(p.get('long_short_max_drawdown'), '.1%')}  "
        f"top turnover {fmt(p.get('top_turnover'), '.0%')}  ({p.get('n_periods')} periods)"
        for split, p in portfolio.items()]


def ensemble_lines(ens: dict[str, Any] | None, why: str | None = None,
                   scope: dict[str, Any] | None = None) -> list[str]:
    """The top-K ensemble beside the best trial, and its best member alone on the same dates
    (``scope``: those of the valid figures, said where they are not the valid split's)."""
    if not ens:
        return [f"ensemble: - ({why or 'not computed'})"]
    lines = [f"top{ens['k']} ensemble (trials {', '.join(map(str, ens['trials']))}): {_ic_pair(ens)}"]
    said, alone = scope_words(scope), ens.get("alone")
    lines += [f"  valid dates: {said}"] if said else []
    # the ensemble's own long-short lines, under it (after its best member's line they read as the member's)
    lines += ["  " + line for line in portfolio_lines(ens.get("portfolio"))[1:]]
    if alone:  # a best --json from before has none
        lines.append(f"  trial {alone['trial']} alone on the same dates: {_ic_pair(alone)}")
    return lines


def _ic_pair(ics: dict[str, Any]) -> str:
    return (f"valid ic {fmt(ics['valid'].get('ic'))}  rank_ic {fmt(ics['valid'].get('rank_ic'))}  "
            f"test ic {fmt(ics['test'].get('ic'))}  rank_ic {fmt(ics['test'].get('rank_ic'))}")
