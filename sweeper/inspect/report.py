"""``sweeper report``: one self-contained HTML page about a study.

The plotly figures, built with ``plotly.graph_objects`` from one read of the study (optuna.visualization
re-reads the trials per plot and draws one trace per trial, which is far too slow at 500 trials), are those of
``SECTIONS``, in its order. Each figure's module is in the package map (:mod:`sweeper.inspect`). This module
loads the study and lays out the page.

plotly.js is inlined once, so the file works offline. Each figure's JSON sits in its own
``<script type="application/json" id="fig-NAME">`` tag; machine-readable figures (counts, utilisation, the
selection summary) are in its ``layout.meta``."""

import html
import time
from pathlib import Path
from typing import Any

import optuna
import plotly.graph_objects as go
from optuna.trial import TrialState

from sweeper.atomic import write_text
from sweeper.config import SweeperConfig, objective_label
from sweeper.errors import SweeperError
from sweeper.inspect.figures_base import StudyData, finite
from sweeper.inspect.figures_devices import telemetry_figure, timeline_figure, utilisation
from sweeper.inspect.figures_ic import (
    baseline_figure,
    daily_figure,
    folds_figure,
    overfit_figure,
    selection_figure,
)
from sweeper.inspect.figures_portfolio import buckets_figure, longshort_figure
from sweeper.inspect.figures_search import curves_figure, history_figure, importance_figure, parallel_figure
from sweeper.inspect.figures_time import ic_time_figure
from sweeper.inspect.printing import ic_time_lines, portfolio_lines, selection_lines
from sweeper.inspect.results import study_oracle, trial_horizons, valid_daily_ics
from sweeper.store import layout
from sweeper.store.run_folder import files_folder
from sweeper.store.studies import best_trial, load_existing
from sweeper.study.open import as_run

__all__ = ["FIGURES", "SECTIONS", "StudyData", "build_figures", "load", "render_html", "utilisation",
           "write_report"]

# name: (heading, figure); "folds" only under walk-forward folds, and "telemetry" (5b) with devices.csv
SECTIONS = {
    "history": ("1. Optimization history", history_figure),
    "importance": ("2. Parameter importances", importance_figure),
    "parallel": ("3. Parallel coordinates", parallel_figure),
    "curves": ("4. Learning curves (intermediate values)", curves_figure),
    "timeline": ("5. Trials per device", timeline_figure),
    "overfit": ("6. Validation IC vs test IC", overfit_figure),
    "daily": ("7. Best trial: daily and cumulative IC", daily_figure),
    "selection": ("8. Selection bias", selection_figure),
    "buckets": ("9. Best trial: mean label per prediction bucket", buckets_figure),
    "longshort": ("10. Best trial: cumulative long-short return", longshort_figure),
    "ic_time": ("11. IC through time: mean daily IC by year and month", ic_time_figure),
    "baseline": ("12. Best trial against the LightGBM baseline: cumulative daily IC", baseline_figure),
    "folds": ("13. Walk-forward: validation IC per fold of the top trials", folds_figure)}
FIGURES = tuple(name for name in SECTIONS if name != "folds")


def load(study: optuna.Study, run_dir: str | Path, metric: str,
         cfg: SweeperConfig | None = None) -> StudyData:
    """The study read once. With ``cfg``: the trials' label horizons and the best trial's
    long-short view and group-neutral IC, from one read of its frames (which runs its model on the
    study's data only where it stored no predictions)."""
    trials = study.get_trials(deepcopy=False)
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    objective = metric if cfg is None else objective_label(metric, cfg.validation)  # what a value is
    data = StudyData(name=study.study_name, metric=objective, maximize=maximize, trials=trials,
                     run_dir=Path(run_dir), study=study, best=best_trial(study), epoch_metric=metric,
                     daily_valid=valid_daily_ics(trials, run_dir),
                     horizons=1 if cfg is None else trial_horizons(trials, cfg))
    if cfg is not None and data.best is not None:
        from sweeper.inspect.frames import TrialFrames
        from sweeper.inspect.ic_views import group_neutral_report
        from sweeper.inspect.longshort import best_long_short

        frames = TrialFrames(cfg, study)
        try:
            data.long_short = best_long_short(cfg, frames, data.best)
        except SweeperError as exc:
            data.long_short_note = str(exc)
        data.group_neutral = group_neutral_report(cfg, frames, data.best)  # {} without data.group_col
    return data


