"""``sweeper train``: one training run with the study's defaults, no sweep."""
from __future__ import annotations

import math
import sys
import time
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from sweeper import config as C
from sweeper.core import NullHook
from sweeper.plain import plain

if TYPE_CHECKING:
    from rich.console import Console

# (metric key, header): short headers keep a row within 80 columns
COLUMNS = (("epoch", "epoch"), ("train_loss", "loss"), ("val_loss", "val_loss"), ("val_ic", "val_ic"),
           ("val_rank_ic", "rank_ic"), ("samples_per_s", "samples/s"), ("peak_mem_mb", "mem_MB"))


class TableHook(NullHook):
    """Prints one row per epoch (to stderr when stdout carries JSON). The rest is NullHook's: one
    run shares its GPU with no other trial, so the probe's peak decides nothing, and nobody stops it."""

    def __init__(self, console: Console, several: bool = False) -> None:
        self.console = console
        self.several = several  # a trial of several runs: say which run an epoch row belongs to
        self.header = False
        self.runs: list[dict[str, int]] = [{}]

    def begin(self, runs: list[dict[str, int]], offset: int) -> None:
        """A trial's run of several (a walk-forward fold's, or a seed repeat's), or a stack of them,
        begins: a line that says which, and a fresh header over its epochs."""
        self.runs = runs
        names = [f"{r['fold']}.{r['repeat']}" for r in runs if r]
        if len(runs) == 1 and names and self.several:
            self.console.print(f"fold {runs[0]['fold']}, seed {runs[0]['repeat']}", highlight=False)
        elif len(runs) > 1:
            self.console.print(f"a stack of {len(runs)} runs trained as one (fold.seed): {', '.join(names)}",
                               highlight=False)
        self.header = False

    def on_epoch(self, epoch: int, rows: list[dict[str, Any] | None]) -> bool:
        for columns, row in zip(self.runs, rows):
            if row is None:
                continue
            if not self.header:
                self.console.print(" ".join(f"{h:>10}" for _, h in COLUMNS), highlight=False, soft_wrap=True)
                self.header = True
            # in a stack, the epoch cell names the member: "3 (2.1)" is epoch 3 of fold 2, seed 1
            label = f"{epoch} ({columns['fold']}.{columns['repeat']})" if len(rows) > 1 and columns else epoch
            cells = " ".join(f"{_cell(v):>10}" for v in ({**row, "epoch": label}.get(k) for k, _ in COLUMNS))
            self.console.print(cells, highlight=False, soft_wrap=True)
        return False


def _cell(value: object) -> str:
    if isinstance(value, float):
        return "-" if not math.isfinite(value) else f"{value:.4f}" if abs(value) < 100 else f"{value:.0f}"
    return "-" if value is None else str(value)


def train_once(cfg: C.SweeperConfig, *, quiet: bool = False) -> dict[str, Any]:
    """Train with ``cfg`` and return the final metrics (the ``--json`` keys). The runs of the trial's
    grid train as a sweep's trial trains them (nothing kept on disk): one run's metrics, or with folds
    or seeds the trial's attributes with ``value`` (the objective) and the model run's test scores."""
    from rich.console import Console

    from sweeper.data import load_panel

    started = time.monotonic()  # train.max_minutes counts from here, loading the data included
    console = Console(stderr=quiet, file=sys.stderr if quiet else None)
    panel = load_panel(cfg.data)
    console.print(f"data: {panel.source}: {len(panel.dates)} dates x {len(panel.assets)} assets x "
                  f"{len(panel.features)} features; model {cfg.model.name}", highlight=False)
    with console.status("training...") if console.is_terminal else nullcontext():
        from sweeper.validation import record
        from sweeper.validation.runner import Trainer, pin_eval_batch, pin_stack_size, train_runs

        hook = TableHook(console, several=cfg.validation.runs > 1)
        trainer = pin_eval_batch(panel, Trainer(cfg, hook, started, log=lambda line: None))
        trainer, choice = pin_stack_size(panel, trainer)
        if choice["stack_size_from"] == "measured" or "precision_rates" in choice:
            from sweeper.inspect.printing import stack_line

            console.print(stack_line(choice), highlight=False, soft_wrap=True)
        out = train_runs(panel, trainer)
        m = {**record.summary(out, trainer.cfg), **choice}
    if out.cut_short is not None:  # as a sweep's trial: PRUNED, no objective (some runs' scores are none)
        m.update(value=None, cut_short=str(out.cut_short))
        console.print(f"stopped ({out.cut_short}) after {len(out.runs)} of {trainer.cfg.validation.runs} "
                      "runs: the figures below are of those runs; a sweep records the trial PRUNED, "
                      "with no value", highlight=False, soft_wrap=True)
    _say_scores(console, m)
    return {k: plain(v) for k, v in m.items()}


def _say_scores(console: Any, m: dict[str, Any]) -> None:
    if "fold_val_ic" in m:
        console.print(f"folds: val_ic {' '.join(_cell(v) for v in m['fold_val_ic'])}  "
                      f"(mean {_cell(m.get('val_ic'))}, se {_cell(m.get('val_ic_se'))})", highlight=False)
    console.print(f"valid: ic {_cell(m.get('val_ic'))}  rank_ic {_cell(m.get('val_rank_ic'))}  "
                  f"icir {_cell(m.get('val_icir'))}  loss {_cell(m.get('val_loss'))}", highlight=False)
    console.print(f"test:  ic {_cell(m.get('test_ic'))}  rank_ic {_cell(m.get('test_rank_ic'))}  "
                  f"icir {_cell(m.get('test_icir'))}", highlight=False)
    if m.get("oracle_test_ic") and m.get("test_ic") is not None:  # a run cut short has no test IC
        console.print(f"oracle IC: valid {_cell(m.get('oracle_val_ic'))}  test {m['oracle_test_ic']:.4f}  "
                      f"(test reached {m['test_ic'] / m['oracle_test_ic']:.0%})", highlight=False)

