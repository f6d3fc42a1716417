"""The one core's stack of one against an older tree's training loop (issue 39: the lone loop of
d1a4397), in the same run.

Each tree's own ``benchmarks/core_overhead.py`` trains one model through its core with a plain
PyTorch loop's epochs interleaved (same model, batches and math, one torch thread), and reports
``ratio``: its core's samples/s over the plain loop's. The plain loop is the same code in both
trees, so it is the yardstick that takes the machine's drift out: ``core_vs_parent`` is the
current tree's ratio over the old tree's, per round (the two trees alternate, first one then the
other), and its median over rounds. 1.0: the stack of one trains as fast as the lone loop did;
0.97: 3 % slower.

    python benchmarks/core_vs_parent.py [--rev d1a4397] [--models mlp,lstm,transformer] [--rounds 5]

The old tree is a temporary ``git worktree`` of ``--rev``. The last line is JSON:
{"rev", "models": {name: {"core_vs_parent", "ratios", "current", "parent"}}}.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _ratio(tree: Path, model: str, repeats: int) -> float:
    """The core/plain ratio of ``tree``'s core_overhead.py for ``model`` (its own sweeper on the path)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(tree / "benchmarks" / "core_overhead.py"), "--model", model,
                           "--repeats", str(repeats)], capture_output=True, text=True, env=env, cwd=tree)
    if done.returncode:
        raise RuntimeError(f"{tree}: {done.stderr[-2000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["ratio"])


def compare(rev: str, models: list[str], rounds: int, repeats: int) -> dict[str, Any]:
    report: dict[str, Any] = {"rev": rev, "rounds": rounds, "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "parent"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(old), rev], cwd=ROOT, check=True)
        try:
            for model in models:
                current, parent = [], []
                for i in range(rounds):
                    first, second = (ROOT, old) if i % 2 == 0 else (old, ROOT)
                    a, b = _ratio(first, model, repeats), _ratio(second, model, repeats)
                    current.append(a if first == ROOT else b)
                    parent.append(b if first == ROOT else a)
                ratios = [c / p for c, p in zip(current, parent)]
                report["models"][model] = {"core_vs_parent": round(statistics.median(ratios), 3),
                                           "ratios": [round(r, 3) for r in ratios],
                                           "current": current, "parent": parent}
                print(f"{model}: current/parent {report['models'][model]['core_vs_parent']} "
                      f"(per round {report['models'][model]['ratios']})", file=sys.stderr, flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, check=False)
    return report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default="d1a4397", help="the older tree (the parent of issue 39's first change)")
    parser.add_argument("--models", default="mlp,lstm,transformer")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=1, help="core_overhead.py --repeats of each run")
    args = parser.parse_args(argv)
    report = compare(args.rev, args.models.split(","), args.rounds, args.repeats)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
