"""Host memory of a sweep: peak total PSS of the driver and its workers, and each worker's
time to its first training step, with the panel cache (data.cache) on and off.

    python benchmarks/memory.py --features 48 --workers 2          # the issue's check
    python benchmarks/memory.py --features 21,42,84 --workers 1,2,4

A synthetic Parquet file of ``assets x dates x features`` is written once per size; each
case runs ``sweeper run`` (one trial per worker, a tiny MLP, one short epoch) in a fresh
folder with a fresh cache folder, samples ``/proc/<pid>/smaps_rollup`` of the driver and
every descendant every 0.2 s, and reads the trial logs for the line the training core
prints just before its first step. With the cache, the driver builds the entry during
its checks and the workers map it. The last line is JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml


def pss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def study(path: Path, workers: int, cache: bool, cache_dir: Path) -> dict:
    return {
        "study": {"name": "mem", "n_trials": workers, "sampler": {"name": "random", "seed": 0},
                  "pruner": {"name": "none"}},
        "data": {"path": str(path), "cache": cache, "cache_dir": str(cache_dir)},
        "model": {"name": "mlp", "hidden_size": 16},
        "train": {"epochs": 1, "batch_size": 512, "samples_per_epoch": 4096, "patience": 1},
        "devices": {"gpus": "none", "cpu_workers": workers},
        "search_space": {"train.lr": {"type": "float", "low": 1e-3, "high": 1e-2, "log": True}},
    }


def run_case(path: Path, workers: int, cache: bool, bytes_features: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="sweeper-mem-") as tmp:
        folder = Path(tmp)
        (folder / "s.yaml").write_text(yaml.safe_dump(study(path, workers, cache, folder / "cache")))
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "sweeper.cli", "run", "s.yaml"], cwd=folder, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        peak, first_worker, steps = 0, None, {}
        while proc.poll() is None:
            pids = descendants(proc.pid)
            peak = max(peak, sum(pss_kb(p) for p in pids))
            if first_worker is None and len(pids) > 1:
                first_worker = time.monotonic() - t0
            for log in folder.glob("runs/*/trials/*/train.log"):
                if str(log) not in steps and "training " in log.read_text(errors="replace"):
                    steps[str(log)] = time.monotonic() - t0
            time.sleep(0.2)
        err = proc.stderr.read() if proc.stderr else ""
        if proc.returncode != 0:
            raise SystemExit(f"sweeper run failed ({proc.returncode}): {err[-2000:]}")
        start = first_worker or 0.0
        first_steps = sorted(v - start for v in steps.values())
        return {"features_gb": round(bytes_features / 1e9, 3), "workers": workers, "cache": cache,
                "peak_pss_gb": round(peak / 1e6, 3), "ratio_to_panel": round(peak * 1e3 / bytes_features, 2),
                "first_step_s": [round(v, 1) for v in first_steps],
                "first_step_median_s": round(statistics.median(first_steps), 1) if first_steps else None,
                "wall_s": round(time.monotonic() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--assets", type=int, default=1500)
    ap.add_argument("--dates", type=int, default=2000)
    ap.add_argument("--features", default="48", help="comma list: 21, 42, 84 give 0.25, 0.5, 1 GB")
    ap.add_argument("--workers", default="2")
    ap.add_argument("--data-dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    from sweeper.data import write_synthetic

    results = []
    for features in (int(f) for f in args.features.split(",")):
        path = Path(args.data_dir) / f"sweeper-mem-{args.assets}x{args.dates}x{features}.parquet"
        if not path.exists():
            write_synthetic(path, args.assets, args.dates, features, seed=0)
        size = args.assets * args.dates * features * 4
        for workers in (int(w) for w in args.workers.split(",")):
            for cache in (True, False):
                row = run_case(path, workers, cache, size)
                print(row, flush=True)
                results.append(row)
    print(json.dumps({"benchmark": "memory", "assets": args.assets, "dates": args.dates, "cases": results}))


if __name__ == "__main__":
    main()
