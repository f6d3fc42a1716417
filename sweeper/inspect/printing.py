"""The printed summaries of ``sweeper status`` and ``sweeper best`` (rich, on stdout),
and the selection-bias lines that the report shows too."""
from __future__ import annotations

import math
from typing import Any


def fmt(value: Any, spec: str = ".4f") -> str:
    """``value`` formatted with ``spec``; ``-`` for None and non-finite floats."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec) if isinstance(value, (int, float)) else str(value)


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
            table.add_row(str(r["trial"]), str(r["host"]), str(r["device"]), fmt(r["epoch"], "d"))
        console.print(table)
    for d in report["devices"]:
        console.print(f"GPU {d.get('index')} {d.get('uuid', '')}: util {d.get('util')}% "
                      f"mem {d.get('mem_used_mb')}/{d.get('mem_total_mb')} MB, {d.get('n_procs')} processes")


def print_best(best: dict[str, Any], console: Any = None) -> None:
    from rich.console import Console

    console = console or Console()
    m = best["metrics"]
    console.print(f"best: trial {best['trial']}  {best['metric']}={fmt(best['value'])}")
    console.print(f"  valid: ic {fmt(m.get('val_ic'))}  rank_ic {fmt(m.get('val_rank_ic'))}  icir {fmt(m.get('val_icir'))}")
    console.print(f"  test:  ic {fmt(m.get('test_ic'))}  rank_ic {fmt(m.get('test_rank_ic'))}  icir {fmt(m.get('test_icir'))}")
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
        f"{fmt(sel.get('expected_max_null_ic'))}",
        f"  deflated val IC {fmt(sel.get('deflated_ic'))}  P(fluke) {fmt(sel.get('p_fluke'), '.1%')}  "
        f"PBO {fmt(sel.get('pbo'), '.2f')}",
    ]
