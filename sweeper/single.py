"""``sweeper train``: one training run with the study's defaults, no sweep."""
from __future__ import annotations

import math
import sys
import time
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from sweeper import config as C
from sweeper.core import NullHook

if TYPE_CHECKING:
    from rich.console import Console

# (metric key, header): short headers keep a row within 80 columns
COLUMNS = (("epoch", "epoch"), ("train_loss", "loss"), ("val_loss", "val_loss"), ("val_ic", "val_ic"),
           ("val_rank_ic", "rank_ic"), ("samples_per_s", "samples/s"), ("peak_mem_mb", "mem_MB"))


class TableHook(NullHook):
    """Prints one row per epoch (to stderr when stdout carries JSON). The rest is NullHook's: one
    run shares its GPU with no other trial, so the probe's peak decides nothing, and nobody stops it."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.header = False

    def on_epoch(self, epoch: int, metrics: dict[str, Any]) -> bool:
        if not self.header:
            self.console.print(" ".join(f"{h:>10}" for _, h in COLUMNS), highlight=False, soft_wrap=True)
            self.header = True
        row = {"epoch": epoch, **metrics}
        cells = " ".join(f"{_cell(row.get(k)):>10}" for k, _ in COLUMNS)
        self.console.print(cells, highlight=False, soft_wrap=True)
        return False


def _cell(value: object) -> str:
    if isinstance(value, float):
        return "-" if not math.isfinite(value) else f"{value:.4f}" if abs(value) < 100 else f"{value:.0f}"
    return "-" if value is None else str(value)


def train_once(cfg: C.SweeperConfig, *, quiet: bool = False) -> dict[str, Any]:
    """Train with ``cfg`` and return the final metrics (the ``--json`` keys)."""
    from rich.console import Console

    from sweeper.core import train
    from sweeper.data import load_panel

    started = time.monotonic()  # train.max_minutes counts from here, loading the data included
    console = Console(stderr=quiet, file=sys.stderr if quiet else None)
    panel = load_panel(cfg.data)
    console.print(f"data: {panel.source}: {len(panel.dates)} dates x {len(panel.assets)} assets x "
                  f"{len(panel.features)} features; model {cfg.model.name}", highlight=False)
    with console.status("training...") if console.is_terminal else nullcontext():
        result = train(cfg, panel, hook=TableHook(console), log=lambda line: None, started=started)
    m = result.metrics
    console.print(f"valid: ic {_cell(m.get('val_ic'))}  rank_ic {_cell(m.get('val_rank_ic'))}  "
                  f"icir {_cell(m.get('val_icir'))}  loss {_cell(m.get('val_loss'))}", highlight=False)
    console.print(f"test:  ic {_cell(m.get('test_ic'))}  rank_ic {_cell(m.get('test_rank_ic'))}  "
                  f"icir {_cell(m.get('test_icir'))}", highlight=False)
    if m.get("oracle_test_ic"):
        console.print(f"oracle IC: valid {m['oracle_val_ic']:.4f}  test {m['oracle_test_ic']:.4f}  "
                      f"(test reached {m['test_ic'] / m['oracle_test_ic']:.0%})", highlight=False)
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in m.items()}
