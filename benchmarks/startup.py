"""Start-up: a worker's ask -> READY and the baseline job's slot time, this tree against a
baseline tree, in the same run.

A worker is asked for the way the driver asks (``WorkerHandle.start()``, the INIT message of a
real study on SQLite) and timed until its READY event; this tree forks it from the fork server
(``sweeper.worker.forked``), the baseline (commit ``4298420``, the parent of the first issue-28
change, checked out into a temporary ``git worktree`` and run with its own PYTHONPATH) starts
``python -m sweeper.worker.main``. Each tree's measurement runs in its own interpreter, after
one untimed worker (the OS cache is warm; the fork server's cold preload is paid there).

Also, per tree: the first trial's start to its first training step (RUN sent -> the first
progress event), the private memory of an idle READY worker (Private_Clean + Private_Dirty of
/proc/PID/smaps_rollup), the study's LightGBM baseline job's slot time (the driver's start of it,
``BaselineJob._start``, to its exit, as the driver's loop sees it; beside it the fit's own
``elapsed_s`` and the difference, what the slot pays beyond the fit), the wall time of
``sweeper status``, and a user's first sweep: ``sweeper run`` of a 2-trial study whose model is a
file beside it (so its check is not cached), from start to exit, its wall time and the CPU time of
it and every process it started (the fork server, the model check, the workers).

    python benchmarks/startup.py [--n 10] [--baseline 4298420] [--quick | --smoke]

(``--smoke``: this tree only, one timed ask; what tests/test_benchmarks_smoke.py runs.)

The last line is JSON: {"n", "ours": {...}, "baseline": {...}, "ready_ratio", ...}.
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

ROOT = Path(__file__).resolve().parents[1]
STUDY = {
    "study": {"name": "startup", "n_trials": 100, "sampler": {"name": "random", "seed": 0},
              "pruner": {"name": "none"}},
    "data": {"synthetic": {"assets": 50, "dates": 300, "features": 4, "seed": 0}, "lookback": 10},
    "model": {"name": "mlp", "hidden_size": 16, "num_layers": 1},
    "train": {"epochs": 1, "batch_size": 256, "samples_per_epoch": 512},
    "devices": {"gpus": "none", "cpu_workers": 1},
    "search_space": {"train.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}},
}


def _private_mb(pid: int) -> float | None:
    try:
        rows = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    except OSError:
        return None
    kb = sum(int(r.split()[1]) for r in rows if r.startswith(("Private_Clean:", "Private_Dirty:")))
    return round(kb / 1024, 1)


def _until(worker, kind: str, timeout: float = 300.0) -> dict | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = worker.read_events()
        if events is None:
            return None
        for ev in events:
            if ev.get("ev") == kind and (kind != "progress" or "steps" in ev):
                return ev
    return None


class _Slot:
    """What the baseline job reads of the worker whose turn it takes."""

    def __init__(self, slot: object) -> None:
        self.slot = slot

    def reserve(self) -> None:
        pass


def _baseline_s(cfg, study, lock, ident, run_dir: Path, slot, server, n: int) -> dict:
    """n baseline jobs, each from the driver's start to its exit: slot time, fit time, the rest."""
    from sweeper.dispatch.baseline_job import BaselineJob

    slot_s, fit_s = [], []
    for _ in range(n):
        job = (BaselineJob(cfg, study, lock, ident, run_dir, server) if server
               else BaselineJob(cfg, study, lock, ident, run_dir))
        start = time.perf_counter()
        job._start(_Slot(slot))
        while job.proc.poll() is None:
            time.sleep(0.01)  # the driver's loop turn is about this
        slot_s.append(time.perf_counter() - start)
        assert job.proc.returncode == 0, f"the baseline job failed; see {run_dir}/logs"
        fit_s.append(study.user_attrs["baseline"]["elapsed_s"])
    beyond = [s - f for s, f in zip(slot_s, fit_s)]
    return {"baseline_slot_median_s": round(statistics.median(slot_s), 3),
            "baseline_fit_median_s": round(statistics.median(fit_s), 3),
            "baseline_beyond_fit_median_s": round(statistics.median(beyond), 3)}