def build_figures(data: StudyData) -> dict[str, go.Figure]:
    """The figures, by name (see FIGURES); ``folds`` too under walk-forward folds, and ``telemetry``
    when devices.csv exists."""
    # "folds" under walk-forward folds only: a study of one fold has its page as it was
    figures = {name: figure(data) for name, (_, figure) in SECTIONS.items() if name != "folds" or data.folded}
    if (telemetry := telemetry_figure(layout.devices_csv(data.run_dir))) is not None:
        figures["telemetry"] = telemetry
    return figures


def write_report(cfg: SweeperConfig, out: str | Path, storage_url: str | None = None) -> dict[str, Any]:
    """Write the report for ``cfg``'s study to ``out`` (atomically); returns a summary."""
    started = time.perf_counter()
    study = load_existing(cfg, storage_url)
    cfg = as_run(cfg, study)  # a study file edited since: the study's values as what they are
    data = load(study, files_folder(cfg, study), cfg.study.metric, cfg)
    figures = build_figures(data)
    write_text(Path(out), render_html(data, figures, oracle=study_oracle(study.user_attrs)))
    return {"path": str(out), "trials": len(data.trials), "figures": list(figures),
            "seconds": time.perf_counter() - started}


def render_html(data: StudyData, figures: dict[str, go.Figure],
                oracle: dict[str, float] | None = None) -> str:
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    sections = []
    for name, fig in figures.items():
        payload = pio.to_json(fig, validate=False).replace("</", "<\\/")
        heading = SECTIONS[name][0] if name in SECTIONS else "5b. GPU telemetry"
        notes = "".join(f"<p>{html.escape(line)}</p>" for line in _notes(name, fig))
        sections.append(f'<section><h2>{heading}</h2>{notes}<div id="plot-{name}" class="plot"></div>'
                        f'<script type="application/json" id="fig-{name}" class="fig">{payload}</script>'
                        '</section>')
    return _PAGE.format(title=html.escape(f"sweeper report: {data.name}"), plotlyjs=get_plotlyjs(),
                        header="".join(f"<p>{html.escape(line)}</p>" for line in _header(data, oracle)),
                        sections="\n".join(sections))


def _header(data: StudyData, oracle: dict[str, float] | None) -> list[str]:
    counts = {s.name.lower(): sum(t.state == s for t in data.trials) for s in TrialState}
    lines = [f"{len(data.trials)} trials: " + ", ".join(f"{k} {v}" for k, v in counts.items() if v),
             f"generated {data.now:%Y-%m-%d %H:%M:%S} from {data.run_dir}"]
    if data.best is not None:
        ua = data.best.user_attrs
        line = f"best: trial {data.best.number}, {data.metric} {data.best.value:.4f}"
        for split, key in (("valid", "val_ic"), ("test", "test_ic")):
            if finite(ua.get(key)):
                mean = " (mean over folds)" if key == "val_ic" and data.folded else ""
                line += f", {split} IC {ua[key]:.4f}{mean}"
                if oracle and oracle.get(split):
                    line += f" ({ua[key] / oracle[split]:.0%} of the oracle {oracle[split]:.4f})"
        folds = [v for v in ua.get("fold_val_ic") or [] if finite(v)]
        if data.folded and folds:  # the valid IC above is their mean
            se = f" (se {ua['val_ic_se']:.4f})" if finite(ua.get("val_ic_se")) else ""
            line += f"; valid IC per fold {', '.join(f'{v:.4f}' for v in folds)}{se}"
        lines.append(line)
    return lines


