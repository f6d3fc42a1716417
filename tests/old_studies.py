"""Two small studies written by the code of d1a4397 (before issue 39 changed how a trial's files
are laid out), checked in as ``tests/fixtures/old_studies.tar.gz``: tests/test_old_studies.py
unpacks them and runs every command on them, so today's code must still read, resume, pick the
best of, predict with, refit, collect and report a study its users already have on disk.

- ``holdout``: 5 trials of one run each (holdout split, one seed, a median pruner), 4 epochs;
- ``walk_forward``: 4 trials of 2 folds x 2 seeds, trained as one stack of 4 (``train.max_stack``).

In each, the last trial was interrupted (SIGINT to the driver) once it had saved its first
epoch's checkpoint: it is FAIL (``stop_reason: interrupted``) with a mid-run ``checkpoint.pt``
(the walk-forward one a stack's), which ``sweeper resume`` must continue. What the archive holds
is in :data:`EXPECTED`, read back by the test.

Regenerate (a few seconds; the interruption is retried until it lands mid-trial)::

    git worktree add /tmp/old d1a4397
    python tests/old_studies.py --write /tmp/old

The studies are swept by ``python -m sweeper.cli`` with ``PYTHONPATH`` at that worktree, whose
``sweeper`` shadows the installed one.
"""
from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from conftest import real_env

TESTS = Path(__file__).parent
ARCHIVE = TESTS / "fixtures" / "old_studies.tar.gz"
COMMIT = "d1a4397"

BASE: dict[str, Any] = {
    "study": {"n_trials": 5, "heartbeat_interval": 1, "grace_period": 4,
              "sampler": {"name": "random", "seed": 0},
              "pruner": {"name": "median", "options": {"n_startup_trials": 2, "n_warmup_steps": 2}}},
    "data": {"synthetic": {"assets": 24, "dates": 200, "features": 3, "seed": 1}, "lookback": 5},
    "model": {"name": "mlp", "hidden_size": 8, "num_layers": 1},
    "train": {"epochs": 4, "batch_size": 128, "samples_per_epoch": 1024, "patience": 5},
    "devices": {"gpus": "none", "cpu_workers": 1},
    "search_space": {"train.lr": {"type": "float", "low": 0.001, "high": 0.01, "log": True}},
    "report": {"baseline": None},
}
NAMES = ("holdout", "walk_forward")


def study(name: str) -> dict[str, Any]:
    """The study file of ``holdout`` or ``walk_forward`` (its study is named ``old_<name>``)."""
    raw = copy.deepcopy(BASE)
    raw["study"]["name"] = f"old_{name}"
    if name == "walk_forward":
        raw["study"]["n_trials"] = 4
        raw["validation"] = {"scheme": "walk_forward", "folds": 2, "repeats": 2}
        raw["train"]["max_stack"] = 4
    return raw


def unpack(dest: Path) -> dict[str, Path]:
    """The archive unpacked into ``dest``: each study's folder (its ``study.yaml`` and ``runs/``)."""
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(dest, filter="data")
    return {name: dest / name for name in NAMES}


def expected() -> dict[str, Any]:
    """What the archive's studies hold (``old_studies.json`` beside it, written with it)."""
    return json.loads((ARCHIVE.parent / "old_studies.json").read_text())


# ------------------------------------------------------------------ writing the archive

def _env(code: Path, cache: Path) -> dict[str, str]:
    env = real_env()
    env.update(PYTHONPATH=str(code), OMP_NUM_THREADS="1", SWEEPER_CACHE_DIR=str(cache))
    return env


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (the fork server and its workers, which have groups of their own)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _sweep_and_interrupt(root: Path, name: str, env: dict[str, str]) -> int:
    """``sweeper run`` until the last trial saves its first checkpoint, then SIGINT: every process
    below the driver is stopped first, so the trial cannot finish before the stop reaches it."""
    raw = study(name)
    last = raw["study"]["n_trials"] - 1
    checkpoint = root / "runs" / raw["study"]["name"] / "trials" / str(last) / "checkpoint.pt"
    driver = subprocess.Popen([sys.executable, "-m", "sweeper.cli", "run", "study.yaml"], cwd=root, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while not checkpoint.exists() and driver.poll() is None:
        time.sleep(0.001)
    below = _descendants(driver.pid)
    for pid in below:
        os.kill(pid, signal.SIGSTOP)
    driver.send_signal(signal.SIGINT)
    time.sleep(0.5)
    for pid in below:
        os.kill(pid, signal.SIGCONT)
    out, _ = driver.communicate(timeout=120)
    print(out[-2000:])
    return driver.returncode


def _record(root: Path, name: str, code: Path) -> dict[str, Any]:
    """The stored facts the test checks, read with the old code (in a child, at ``code``)."""
    script = f"""
import json, optuna
from sweeper.core.checkpoint import checkpoint_meta
s = optuna.load_study(study_name="old_{name}", storage="sqlite:///runs/old_{name}/study.db")
out = {{"best": s.best_trial.number, "best_value": s.best_value,
       "trials": [{{"number": t.number, "state": t.state.name, "value": t.value, "params": t.params,
                   "stop_reason": t.user_attrs.get("stop_reason")}} for t in s.trials]}}
last = s.trials[-1].number
meta = checkpoint_meta(f"runs/old_{name}/trials/{{last}}/checkpoint.pt")
out["checkpoint"] = {{"trial": last, "epoch": meta and meta["epoch"], "owner": meta and meta["owner"]}}
print(json.dumps(out))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=root, env={**os.environ, "PYTHONPATH": str(code)},
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def _interrupted_mid_run(record: dict[str, Any], epochs: int) -> bool:
    last = record["trials"][-1]
    ended = [t["state"] for t in record["trials"][:-1]]
    epoch = record["checkpoint"]["epoch"]
    return (last["state"] == "FAIL" and last["stop_reason"] == "interrupted" and set(ended) <= {"COMPLETE", "PRUNED"}
            and epoch is not None and 1 <= epoch < epochs)


def write(code: Path) -> None:
    """Sweep both studies with the code at ``code`` and write the archive and its record."""
    records = {}
    with tempfile.TemporaryDirectory() as tmp:
        top, cache = Path(tmp) / "studies", Path(tmp) / "cache"
        for name in NAMES:
            for attempt in range(5):
                root = top / name
                if root.exists():
                    subprocess.run(["rm", "-rf", str(root)], check=True)
                root.mkdir(parents=True)
                (root / "study.yaml").write_text(yaml.safe_dump(study(name), sort_keys=False))
                code_rc = _sweep_and_interrupt(root, name, _env(code, cache))
                records[name] = _record(root, name, code)
                if code_rc == 130 and _interrupted_mid_run(records[name], BASE["train"]["epochs"]):
                    break
                print(f"{name}: attempt {attempt + 1} did not interrupt the last trial mid-run; again")
            else:
                raise SystemExit(f"{name}: could not interrupt the last trial mid-run")
        ARCHIVE.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(ARCHIVE, "w:gz") as tar:
            for name in NAMES:
                tar.add(top / name, arcname=name)
    records["commit"] = COMMIT
    (ARCHIVE.parent / "old_studies.json").write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
    print(f"wrote {ARCHIVE} ({ARCHIVE.stat().st_size} bytes)")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--write":
        sys.exit(f"usage: python tests/old_studies.py --write <worktree of {COMMIT}>")
    write(Path(sys.argv[2]).resolve())
