"""Seconds for ``sweeper report`` on a 500-trial study.

The study is tests/synthetic_study.py's: 500 finished trials (420 complete, 70
pruned, 10 failed) plus one running, 4 params, 20 epochs of intermediate values,
10 user attributes each, on 4 GPU slots, and daily IC files for 60 of them, in a
SQLite file in a temporary folder. Two figures, each the median of ``--repeats``:

- ``report_s``: the command a user types, ``sweeper report big.yaml -o report.html``,
  as a fresh process (interpreter start, imports, reading the study, the figures,
  writing the ~5 MB page);
- ``library_s``: :func:`sweeper.inspect.report.write_report` inside a warm process.

    python benchmarks/report.py [--repeats 3]

The last line is JSON: {"trials", "report_s", "report_cpu_s", "library_s", "html_mb",
"load_avg"}. The target is report_s <= 5 on the 2-core development machine. That machine
is shared, so ``load_avg`` (the 1-minute load average when it ran) says how busy it was,
and ``report_cpu_s`` (the command's CPU seconds, user + system) is the figure that other
jobs disturb least.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import synthetic_study  # noqa: E402


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from sweeper.config import load_config
    from sweeper.inspect.report import write_report

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        study_file = synthetic_study.build(root, n=500)
        out = root / "report.html"
        cli, cpu, library = [], [], []
        for _ in range(args.repeats):
            started, before = time.perf_counter(), _child_cpu()
            subprocess.run([sys.executable, "-m", "sweeper.cli", "report", study_file.name, "-o", out.name],
                           cwd=root, check=True, stdout=subprocess.DEVNULL)
            cli.append(time.perf_counter() - started)
            cpu.append(_child_cpu() - before)
        cwd = os.getcwd()
        os.chdir(root)
        try:
            cfg = load_config(study_file.name)
            for _ in range(args.repeats):
                summary = write_report(cfg, out.name)
                library.append(summary["seconds"])
        finally:
            os.chdir(cwd)
        size = out.stat().st_size / 2**20
    trials = summary["trials"]
    result = {"trials": trials, "report_s": round(statistics.median(cli), 2),
              "report_cpu_s": round(statistics.median(cpu), 2),
              "library_s": round(statistics.median(library), 2), "html_mb": round(size, 1),
              "load_avg": round(os.getloadavg()[0], 2)}
    print(f"sweeper report, {trials} trials: command {cli}, library {library}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
