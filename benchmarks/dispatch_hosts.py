"""Dispatch overhead per trial: three hosts sharing one study against hosts on their own.

Each host is a real ``sweeper run STUDY`` process with its own SWEEPER_HOST_ID
and one CPU slot, running benchmarks/dispatch.py's tiny trials. Three set-ups:

- alone:    one host, its own study, ``--trials`` trials (the plain single host);
- separate: three hosts at once, each on its own study (own database, own run
            folder), ``--trials`` trials each;
- shared:   three hosts at once on ONE study with n_trials = 3 x ``--trials``.

On a small box the simulated hosts compete for the same cores, so "alone" is not
a fair baseline for three hosts: "separate" puts the same load on the machine,
and shared / separate isolates what sharing a study costs (the claim lock, one
database for every host's writes, stale checks over every host's trials, and
waiting at the end for the other hosts' last trials).

Two workloads: ``cpu`` is dispatch.py's tiny MLP, which keeps the cores busy
training; ``sleep`` swaps in a model that sleeps 0.25 s per step (tests/
fault_models.py ``Slow``), like a GPU-bound trial seen from the host's CPU, so
that the simulated hosts compete for the database rather than for the cores.

Overhead is benchmarks/dispatch.py's measure, per host: the driver process's
wall time beyond its trials' own training time (their ``duration_s``), summed
over the hosts and divided by the trials they ran. The steady-state figure
leaves out start-up and the final wait: per host, from its first trial's start
to its last trial's end, minus the training time.

    python benchmarks/dispatch_hosts.py [--trials 30] [--repeats 3] [--workload cpu|sleep]
                                        [--pg postgresql://127.0.0.1:5432/postgres]

The last line is JSON (seconds per trial, medians over repeats, and the ratios).
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
import uuid
from pathlib import Path

import optuna
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from dispatch import STUDY  # noqa: E402 - the single-host benchmark's trials, reused as they are

TESTS = Path(__file__).resolve().parent.parent / "tests"
SLEEP_MODEL = {"name": "fault_models:Slow", "step_sleep": 0.25, "hidden": 16}


def _write_study(folder: Path, n_trials: int, workload: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    raw = {**STUDY, "study": {**STUDY["study"], "name": "bench", "n_trials": n_trials}}
    if workload == "sleep":
        raw["model"] = SLEEP_MODEL
    (folder / "study.yaml").write_text(yaml.safe_dump(raw))


def _launch(hosts: list[tuple[Path, str | None]]) -> dict[str, tuple[Path, str | None, float]]:
    """Start every host at once; returns host id -> (folder, storage, wall seconds)."""
    procs = []
    for k, (folder, storage) in enumerate(hosts):
        extra = ["--storage", storage] if storage else []
        path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "SWEEPER_HOST_ID": f"host-{k}", "PYTHONPATH": path}
        procs.append((time.perf_counter(), subprocess.Popen(
            [sys.executable, "-m", "sweeper.cli", "run", "study.yaml", *extra], cwd=folder,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)))
    walls = {}
    for k, (started, proc) in enumerate(procs):
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"host-{k} exited {proc.returncode}: {err[-2000:]}")
        walls[f"host-{k}"] = (*hosts[k], time.perf_counter() - started)
    return walls


def _overheads(walls: dict[str, tuple[Path, str | None, float]]) -> tuple[float, float, int]:
    """(whole-run overhead, steady-state overhead) in s/trial, and the trial count."""
    from sweeper.store import open_storage

    whole = steady = 0.0
    n = 0
    for host, (folder, storage, wall) in walls.items():
        url = storage or f"sqlite:///{folder}/runs/bench/study.db"
        trials = [t for t in optuna.load_study(study_name="bench", storage=open_storage(url)).get_trials()
                  if t.user_attrs.get("host") == host]
        busy = sum(t.user_attrs.get("duration_s", 0.0) for t in trials)
        window = (max(t.datetime_complete for t in trials) - min(t.datetime_start for t in trials)).total_seconds()
        whole += wall - busy
        steady += window - busy
        n += len(trials)
    return whole / n, steady / n, n


def _fresh_pg(admin: str) -> tuple[str, callable]:
    import psycopg
    import sqlalchemy

    name = f"sweeper_bench_{uuid.uuid4().hex[:10]}"
    conn = psycopg.connect(admin, autocommit=True)
    conn.execute(f'CREATE DATABASE "{name}"')
    url = sqlalchemy.engine.make_url(admin).set(drivername="postgresql+psycopg", database=name)

    def drop() -> None:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.close()

    return url.render_as_string(hide_password=False), drop


def _measure(mode: str, trials: int, pg: str | None, workload: str) -> tuple[float, float]:
    n_hosts, shared = {"alone": (1, False), "separate": (3, False), "shared": (3, True)}[mode]
    drops = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            hosts: list[tuple[Path, str | None]] = []
            for k in range(n_hosts):
                if shared and k > 0:
                    hosts.append(hosts[0])  # the same folder and database
                    continue
                folder = Path(tmp) / ("shared" if shared else f"host-{k}")
                _write_study(folder, n_hosts * trials if shared else trials, workload)
                url = None
                if pg:
                    url, drop = _fresh_pg(pg)
                    drops.append(drop)
                hosts.append((folder, url))
            whole, steady, n = _overheads(_launch(hosts))
        finally:
            for drop in drops:
                drop()
    print(f"  {workload} {mode:8s} {n_hosts} host(s), {n} trials, {'postgresql' if pg else 'sqlite'}: "
          f"{whole:.3f} s/trial whole run, {steady:.3f} s/trial steady", flush=True)
    return whole, steady


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=30, help="trials per host")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workload", choices=("cpu", "sleep"), default="cpu")
    parser.add_argument("--pg", default=None, metavar="ADMIN_URL", help="also measure on PostgreSQL")
    args = parser.parse_args()
    result: dict[str, float | int | str] = {"workload": args.workload, "trials_per_host": args.trials,
                                            "repeats": args.repeats}
    for label, pg in [("", None)] + ([("pg_", args.pg)] if args.pg else []):
        runs: dict[str, list[tuple[float, float]]] = {"alone": [], "separate": [], "shared": []}
        for _ in range(args.repeats):  # interleaved, so that load on the box hits every mode alike
            for mode in runs:
                runs[mode].append(_measure(mode, args.trials, pg, args.workload))
        for mode, values in runs.items():
            result[f"{label}{mode}_s_per_trial"] = round(statistics.median(v[0] for v in values), 4)
            result[f"{label}{mode}_steady_s_per_trial"] = round(statistics.median(v[1] for v in values), 4)
        for kind in ("", "steady_"):
            shared = result[f"{label}shared_{kind}s_per_trial"]
            for base in ("alone", "separate"):
                result[f"{label}{kind}ratio_shared_vs_{base}"] = round(shared / result[f"{label}{base}_{kind}s_per_trial"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
