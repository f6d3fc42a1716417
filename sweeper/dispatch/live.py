"""What the driver shows while it runs: a rich live view on a terminal, plain log lines
otherwise, nothing in library use. Each is a :class:`sweeper.dispatch.view.View` (null-object
style: the driver has no branches for output, and a view never polls the study)."""

import sys
import time
from typing import Any, TextIO

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeper.config import SweeperConfig, objective_label
from sweeper.devices import Slot
from sweeper.dispatch.plan import Plan
from sweeper.dispatch.stopping import SweepResult
from sweeper.dispatch.view import View
from sweeper.inspect.printing import fmt
from sweeper.quant.oracle import oracle_fractions


class NullView(View):
    """Shows nothing (every call is the protocol's empty body): library use and tests."""


class PlainView(NullView):
    """One line per event, for logs and pipes."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream  # None: sys.stdout when a line is said (a sweep's is interrupt.unheard's)
        self.metric = self.objective = "val_ic"  # objective: what a trial's value is called (objective_label)
        self.several = False  # a trial of several runs: an epoch's line names its run

    def _say(self, line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", file=self.stream, flush=True)

    def start(self, cfg: SweeperConfig, plan: Plan, study: optuna.Study) -> None:
        from sweeper.store import redact

        self.metric = cfg.study.metric
        self.objective = objective_label(cfg.study.metric, cfg.validation)
        self.several = cfg.validation.runs > 1
        self.done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))
        for line in [f"study {cfg.study.name!r}: {self.done}/{cfg.study.n_trials} finished, optimising "
                     f"{cfg.study.metric} ({cfg.study.resolved_direction})",
                     f"storage: {redact(plan.storage_url)}", f"data: {plan.panel.source}",
                     "slots: " + ", ".join(s.label for s in plan.slots),
                     f"dashboard: sweeper dashboard {plan.study_file}"]:
            self._say(line)

    def trial_started(self, slot: Slot, number: int, params: dict[str, Any]) -> None:
        shown = " ".join(f"{k}={fmt(v, '.4g')}" for k, v in params.items())
        self._say(f"trial {number} started on {slot.label}: {shown}")

    def population(self, slot: Slot, numbers: list[int]) -> None:
        if len(numbers) > 1:
            self._say(f"trials {', '.join(map(str, numbers))} train as one stack on {slot.label} "
                      "(study.population)")

    def epoch(self, slot: Slot, number: int, epoch: int, metrics: dict[str, Any]) -> None:
        self._say(f"trial {number}{_run(metrics, self.several)} epoch {epoch}: "
                  f"{self.metric}={fmt(metrics.get(self.metric))} loss={fmt(metrics.get('train_loss'))} "
                  f"mb={metrics.get('micro_batch_size', '-')}")

    def trial_ended(self, slot: Slot, number: int, state: TrialState, value: float | None,
                    reason: str | None) -> None:
        tail = f" ({reason})" if reason else ""
        # its best epoch's, as the trial's val_ic attribute; Optuna stores a pruned trial's last report
        pruned = state == TrialState.PRUNED and value is not None
        kept = " (its best epoch; the study keeps its last epoch's)" if pruned else ""
        self._say(f"trial {number} {state.name.lower()}{tail}: {self.objective}={fmt(value)}{kept}")

    def warn(self, slot: Slot, text: str) -> None:
        self._say(f"warning from {slot.label}: {text}")

    def close(self, result: SweepResult, cfg: SweeperConfig, plan: Plan) -> None:
        counts = ", ".join(f"{k.lower()} {v}" for k, v in result.counts.items() if v)
        self._say(f"trials: {counts or 'none'}")
        if (best := result.best) is not None:
            ua, name = best.user_attrs, objective_label(cfg.study.metric, cfg.validation)
            line = f"best: trial {best.number}  {name}={fmt(best.value)}"
            line += "" if name == "val_ic" else f"  val_ic={fmt(ua.get('val_ic'))}"
            line += f"  test_ic={fmt(ua.get('test_ic'))}"
            frac = oracle_fractions(ua, oracle := plan.panel.oracle_ic).get("test_ic_oracle_fraction")
            if frac is not None and oracle is not None:
                line += f"  ({frac:.0%} of the oracle test IC {oracle['test']:.4f})"
            self._say(line)
        if result.message:
            self._say(result.message)
        study_file, look = plan.study_file, ("best" if result.best is not None else "status")
        if result.interrupted:
            self._say("interrupted: running trials stopped at their next step; each resumes from its last "
                      f"end-of-epoch checkpoint. Resume with: sweeper resume {study_file}")
        self._say(f"next: sweeper {look} {study_file} | sweeper report {study_file} -o report.html | "
                  f"sweeper dashboard {study_file}")


class RichView(PlainView):
    """A live panel: overall progress with ETA, the best so far, one line per slot."""

    def __init__(self) -> None:
        super().__init__()
        from rich.console import Console

        self.console = Console()
        self.live: Any = None
        self.last, self.n_trials = 0.0, 0
        self.done = self.done0 = 0
        self.best: FrozenTrial | None = None
        self.slots: dict[str, dict[str, Any] | None] = {}
        self.run_epochs = self.run_epochs_per_trial = 0  # what the ETA reads before a trial has ended

    def _say(self, line: str) -> None:
        self.console.print(line, highlight=False)

    def start(self, cfg: SweeperConfig, plan: Plan, study: optuna.Study) -> None:
        from rich.live import Live

        super().start(cfg, plan, study)
        self.started, self.n_trials = time.monotonic(), cfg.study.n_trials
        self.run_epochs_per_trial = cfg.validation.runs * cfg.train.epochs
        self.done0 = self.done  # counted by PlainView.start
        self.slots = {s.label: None for s in plan.slots}
        self.live = Live(console=self.console, refresh_per_second=4, transient=True)
        self.live.start()

    def progress(self, finished: int, best: FrozenTrial | None) -> None:
        self.done, self.best = finished, best

    def trial_started(self, slot: Slot, number: int, params: dict[str, Any]) -> None:
        row = self.slots.get(slot.label)
        shared = row["numbers"] if row else []  # a population's trials start on one slot together
        self.slots[slot.label] = {"number": number, "numbers": [*shared, number], "epoch": None,
                                  "metrics": {}}

    def epoch(self, slot: Slot, number: int, epoch: int, metrics: dict[str, Any]) -> None:
        row = self.slots.get(slot.label) or {"numbers": [number]}
        self.slots[slot.label] = {**row, "number": number, "epoch": epoch, "metrics": metrics}
        self.run_epochs += 1  # one event per run's epoch (each member of a stack sends its own)

    def trial_ended(self, slot: Slot, number: int, state: TrialState, value: float | None,
                    reason: str | None) -> None:
        row = self.slots.get(slot.label)
        left = [n for n in (row["numbers"] if row else []) if n != number]
        self.slots[slot.label] = {**row, "numbers": left} if row and left else None
        if state in (TrialState.COMPLETE, TrialState.PRUNED):
            self.done += 1

    def tick(self) -> None:
        if self.live is not None and (now := time.monotonic()) - self.last >= 0.25:
            self.last = now
            self.live.update(self._table())

    def _table(self) -> Any:
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        n, done = self.n_trials, self.done
        grid = Table.grid(padding=(0, 2))
        grid.add_row(ProgressBar(total=n, completed=done, width=40), f"{done}/{n} trials  {self.eta()}")
        if self.best is not None:
            grid.add_row("best", f"trial {self.best.number}: {self.objective}={fmt(self.best.value)}")
        for label, r in self.slots.items():
            m = r["metrics"] if r else {}
            grid.add_row(label, "idle" if r is None else
                         f"{_trials(r)}{_run(m, self.several)} epoch {fmt(r['epoch'], 'd')} "
                         f"{self.metric}={fmt(m.get(self.metric))} "
                         f"batch {m.get('micro_batch_size', '-')}x{m.get('accum_steps', '-')} "
                         f"mem {fmt(m.get('peak_mem_mb'), '.0f')} MB")
        return grid

    def eta(self, now: float | None = None) -> str:
        """The time left at the pace of the trials finished here; before the first ends, at the
        pace of the run epochs trained so far, each trial counted at all its epochs (so an
        early stop or a pruned trial makes it end sooner)."""
        elapsed = (time.monotonic() if now is None else now) - self.started
        left, new = max(self.n_trials - self.done, 0), self.done - self.done0
        if new > 0:
            return f"ETA {left * elapsed / new / 60:.1f} min"
        if not self.run_epochs:
            return "ETA -"
        epochs_left = max(left * self.run_epochs_per_trial - self.run_epochs, 0)
        return f"ETA ~{epochs_left * elapsed / self.run_epochs / 60:.1f} min (from the epochs so far)"

    def end(self) -> None:  # also when the sweep ends by an exception: the cursor is shown again
        if self.live is not None:
            self.live.stop()


def default_view() -> NullView:
    return RichView() if sys.stdout.isatty() else PlainView()


def _trials(row: dict[str, Any]) -> str:
    """``trial 7``, or a population's ``trials 4+5+6+7`` (one stack) with the trial last heard first."""
    if len(numbers := row.get("numbers") or [row["number"]]) == 1:
        return f"trial {numbers[0]}"
    return f"trials {row['number']}+" + "+".join(str(n) for n in numbers if n != row["number"])


def _run(metrics: dict[str, Any], several: bool) -> str:
    """`` fold 2 seed 1 (stack of 4)`` for an epoch of a trial of several runs (walk-forward folds,
    seed repeats), with the size of the stack it trains in when it shares one; a trial's only run
    (its rows name fold 1, seed 1 too) needs no name."""
    if not several or "fold" not in metrics:
        return ""
    shared = f" (stack of {stack})" if (stack := int(metrics.get("stack") or 1)) > 1 else ""
    return f" fold {metrics['fold']} seed {metrics.get('repeat', 1)}{shared}"
