"""What the driver shows while it runs: a rich live view on a terminal, plain
log lines otherwise, nothing in library use. The driver calls the same
methods on each (null-object style), so it has no branches for output.
"""
from __future__ import annotations

import math
import sys
import time
from typing import Any

from optuna.trial import TrialState

from sweeper.results import oracle_fractions


def _fmt(value: Any, spec: str = ".4f") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec) if isinstance(value, (int, float)) else str(value)


def summary_lines(outcome: Any, cfg: Any, plan: Any) -> list[str]:
    counts = ", ".join(f"{k.lower()} {v}" for k, v in outcome.counts.items() if v)
    lines = [f"trials: {counts or 'none'}"]
    best = outcome.best
    if best is not None:
        ua = best.user_attrs
        line = f"best: trial {best.number}  {cfg.study.metric}={_fmt(best.value)}"
        line += "" if cfg.study.metric == "val_ic" else f"  val_ic={_fmt(ua.get('val_ic'))}"
        line += f"  test_ic={_fmt(ua.get('test_ic'))}"
        frac = oracle_fractions(ua, plan.oracle_ic).get("test_ic_oracle_fraction")
        if frac is not None:
            line += f"  ({frac:.0%} of the oracle test IC {plan.oracle_ic['test']:.4f})"
        lines.append(line)
    if outcome.message:
        lines.append(outcome.message)
    study_file = getattr(plan, "study_file", "STUDY.yaml")
    if outcome.interrupted:
        lines.append(f"interrupted: running trials were checkpointed. Resume with: sweeper resume {study_file}")
    lines.append(f"next: sweeper best {study_file} | sweeper report {study_file} -o report.html | "
                 f"sweeper dashboard {study_file}")
    return lines


def start_lines(cfg: Any, plan: Any, study: Any) -> list[str]:
    from sweeper.store import redact

    done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))
    study_file = getattr(plan, "study_file", "STUDY.yaml")
    return [
        f"study {cfg.study.name!r}: {done}/{cfg.study.n_trials} finished, optimising {cfg.study.metric} "
        f"({cfg.study.resolved_direction})",
        f"storage: {redact(plan.storage_url)}",
        f"data: {plan.source}",
        "slots: " + ", ".join(s.label for s in plan.slots),
        f"dashboard: sweeper dashboard {study_file}",
    ]


class NullView:
    def start(self, cfg: Any, plan: Any, study: Any) -> None: ...
    def trial_started(self, slot: Any, number: int, params: dict[str, Any]) -> None: ...
    def epoch(self, slot: Any, number: int, epoch: int, metrics: dict[str, Any]) -> None: ...
    def trial_ended(self, slot: Any, number: int, state: str, value: Any, reason: Any) -> None: ...
    def tick(self, driver: Any) -> None: ...
    def close(self, outcome: Any, cfg: Any, plan: Any) -> None: ...