def _notes(name: str, fig: go.Figure) -> list[str]:
    meta = fig.layout.meta or {}
    if name == "timeline" and "utilisation" in meta:
        return _utilisation_notes(meta["utilisation"])
    if name == "selection" and "selection" in meta:
        return [line.strip() for line in selection_lines(meta["selection"])] + [
            "Walk-forward: each trial's standard error is std(fold val IC, ddof=1) / sqrt(folds), the "
            "spread of its score from one period to the next; the no-signal best is the trials' median of "
            "it times the expected maximum of N standard normals; best = the mean of the best trial's fold "
            "ICs; deflated IC = best - no-signal best. P(fluke) = 1 - the Deflated Sharpe Ratio of the best "
            "trial's daily ICs over its folds' valid blocks; PBO (CSCV) on the trials' daily ICs with its "
            "blocks cut along the folds, so that no block mixes two folds' models."
            if meta["selection"].get("se_from") == "folds" else
            "The no-signal best is the median standard error of the trials' mean daily IC times the "
            "expected maximum of N standard normals (Bailey & Lopez de Prado); deflated IC = best - that. "
            "P(fluke) = 1 - the Deflated Sharpe Ratio of the best trial's daily ICs; PBO = probability of "
            "backtest overfitting (CSCV). Standard errors are Newey-West with lag horizon - 1: an h-day "
            "label makes neighbouring daily ICs overlap."]
    if name == "folds" and "trials" in meta:
        return ["Each line: one of the best trials by objective, its validation IC on each fold's valid "
                "block (x: the block's first and last target date), each fold trained on the dates before "
                "its block. A winner that is high on one fold only is luck of the period; test IC is the "
                "last fold's model."]
    if name == "ic_time" and "months" in meta:
        return ic_time_lines(meta) + [
            "Each cell: the mean of the daily IC (per-date Pearson of prediction and label) over that "
            "month's dates. Group-neutral IC: prediction and label demeaned within each group per date "
            "first, so betting on whole groups scores 0."]
    if name == "buckets" and "valid" in meta:
        splits = {k: meta[k] for k in ("valid", "test") if k in meta}
        return [line.strip() for line in portfolio_lines(splits, scope=meta["scored_on"]["valid"])] + [
            "Dates: those with at least 2q assets, every h-th of them, so the h-day labels do not overlap. "
            "Buckets: q equal-count buckets of the prediction's rank. Long-short = mean label of the top "
            "bucket - mean label of the bottom one; annualised with 252/h. Gross: equal weights, no costs."]
    return []


def _utilisation_notes(use: dict[str, Any]) -> list[str]:
    if use["fraction"] is None:
        return []
    per = ", ".join(f"{k} {v:.0%}" for k, v in use["per_slot"].items() if v is not None)
    runs = f" in {use['runs']} runs" if use["runs"] > 1 else ""
    return [f"Utilisation {use['fraction']:.1%}: busy {use['busy_s']:.0f} s of {use['capacity_s']:.0f} "
            f"slot-seconds ({use['slots']} slots x {use['span_s']:.0f} s of wall time{runs}; the time "
            f"between runs is left out). Per slot: {per}."]


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; color: #222; }}
h1 {{ font-size: 1.5em; }} h2 {{ font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ddd; }}
p {{ margin: 0.3em 0; }} .plot {{ width: 100%; }}
</style>
<script type="text/javascript">{plotlyjs}</script>
</head><body>
<h1>{title}</h1>
{header}
{sections}
<script type="text/javascript">
document.querySelectorAll("script.fig").forEach(function (node) {{
  var fig = JSON.parse(node.textContent);
  Plotly.newPlot("plot-" + node.id.slice(4), fig.data, fig.layout, {{responsive: true, displaylogo: false}});
}});
</script>
</body></html>"""
