"""optuna-dashboard's API latency on a SQLite study while an 8-worker sweep writes
to it, against the same study once the sweep is done.

A real ``sweeper run`` (8 CPU worker slots of tiny trials, so that the store sees
as many writes as it can) and a real ``sweeper dashboard`` server on a free port,
both on the same SQLite file. The client asks what the dashboard's page polls:
``/api/studies`` and ``/api/studies/<id>?after=0`` (every trial), in turn, one
request at a time, one every ``--interval`` seconds (0.1), timing each from
request to the last byte of the reply.
"busy" samples are taken from the first finished trial until the sweep exits;
"idle" samples as many requests (at least 100) after it.

    python benchmarks/dashboard_latency.py [--trials 120] [--workers 8] [--interval 0.1]

The last line is JSON: {"busy": {"p50_ms", "p95_ms", "max_ms", "n"}, "idle": {...},
"p95_ratio", "sweep_s" (the sweep's wall time), "load_avg_1m"}.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml


def study(trials: int, workers: int) -> dict:
    return {
        "study": {"name": "bench", "n_trials": trials, "sampler": {"name": "random", "seed": 0},
                  "pruner": {"name": "none"}},
        "data": {"synthetic": {"assets": 50, "dates": 300, "features": 4, "seed": 0}, "lookback": 10},
        "model": {"name": "mlp", "hidden_size": 16, "num_layers": 1},
        "train": {"epochs": 2, "batch_size": 256, "samples_per_epoch": 512},
        "devices": {"gpus": "none", "cpu_workers": workers},
        "search_space": {"train.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}},
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(url: str) -> float:
    """Seconds for one request, the reply read to its end."""
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as reply:
        reply.read()
    return time.perf_counter() - start


def finished(db: Path) -> int:
    import sqlite3

    if not db.exists():
        return 0
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute("SELECT count(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0]
    except sqlite3.OperationalError:  # no tables yet
        return 0
    finally:
        conn.close()


def wait_for(check, what: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def sample(base: str, study_id: int, keep_going, interval: float) -> list[float]:
    """Requests started every ``interval`` seconds (or as soon as the last one ends)."""
    times, urls = [], [f"{base}/api/studies", f"{base}/api/studies/{study_id}?after=0"]
    while keep_going(len(times)):
        start = time.monotonic()
        times.append(get(urls[len(times) % 2]))
        time.sleep(max(0.0, interval - (time.monotonic() - start)))
    return times


def summary(times: list[float]) -> dict:
    ms = sorted(t * 1000 for t in times)
    return {"p50_ms": round(statistics.median(ms), 1), "p95_ms": round(ms[int(0.95 * (len(ms) - 1))], 1),
            "max_ms": round(ms[-1], 1), "n": len(ms)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=120)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--interval", type=float, default=0.1,
                        help="seconds between requests: a steady load that does not itself starve the sweep")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="sweeper-dashboard-bench-"))
    (folder / "study.yaml").write_text(yaml.safe_dump(study(args.trials, args.workers)))
    db = folder / "runs" / "bench" / "study.db"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cli = [sys.executable, "-m", "sweeper.cli"]
    started = time.monotonic()
    sweep = subprocess.Popen(cli + ["run", "study.yaml"], cwd=folder, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port = free_port()
    wait_for(lambda: finished(db) > 0 or sweep.poll() is not None, "the first finished trial")
    log = (folder / "dashboard.log").open("w")
    server = subprocess.Popen(cli + ["dashboard", "study.yaml", "--port", str(port)], cwd=folder, env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(base) or server.poll() is not None, "the dashboard server", timeout=120)
        if server.poll() is not None:
            raise SystemExit(f"the dashboard server exited {server.returncode}: see {folder / 'dashboard.log'}")
        study_id = json.loads(urllib.request.urlopen(f"{base}/api/studies").read())["study_summaries"][0]["study_id"]
        busy = sample(base, study_id, lambda n: sweep.poll() is None, args.interval)
        if sweep.wait() != 0:
            raise SystemExit(f"the sweep failed (exit {sweep.returncode}); see {folder}")
        sweep_s = time.monotonic() - started
        idle = sample(base, study_id, lambda n: n < max(100, len(busy)), args.interval)
    finally:
        server.terminate()
        server.wait(timeout=30)
        if sweep.poll() is None:
            sweep.kill()
    done = finished(db)
    result = {"workers": args.workers, "trials": done, "sweep_s": round(sweep_s, 1),
              "busy": summary(busy), "idle": summary(idle),
              "p95_ratio": round(summary(busy)["p95_ms"] / summary(idle)["p95_ms"], 2),
              "load_avg_1m": round(os.getloadavg()[0], 1)}
    print(json.dumps(result))


def _answers(base: str) -> bool:
    try:
        get(f"{base}/api/meta")
    except OSError:
        return False
    return True


if __name__ == "__main__":
    main()