def measure(n: int, first_steps: int, baselines: int) -> dict:
    """In the tree PYTHONPATH names: n asks -> READY (after one untimed), and the first step."""
    from sweeper.config import to_dict, validate_config
    from sweeper.devices import plan_slots
    from sweeper.dispatch.claim import claim
    from sweeper.dispatch.handle import WorkerHandle
    from sweeper.store import claim_lock, open_storage
    from sweeper.store.identity import Identity
    from sweeper.study.open import open_study

    try:
        from sweeper.dispatch.forkserver import ForkServer
        server = ForkServer.start()
    except ImportError:  # the baseline tree: no fork server
        server = None
    cfg = validate_config(STUDY, "startup")
    storage = open_storage(cfg.study.resolved_storage, heartbeat_interval=cfg.study.heartbeat_interval,
                           grace_period=cfg.study.grace_period)
    lock = claim_lock(storage, cfg.study.resolved_storage, cfg.study.name)
    study, _ = open_study(storage, cfg, attrs={"config": {}}, lock=lock, force=True, must_exist=False)
    ident = Identity.current()
    run_dir = Path(f"runs/{cfg.study.name}")
    slot = plan_slots(cfg.devices)[0]
    init = {"config": to_dict(cfg), "storage": cfg.study.resolved_storage, "study": cfg.study.name,
            "run_dir": str(run_dir), "artifacts": str(run_dir),
            "driver": {"host": ident.host, "pid": ident.pid, "driver_id": ident.driver_id}}

    def ask() -> tuple[object, float]:
        worker = WorkerHandle(slot, init, run_dir, server) if server else WorkerHandle(slot, init, run_dir)
        start = time.perf_counter()
        worker.start()
        ready = _until(worker, "ready")
        assert ready is not None, f"no READY; see {worker.log_path}"
        return worker, time.perf_counter() - start

    ready_s, private, step_s = [], [], []
    try:
        for i in range(n + 1):
            worker, took = ask()
            if i:  # the first is untimed: the OS cache, the fork server's preload
                ready_s.append(took)
                time.sleep(0.3)  # idle: what it holds while it waits for a trial
                mb = _private_mb(worker.proc.pid)
                if mb is not None:
                    private.append(mb)
            if 0 < i <= first_steps:
                got = claim(study, cfg, lock, ident, run_dir)  # a list since issue 40 (the baseline's: one)
                trial = got[0] if isinstance(got, list) else got
                start = time.perf_counter()
                worker.send({"op": "run", "trial_id": trial._trial_id, "number": trial.number})
                assert _until(worker, "progress") is not None
                step_s.append(time.perf_counter() - start)
            worker.close()
        jobs = _baseline_s(cfg, study, lock, ident, run_dir, slot, server, baselines) if baselines else {}
    finally:
        if server is not None:
            server.stop()
    return {"ready_s": [round(x, 3) for x in ready_s], "ready_median_s": round(statistics.median(ready_s), 3),
            "first_step_median_s": round(statistics.median(step_s), 3) if step_s else None,
            "idle_private_mb": statistics.median(private) if private else None,
            "fork_server": server is not None, **jobs}


def _status_s(tree: Path, study_file: Path, env: dict[str, str], n: int) -> float | None:
    if not n:
        return None
    times = []
    for _ in range(n):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "sweeper.cli", "status", str(study_file)],
                       cwd=study_file.parent, env=env, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return round(statistics.median(times), 3)


# the first sweep's model: a file beside the study (model.name module:Class)
NET = """from torch import nn


class Net(nn.Module):
    def __init__(self, n_features, lookback):
        super().__init__()
        self.linear = nn.Linear(n_features, 1)

    def forward(self, x):
        return self.linear(x[:, -1]).squeeze(-1)
"""
SWEEP = {**STUDY, "study": {**STUDY["study"], "name": "first", "n_trials": 2}, "model": {"name": "net:Net"}}


