"""Per-trial dispatch overhead: sweeper's long-lived slot workers vs a fresh
interpreter per trial.

Overhead is the wall time beyond the trials' own training time (their
``duration_s``), averaged per trial, on one CPU slot. Both modes run the same
tiny trials through the real worker process and the real SQLite store; the
baseline starts a new ``python -m sweeper.worker.main`` for every trial (import
torch, load the panel, attach to the study), as a per-trial subprocess
launcher would.

    python benchmarks/dispatch.py [--trials 30]

The last line is JSON: {"overhead_s_per_trial", "fresh_process_s_per_trial", "ratio"}.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import optuna

STUDY = {
    "study": {"name": "bench", "n_trials": 30, "sampler": {"name": "random", "seed": 0}, "pruner": {"name": "none"}},
    "data": {"synthetic": {"assets": 50, "dates": 300, "features": 4, "seed": 0}, "lookback": 10},
    "model": {"name": "mlp", "hidden_size": 16, "num_layers": 1},
    "train": {"epochs": 1, "batch_size": 256, "samples_per_epoch": 512},
    "devices": {"gpus": "none", "cpu_workers": 1},
    "search_space": {"train.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}},
}


def _durations(study: optuna.Study) -> float:
    return sum(t.user_attrs.get("duration_s", 0.0) for t in study.get_trials())


def sweeper_overhead(cfg) -> tuple[float, float]:
    from sweeper.dispatch.live import NullView
    from sweeper.dispatch.run import run

    start = time.perf_counter()
    run(cfg, view=NullView())
    wall = time.perf_counter() - start
    study = optuna.load_study(study_name=cfg.study.name, storage=cfg.study.resolved_storage)
    n = len(study.get_trials())
    return (wall - _durations(study)) / n, wall


def fresh_overhead(cfg, n: int) -> tuple[float, float]:
    """The same trials, each in a brand-new worker process."""
    from sweeper.devices import plan_slots
    from sweeper.dispatch.claim import claim
    from sweeper.dispatch.handle import WorkerHandle
    from sweeper.store import claim_lock, open_storage
    from sweeper.store.identity import Identity
    from sweeper.study.open import open_study

    storage = open_storage(cfg.study.resolved_storage, heartbeat_interval=cfg.study.heartbeat_interval,
                           grace_period=cfg.study.grace_period)
    lock = claim_lock(storage, cfg.study.resolved_storage, cfg.study.name)
    study, _ = open_study(storage, cfg, attrs={"config": {}}, lock=lock, force=True, must_exist=False)
    ident = Identity.current()
    run_dir = Path(f"runs/{cfg.study.name}")
    slot = plan_slots(cfg.devices)[0]
    init = {"config": __import__("sweeper.config", fromlist=["to_dict"]).to_dict(cfg),
            "storage": cfg.study.resolved_storage, "study": cfg.study.name, "run_dir": str(run_dir),
            "artifacts": str(run_dir), "driver": {"host": ident.host, "pid": ident.pid, "driver_id": ident.driver_id}}
    start = time.perf_counter()
    for _ in range(n):
        trial = claim(study, cfg, lock, ident, run_dir)
        worker = WorkerHandle(slot, init, run_dir)
        worker.start()
        worker.send({"op": "run", "trial_id": trial._trial_id, "number": trial.number})
        while True:
            events = worker.read_events()
            if events is None or any(e["ev"] == "end" for e in events):
                break
        worker.close()
    wall = time.perf_counter() - start
    return (wall - _durations(study)) / n, wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    from sweeper.config import validate_config

    ours, fresh = [], []
    for rep in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            os.chdir(tmp)
            raw = {**STUDY, "study": {**STUDY["study"], "n_trials": args.trials, "name": f"bench{rep}"}}
            cfg = validate_config(raw, "bench")
            o, wall_o = sweeper_overhead(cfg)
            fresh_cfg = validate_config({**raw, "study": {**raw["study"], "name": f"fresh{rep}"}}, "bench")
            f, wall_f = fresh_overhead(fresh_cfg, args.trials)
            print(f"repeat {rep}: sweeper {o:.3f} s/trial (wall {wall_o:.1f} s), "
                  f"fresh process {f:.3f} s/trial (wall {wall_f:.1f} s), ratio {f / o:.1f}x")
            ours.append(o)
            fresh.append(f)
    o, f = statistics.median(ours), statistics.median(fresh)
    print(json.dumps({"trials": args.trials, "overhead_s_per_trial": round(o, 4),
                      "fresh_process_s_per_trial": round(f, 4), "ratio": round(f / o, 2)}))


if __name__ == "__main__":
    main()