class PlainView(NullView):
    """One line per event, for logs and pipes."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stdout
        self.metric = "val_ic"

    def _say(self, line: str) -> None:
        self.stream.write(f"[{time.strftime('%H:%M:%S')}] {line}\n")
        self.stream.flush()

    def start(self, cfg: Any, plan: Any, study: Any) -> None:
        self.metric = cfg.study.metric
        for line in start_lines(cfg, plan, study):
            self._say(line)

    def trial_started(self, slot: Any, number: int, params: dict[str, Any]) -> None:
        shown = " ".join(f"{k}={_fmt(v, '.4g')}" for k, v in params.items())
        self._say(f"trial {number} started on {slot.label}: {shown}")

    def epoch(self, slot: Any, number: int, epoch: int, metrics: dict[str, Any]) -> None:
        self._say(f"trial {number} epoch {epoch}: {self.metric}={_fmt(metrics.get(self.metric))} "
                  f"loss={_fmt(metrics.get('train_loss'))} mb={metrics.get('micro_batch_size', '-')}")

    def trial_ended(self, slot: Any, number: int, state: str, value: Any, reason: Any) -> None:
        tail = f" ({reason})" if reason else ""
        self._say(f"trial {number} {state.lower()}{tail}: {self.metric}={_fmt(value)}")

    def close(self, outcome: Any, cfg: Any, plan: Any) -> None:
        for line in summary_lines(outcome, cfg, plan):
            self._say(line)


class RichView(PlainView):
    """A live panel: overall progress with ETA, the best so far, one line per slot."""

    def __init__(self) -> None:
        super().__init__()
        from rich.console import Console

        self.console = Console()
        self.live: Any = None
        self.last = 0.0

    def _say(self, line: str) -> None:
        self.console.print(line, highlight=False)

    def start(self, cfg: Any, plan: Any, study: Any) -> None:
        from rich.live import Live

        super().start(cfg, plan, study)
        self.started = time.monotonic()
        self.done0 = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))
        self.live = Live(console=self.console, refresh_per_second=4, transient=True)
        self.live.start()

    def trial_started(self, slot: Any, number: int, params: dict[str, Any]) -> None: ...
    def epoch(self, slot: Any, number: int, epoch: int, metrics: dict[str, Any]) -> None: ...

    def tick(self, driver: Any) -> None:
        now = time.monotonic()
        if self.live is None or now - self.last < 0.25:
            return
        self.last = now
        self.live.update(self._table(driver))

    def _table(self, driver: Any) -> Any:
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        from sweeper.driver import FINISHED
        from sweeper.results import best_trial

        n = driver.cfg.study.n_trials
        done = len(driver.study.get_trials(deepcopy=False, states=FINISHED))
        new = done - self.done0
        per_trial = (time.monotonic() - self.started) / new if new > 0 else None
        eta = f"ETA {max(n - done, 0) * per_trial / 60:.1f} min" if per_trial else "ETA -"
        best = best_trial(driver.study)
        grid = Table.grid(padding=(0, 2))
        grid.add_row(ProgressBar(total=n, completed=done, width=40), f"{done}/{n} trials  {eta}")
        if best is not None:
            grid.add_row("best", f"trial {best.number}: {self.metric}={_fmt(best.value)}")
        for w in driver.workers:
            r = w.running
            m = r.metrics if r else {}
            grid.add_row(w.slot.label, "idle" if r is None else
                         f"trial {r.number} epoch {_fmt(r.epoch, 'd')} {self.metric}={_fmt(m.get(self.metric))} "
                         f"batch {m.get('micro_batch_size', '-')}x{m.get('accum_steps', '-')} "
                         f"mem {_fmt(m.get('peak_mem_mb'), '.0f')} MB")
        return grid

    def close(self, outcome: Any, cfg: Any, plan: Any) -> None:
        if self.live is not None:
            self.live.stop()
        super().close(outcome, cfg, plan)


def default_view() -> NullView:
    return RichView() if sys.stdout.isatty() else PlainView()


def print_status(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    counts = ", ".join(f"{k.lower()} {v}" for k, v in report["counts"].items() if v)
    console.print(f"study {report['study']!r}: {report['finished']}/{report['n_trials']} finished ({counts or 'no trials'})")
    if report["fail_reasons"]:
        console.print("failed: " + ", ".join(f"{k} {v}" for k, v in report["fail_reasons"].items()))
    if report["best"]:
        print_best(report["best"], console)
    if report["running"]:
        table = Table("trial", "host", "device", "epoch", title="running")
        for r in report["running"]:
            table.add_row(str(r["trial"]), str(r["host"]), str(r["device"]), _fmt(r["epoch"], "d"))
        console.print(table)
    for d in report["devices"]:
        console.print(f"GPU {d.get('index')} {d.get('uuid', '')}: util {d.get('util')}% "
                      f"mem {d.get('mem_used_mb')}/{d.get('mem_total_mb')} MB, {d.get('n_procs')} processes")


def print_best(best: dict[str, Any], console: Any = None) -> None:
    from rich.console import Console

    console = console or Console()
    m = best["metrics"]
    console.print(f"best: trial {best['trial']}  {best['metric']}={_fmt(best['value'])}")
    console.print(f"  valid: ic {_fmt(m.get('val_ic'))}  rank_ic {_fmt(m.get('val_rank_ic'))}  icir {_fmt(m.get('val_icir'))}")
    console.print(f"  test:  ic {_fmt(m.get('test_ic'))}  rank_ic {_fmt(m.get('test_rank_ic'))}  icir {_fmt(m.get('test_icir'))}")
    for split, key in (("valid", "val"), ("test", "test")):
        oracle, frac = best.get(f"oracle_{key}_ic"), best.get(f"{key}_ic_oracle_fraction")
        if oracle:
            console.print(f"  oracle {split} IC {oracle:.4f}" + (f": {frac:.0%} reached" if frac is not None else ""))
    for line in selection_lines(best.get("selection")):
        console.print("  " + line, highlight=False)
    console.print("  params: " + ", ".join(f"{k}={v}" for k, v in best["params"].items()), soft_wrap=True)
    console.print(f"  weights: {best['weights'] or '-'}")


def selection_lines(sel: dict[str, Any] | None) -> list[str]:
    """The selection-bias figures in words (``sweeper best``, ``status`` and the report)."""
    if not sel:
        return ["selection bias: - (the best trial has no daily IC file)"]
    return [
        f"selection bias over {sel['n_trials']} trials: no-signal best val IC "
        f"{_fmt(sel.get('expected_max_null_ic'))}",
        f"  deflated val IC {_fmt(sel.get('deflated_ic'))}  P(fluke) {_fmt(sel.get('p_fluke'), '.1%')}  "
        f"PBO {_fmt(sel.get('pbo'), '.2f')}",
    ]