def _first_sweep(env: dict[str, str], n: int) -> dict:
    """n first sweeps, each in a new folder with an empty check cache: (wall, CPU) medians."""
    wall, cpu = [], []
    for _ in range(n):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            (folder / "net.py").write_text(NET)
            (folder / "study.yaml").write_text(yaml.safe_dump(SWEEP))
            before = os.times()
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "sweeper.cli", "run", "study.yaml"], cwd=folder, check=True,
                           env={**env, "SWEEPER_CACHE_DIR": str(folder / "cache")}, capture_output=True)
            wall.append(time.perf_counter() - start)
            after = os.times()
            cpu.append(after.children_user - before.children_user + after.children_system - before.children_system)
    return {"first_sweep_wall_median_s": round(statistics.median(wall), 3) if wall else None,
            "first_sweep_cpu_median_s": round(statistics.median(cpu), 3) if cpu else None}


def _tree(tree: Path, n: int, first_steps: int, status_n: int, baselines: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWEEPER_")}
    env["PYTHONPATH"] = str(tree)
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "startup.py"), "--measure", str(n),
                               "--first-steps", str(first_steps), "--baselines", str(baselines)], cwd=tmp, env=env, capture_output=True,
                              text=True, timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"{tree}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        study_file = Path(tmp) / "study.yaml"
        study_file.write_text(yaml.safe_dump(STUDY))
        out["status_median_s"] = _status_s(tree, study_file, env, status_n)
    out.update(_first_sweep(env, status_n))  # as many as `sweeper status` runs: none in a smoke
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--baseline", default="4298420")
    ap.add_argument("--quick", action="store_true", help="a smoke: 2 asks, 1 first step, 1 status each")
    ap.add_argument("--smoke", action="store_true", help="this tree only: 1 ask, 1 first step, no status")
    ap.add_argument("--measure", type=int, help=argparse.SUPPRESS)  # the per-tree child
    ap.add_argument("--first-steps", type=int, default=3, help=argparse.SUPPRESS)
    ap.add_argument("--baselines", type=int, default=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure is not None:
        print(json.dumps(measure(args.measure, args.first_steps, args.baselines)))
        return
    if args.smoke:  # the test suite's: no baseline tree, no status
        ours = _tree(ROOT, 1, 1, 0, 1)
        print(json.dumps({"benchmark": "startup", "n": 1, "smoke": True, "ours": ours}))
        return
    n, first_steps, status_n, baselines = (2, 1, 1, 1) if args.quick else (args.n, 3, 3, 3)
    base = Path(tempfile.mkdtemp(prefix="sweeper-baseline-")) / "tree"
    git = ["git", "-C", str(ROOT), "worktree"]
    subprocess.run([*git, "add", "--detach", str(base), args.baseline], check=True, capture_output=True)
    try:
        theirs = _tree(base, n, first_steps, status_n, baselines)
        ours = _tree(ROOT, n, first_steps, status_n, baselines)
    finally:
        subprocess.run([*git, "remove", "--force", str(base)], capture_output=True)
    for name, row in (("baseline", theirs), ("ours", ours)):
        print(f"{name}: READY median {row['ready_median_s']} s, first step {row['first_step_median_s']} s, "
              f"idle private {row['idle_private_mb']} MB, baseline job {row['baseline_slot_median_s']} s "
              f"({row['baseline_beyond_fit_median_s']} s beyond its fit), status {row['status_median_s']} s, "
              f"first sweep {row['first_sweep_wall_median_s']} s ({row['first_sweep_cpu_median_s']} s CPU)",
              flush=True)

    def ratio(key: str) -> float | None:
        a, b = theirs.get(key), ours.get(key)
        return round(a / b, 2) if a and b else None

    print(json.dumps({"benchmark": "startup", "n": n, "baseline_commit": args.baseline, "ours": ours,
                      "baseline": theirs, "ready_ratio": ratio("ready_median_s"),
                      "first_step_ratio": ratio("first_step_median_s"),
                      "status_ratio": ratio("status_median_s"),
                      "baseline_slot_ratio": ratio("baseline_slot_median_s"),
                      "idle_private_ratio": ratio("idle_private_mb"),
                      "first_sweep_wall_ratio": ratio("first_sweep_wall_median_s"),
                      "first_sweep_cpu_ratio": ratio("first_sweep_cpu_median_s")}))


if __name__ == "__main__":
    main()
