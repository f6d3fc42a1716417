"""A swept study's observable record, with what varies from run to run taken out: what the
one-pipeline refactor (issue 27) must leave identical for a holdout and a walk-forward study.

``python tests/pipeline_snapshot.py --write`` sweeps both studies and writes
``tests/golden/<CPU>/<name>.json``; ``tests/test_pipeline_golden.py`` sweeps them again and
compares. <CPU> is the kernel level torch runs on this CPU (``torch.backends.cpu.
get_cpu_capability()``: AVX2, AVX512) and the CPU's vendor (``GenuineIntel``, ``AuthenticAMD``):
the same code rounds differently on each (a matmul's kernels differ by level, and the BLAS picks
its code paths by vendor: an AMD EPYC and an Intel Xeon, both AVX512, differ by up to 1e-4
relative after 3 epochs), so each has its own record, on CPU with one thread per worker, so every
float is compared exactly. AVX2-GenuineIntel's was written on 2026-12-01 by the code of the
commit before the refactor began (83f89dc; the trials' stored predictions, which issue 28 added,
were added to it by that change). AVX512-GenuineIntel's was written on 2026-12-02 by b31a5da,
and AVX512-AuthenticAMD's on 2026-12-03 by 1aef0c5, each after 83f89dc's record on the same
machine was found to differ from it only by those stored predictions.

A CPU with no record of its own is compared with another one's (the same level's first) within
float rounding: floats to a relative 1e-3 (or 1e-6 absolute), and the digests of float tables and
tensors are not compared; every param, state, count, name and text still compares exactly. Write
its own record (below, with a worktree of 83f89dc) to compare it exactly.

``train.max_stack`` (issue 29, stacked runs) postdates the records and is taken out of every
stored config (and ``config_hash``, the hash of a config that has it, with it), and so are the
stack size's attributes (issue 39: ``stack_size``, ``stack_size_from``, ``stack_rates``) and
``study.population`` (issue 40); the walk-forward study sets ``train.max_stack`` to 1, so that its
record still guards the path of one run after another exactly (stacking's own equivalence is
tests/test_stacked_core.py's and tests/test_member_dropout.py's).

The stacked record (``walk_forward_stacked``: the walk-forward study's 4 runs as one stack of 4)
is AVX512-GenuineIntel's alone, written on 2026-12-05 by the code of 47ebc4b, when a member of a
stack of several came to draw exactly its lone run's dropout masks (issue 40): that changed the
stacked training (the study's MLP has dropout 0.1: its trial 0's value came to the one-by-one
record's to 5e-6, where the earlier record's was 2 % off); and written again the same day by
9f646ac, when the stacked AdamW came to work its update's scalars out in double as torch's does
(trial 0's value is now the one-by-one record's to 1.1e-7). It replaced AVX512-AuthenticAMD's,
written by d1a4397 before the one core (issue 39), which could not be rewritten on the Intel box:
an AMD CPU now compares within rounding against Intel's. Written by the one core's code, it
compares exactly on its own CPU, as the others do. On an Intel Xeon with AMX tiles (a 2-core box of
2026-12-05, session 7) the holdout and one-by-one records compare exactly, but the stacked route's
batched kernels round otherwise (trial values 8e-8 relative apart), so that CPU (``-AMX``) has its
own stacked record, written there by the same code, 9f646ac; for the others it takes its family's.
An AMD EPYC without AVX512 (AVX2, a 2-core box of 2026-12-05, session 8) compared within rounding
with AVX2-GenuineIntel's; its own three records were written there by da787f2.

Issue 39 laid a holdout trial out as the 1 x 1 case of every trial's layout, after the records:
its one run keeps its files in ``runs/fold-1.seed-1/`` as any run does, and the trial takes its
model's files from there, so the trial's own files keep their names and values. The holdout
record is compared in that layout (:func:`one_run_layout`): the old names are mapped to the new
ones (the run's folder holds copies of three of the trial's files, ``RUN_COPIES``, each compared
with the record's trial-level file); the two files the record cannot have (the run's
``result.json`` and its training's valid frame) are left out; and the columns that now name the
run in ``metrics.csv`` rows and ``daily_ic_valid.csv`` (``fold``, ``repeat``: 1) are taken out.
Every value compares exactly still.

On 2026-12-07 every ``walk_forward*`` record was edited by hand, not rewritten: under walk-forward
``best`` no longer shows the study's valid oracle (it covered ``data.split``'s valid block, where the
trials' val_ic is the folds' mean), so each record's ``best.oracle_val_ic`` became null and its
``best.val_ic_oracle_fraction`` was removed; nothing else in them changed.

Taken out (they vary between two runs of the same code): wall times and throughput, memory
peaks, pids, host names, driver ids, uuids (the study's and the artifact store's ids), the
environment, and the text of log files (their lines carry times). Kept: every param, state,
value, intermediate value, user attribute, study attribute, ``best --json``, ``export``'s
table, and every file under the run folder: its name, and its content (CSV and JSON rows,
Parquet frames, YAML text, the tensors of a ``.pt`` file).
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from conftest import real_env

TESTS = Path(__file__).parent
GOLDEN = TESTS / "golden"

VOLATILE = {"duration_s", "final_scoring_s", "driver_id", "driver_pid", "pid", "pid_ns", "hostname", "host",
            "peak_mem_mb", "samples_per_s", "study_uuid", "environment", "sweeper_version", "probe_peak_mem_mb",
            "datetime_start", "datetime_complete", "heartbeat", "started_at"}
# keys added after the records: config keys and the hash of a config that holds them (see the docstring),
# and best --json's scored_on and its ensemble's alone (issue 42: which dates each figure covers), and the
# study's model_fingerprint (a user model's files; None for the records' built-in MLP)
NEWER = {"max_stack", "train.max_stack", "config_hash", "stack_size", "stack_size_from", "stack_rates",
         "scored_on", "alone", "population", "study.population", "trials_without_files", "model_fingerprint"}
# train.max_stack and study.population in a config.yaml
NEWER_KEY_LINE = re.compile(r"^  (max_stack|population): .*\n", re.MULTILINE)
VOLATILE_FILES = {"study.db", "study.db.lock", "owner.json", "devices.csv"}

BASE: dict[str, Any] = {
    "study": {"name": "golden", "n_trials": 3, "heartbeat_interval": 1, "grace_period": 4,
              "sampler": {"name": "random", "seed": 0},
              "pruner": {"name": "median", "options": {"n_startup_trials": 1, "n_warmup_steps": 0}}},
    "data": {"synthetic": {"assets": 24, "dates": 200, "features": 3, "seed": 1}, "lookback": 5},
    "model": {"name": "mlp", "hidden_size": 8, "num_layers": 1},
    # the records' evaluation batch (auto measures one on a CPU since issue 41: a timing, not a record)
    "train": {"epochs": 3, "batch_size": 128, "samples_per_epoch": 1024, "patience": 5, "eval_batch_size": 16384},
    "devices": {"gpus": "none", "cpu_workers": 1},
    "search_space": {"train.lr": {"type": "float", "low": 0.001, "high": 0.01, "log": True}},
    "report": {"baseline": None},
}


SCHEMES = ("holdout", "walk_forward", "walk_forward_stacked")


def study(name: str) -> dict[str, Any]:
    """The study file of ``holdout`` (3 trials, 1 seed), ``walk_forward`` (2 folds x 2 seeds,
    one run after another) or ``walk_forward_stacked`` (the same 4 runs as one stack of 4)."""
    raw = copy.deepcopy(BASE)
    if name.startswith("walk_forward"):
        raw["validation"] = {"scheme": "walk_forward", "folds": 2, "repeats": 2}
        raw["train"]["max_stack"] = 4 if name == "walk_forward_stacked" else 1
    return raw


def sweep(root: Path, name: str) -> Path:
    """``sweeper run`` of the study in ``root`` (one worker, one thread); returns its run folder."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "study.yaml").write_text(yaml.safe_dump(study(name)))
    env = real_env()
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run([sys.executable, "-m", "sweeper.cli", "run", "study.yaml"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return root / "runs" / "golden"


def snapshot(root: Path) -> dict[str, Any]:
    """The record of the study swept in ``root`` (see the module docstring)."""
    import optuna

    folder = root / "runs" / "golden"
    stored = optuna.load_study(study_name="golden", storage=f"sqlite:///{folder / 'study.db'}")
    trials = [{"number": t.number, "state": t.state.name, "value": t.value, "params": t.params,
               "intermediate": {str(k): v for k, v in sorted(t.intermediate_values.items())},
               "user_attrs": _clean(t.user_attrs),
               "artifacts": sorted(json.loads(v)["filename"] for k, v in t.system_attrs.items()
                                   if k.startswith("artifacts:")),
               "system_attrs": _clean({k: v for k, v in t.system_attrs.items()
                                       if not k.startswith("artifacts:")})}
              for t in stored.trials]
    return _plain({"study_attrs": _clean(stored.user_attrs), "direction": stored.direction.name,
                   "trials": trials, "best": _clean(_cli_json(root, "best")),
                   "export": _export(root), "files": _files(folder)})


def _cli_json(root: Path, command: str) -> Any:
    # read-side commands in this process (the sweep, above, is the process under record)
    from conftest import sweeper_cli

    return json.loads(sweeper_cli(root, command, "study.yaml", "--json").stdout)


def _export(root: Path) -> Any:
    import pandas as pd

    from conftest import sweeper_cli

    out = root / "trials.parquet"
    sweeper_cli(root, "export", "study.yaml", "-o", str(out))
    frame = pd.read_parquet(out)
    keep = [c for c in frame.columns if c.split(".")[-1] not in VOLATILE | NEWER]
    return {"columns": keep, "rows": json.loads(frame[keep].to_json(orient="records", double_precision=15, date_format="iso"))}


def _files(folder: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if path.name in VOLATILE_FILES or path.name.startswith("study.db") or rel.startswith("artifacts/"):
            continue
        content = _content(path)
        text = json.dumps(_plain(content), sort_keys=True)
        # a large table (a run's valid predictions) is kept as its digest: a diff names the file
        out[rel] = content if len(text) < 20000 else {"digest": hashlib.sha256(text.encode()).hexdigest()}
    out["artifacts/ (count)"] = sum(1 for p in (folder / "artifacts").rglob("*") if p.is_file())
    return out


def _content(path: Path) -> Any:
    import pandas as pd
    import torch

    if path.suffix == ".log":
        return "(log)"
    if path.suffix == ".csv":
        frame = pd.read_csv(path)
        return json.loads(frame[[c for c in frame.columns if c not in VOLATILE]].to_json(
            orient="split", double_precision=15, date_format="iso"))
    if path.suffix == ".parquet":
        return json.loads(pd.read_parquet(path).to_json(orient="split", double_precision=15, date_format="iso"))
    if path.suffix == ".json":
        return _clean(json.loads(path.read_text()))
    if path.suffix == ".pt":
        state = torch.load(io.BytesIO(path.read_bytes()), map_location="cpu", weights_only=False)
        return _tensors(state)
    try:
        return NEWER_KEY_LINE.sub("", path.read_text())
    except UnicodeDecodeError:
        return f"(binary {path.name})"


def _tensors(obj: Any) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return {"shape": list(obj.shape), "sha": hashlib.sha256(obj.detach().contiguous().numpy().tobytes())
                .hexdigest()[:16]}
    if isinstance(obj, dict):
        return {str(k): _tensors(v) for k, v in obj.items() if str(k) not in VOLATILE and str(k) not in NEWER}
    if isinstance(obj, (list, tuple)):
        return [_tensors(v) for v in obj]
    return obj


def _clean(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in sorted(obj.items()) if k not in VOLATILE and k not in NEWER}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    return obj


def _plain(obj: Any) -> Any:
    """JSON's form (NaN as the string "nan", tuples as lists), so a read-back compares equal."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return repr(obj)
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


# What issue 29 redefined for a study with seed repeats: its model is the last fold's seed
# ensemble, so every figure and file of the model's test scores and stored predictions (and what
# is computed from them) differs from the records by design. The walk-forward study (2 seeds)
# is compared without them; its training, valid scores, values, intermediate values and every
# other file still compare exactly, and the ensemble's own figures are tests/test_walk_forward.py's
# and tests/test_stored_predictions.py's. The holdout study (1 seed) is compared whole.
# And on 2026-12-07 the figures study.constraints judges (every trial records them) came to be each fold's
# seed ensemble's, which the trial deploys, not its first seed's: they differ from every record of a study
# with seed repeats (the walk-forward ones, the stacked included) by design; tests/test_walk_forward.py
# checks them against the runs' own valid predictions.
MODEL_FIGURES = {"valid_top_turnover", "valid_long_short_sharpe"}
ENSEMBLE_KEYS = {"test_ic", "test_rank_ic", "test_icir", "seed_test_ic", "seed_test_rank_ic",
                 "test_ic_oracle_fraction", "members", "portfolio", "ic_by_year", "artifacts", *MODEL_FIGURES}
ENSEMBLE_FILES = re.compile(r"(^|/)(daily_ic_test\.csv|predictions_test\.parquet|weights\.seed-\d+\.pt)$"
                            r"|^trials/\d+/predictions_valid\.parquet$|^trials/\d+/runs/[^/]+/norm_stats\.json$"
                            r"|^artifacts/ \(count\)$")


# a holdout trial's one run (issue 39, see the docstring): which of the trial's files its folder
# holds a copy of, which of its files are new, and the columns that name it in the trial's tables
ONE_RUN = "runs/fold-1.seed-1/"
RUN_COPIES = ("daily_ic_valid.csv", "daily_ic_test.csv", "norm_stats.json")
NEW_IN_ONE_RUN = re.compile(r"^trials/\d+/runs/fold-1\.seed-1/(result\.json|predictions_valid\.parquet)$")
TRIAL_FILE = re.compile(r"^trials/\d+/[^/]+$")
RUN_COLUMNS = {"fold", "repeat"}


def one_run_layout(record: Any) -> Any:
    """A holdout snapshot in the 1 x 1 layout (see the docstring): a record's trial files mapped
    to their copies in ``runs/fold-1.seed-1/`` (a new snapshot has its own there), what no record
    can have left out, and the run's columns taken out of the trial's tables."""
    out = copy.deepcopy(record)
    files = out["files"]
    for name in [n for n in files if TRIAL_FILE.match(n)]:
        folder, base = name.rsplit("/", 1)
        if base in ("metrics.csv", "daily_ic_valid.csv") and "columns" in files[name]:
            files[name] = _without_columns(files[name], RUN_COLUMNS)
        if base in RUN_COPIES:
            files.setdefault(f"{folder}/{ONE_RUN}{base}", files[name])
    out["files"] = {name: v for name, v in files.items() if not NEW_IN_ONE_RUN.match(name)}
    return out


def comparable(record: Any, scheme: str) -> Any:
    """``record`` less what the seed ensemble redefined (``walk_forward``); holdout's in the 1 x 1
    layout (:func:`one_run_layout`); the stacked record, written by the one core, less only the
    constraint figures (:data:`MODEL_FIGURES`)."""
    if scheme == "holdout":
        return one_run_layout(record)
    keys = MODEL_FIGURES if scheme == "walk_forward_stacked" else ENSEMBLE_KEYS
    out = _drop(record, keys)
    out["files"] = {name: _drop(v, keys) for name, v in record["files"].items()
                    if keys is MODEL_FIGURES or not ENSEMBLE_FILES.search(name)}
    out["export"] = {"columns": [c for c in record["export"]["columns"] if c.split(".")[-1] not in keys],
                     "rows": _drop(record["export"]["rows"], keys)}
    return out


def _without_columns(table: Any, names: set[str]) -> Any:
    """A CSV file's content (pandas' ``split`` orient) less the columns ``names``."""
    keep = [i for i, c in enumerate(table["columns"]) if c not in names]
    return {**table, "columns": [table["columns"][i] for i in keep],
            "data": [[row[i] for i in keep] for row in table["data"]]}


def _drop(obj: Any, keys: set[str] = ENSEMBLE_KEYS) -> Any:
    if isinstance(obj, dict):
        return {k: _drop(v, keys) for k, v in obj.items() if k.split(".")[-1] not in keys}
    if isinstance(obj, list):
        return [_drop(v, keys) for v in obj]
    return obj


def cpu_level() -> str:
    """The kernel level torch picks on this CPU (AVX2, AVX512, ...)."""
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


def cpu() -> str:
    """The golden records' folder for this CPU: its kernel level and its vendor, and ``-AMX`` where it
    has AMX tiles (see the docstring)."""
    vendor, amx = "unknown", False
    try:
        with open("/proc/cpuinfo") as info:
            lines = info.read().splitlines()
        found = [line.split(":", 1)[1].strip() for line in lines if line.startswith("vendor_id")]
        vendor = found[0] if found else vendor
        amx = any(line.startswith("flags") and "amx_tile" in line.split() for line in lines)
    except OSError:
        pass
    return f"{cpu_level()}-{vendor}" + ("-AMX" if amx else "")


# Records written before the final scoring predicted test on its present rows (issue 41, 2026-12-05):
# it predicted the labelled rows alone, in batches of their own, so the last batch's rows went through
# a matmul of another height, and their IC differed from the stored predictions' own (the file, which
# ``sweeper predict`` reproduces, is unchanged) in the last bits (1e-10 relative on Intel). In such a
# record a leaf scored on test (a path that names test, the predictions' digest aside) compares within
# rounding; every other leaf as before. AVX512-GenuineIntel's holdout record had those leaves patched to
# that code's values (its files' digests did not move).
TEST_ROWS_BEFORE = {"AVX512-AuthenticAMD/holdout", "AVX2-GenuineIntel/holdout"}
SCORED_ON_TEST = re.compile(r"test(?!\.parquet/digest)")
# Stacked records written before a seed ensemble's value came from its seeds' model frames (5dd1eff, issue
# 41): in a stack the training's valid predictions and the frames differ in the last bits, so the model
# fold's seed-ensemble valid IC moved (4e-8 relative on an Intel Xeon with AMX, found there by bisection).
# In such a record a leaf naming it compares within rounding; every other leaf as before.
ENSEMBLE_BEFORE = {"AVX512-GenuineIntel/walk_forward_stacked", "AVX512-GenuineIntel-AMX/walk_forward_stacked"}
SEED_ENSEMBLE = re.compile(r"seed_ensemble_val_ic")


def compare(scheme: str, got: Any) -> list[str]:
    """Where the snapshot ``got`` (:func:`comparable`) differs from this CPU's record of ``scheme``."""
    record, exact = golden(scheme)
    want = comparable(record, scheme)
    lines = diff(want, got, exact=exact)
    written = f"{record_folder(scheme).name}/{scheme}"  # which record: the sets above name records
    loose = [pattern for pattern, before in ((SCORED_ON_TEST, TEST_ROWS_BEFORE),
                                             (SEED_ENSEMBLE, ENSEMBLE_BEFORE)) if written in before]
    if exact and loose:  # (exact: the record is this CPU's own)
        rounding = set(diff(want, got, exact=False))
        lines = [line for line in lines
                 if line in rounding or not any(p.search(line.split(": ")[0]) for p in loose)]
    return lines


def golden(scheme: str) -> tuple[Any, bool]:
    """The record of ``scheme`` (less what postdates it: NEWER) and whether it is this CPU's own, to
    compare exactly (an AMX CPU without a record of its own takes its family's: ``AVX512-GenuineIntel``
    for ``AVX512-GenuineIntel-AMX``); else another CPU's, the same level's first, within rounding."""
    folder, mine = record_folder(scheme), cpu()
    own = folder.name in (mine, mine.removesuffix("-AMX"))
    return _clean(json.loads((folder / f"{scheme}.json").read_text())), own


def record_folder(scheme: str) -> Path:
    """The folder of the record :func:`golden` compares ``scheme`` with: this CPU's, its family's, the
    same level's first, any."""
    mine, level = cpu(), cpu_level() + "-"
    records = sorted((p for p in GOLDEN.iterdir() if (p / f"{scheme}.json").exists()),
                     key=lambda p: (p.name != mine, mine.removesuffix("-AMX") != p.name,
                                    not p.name.startswith(level), p.name))
    if not records:
        raise AssertionError(f"no golden record in {GOLDEN}: run `python tests/pipeline_snapshot.py --write` "
                             "with PYTHONPATH at a worktree of 83f89dc")
    return records[0]


# a leaf under these keys hashes floats (a large table's digest, a tensor's sha): equal only exactly
HASHES = {"digest", "sha"}


def diff(want: Any, got: Any, where: str = "", exact: bool = True) -> list[str]:
    """Where ``got`` differs from ``want``: one line per differing leaf. ``exact=False``: floats
    within rounding (relative 1e-3, absolute 1e-6) and hashes of floats not compared."""
    if isinstance(want, dict) and isinstance(got, dict):
        lines = [f"{where}/{k}: missing" for k in want if k not in got]
        lines += [f"{where}/{k}: unexpected" for k in got if k not in want]
        for key in want:
            if key in got and (exact or key not in HASHES):
                lines += diff(want[key], got[key], f"{where}/{key}", exact)
        return lines
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        return [line for i, (a, b) in enumerate(zip(want, got))
                for line in diff(a, b, f"{where}[{i}]", exact)]
    if not exact and _rounded(want, got) and math.isclose(want, got, rel_tol=1e-3, abs_tol=1e-6):
        return []
    if not exact and all(isinstance(v, str) and v.startswith("[") for v in (want, got)):
        with contextlib.suppress(ValueError):  # export's list columns are JSON text: compare their floats
            return diff(json.loads(want), json.loads(got), where, exact)
    return [] if want == got else [f"{where}: {str(want)[:200]} != {str(got)[:200]}"]


def _rounded(want: Any, got: Any) -> bool:
    """Two numbers of which one at least is a float (a count, two ints, compares exactly)."""
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (want, got))
    return numbers and (isinstance(want, float) or isinstance(got, float))


if __name__ == "__main__":
    import tempfile

    if "--write" not in sys.argv:
        sys.exit(f"usage: python tests/pipeline_snapshot.py --write [{' '.join(SCHEMES)}]")
    folder = GOLDEN / cpu()
    folder.mkdir(parents=True, exist_ok=True)
    for scheme in [a for a in sys.argv[1:] if a in SCHEMES] or SCHEMES:
        with tempfile.TemporaryDirectory() as tmp:
            sweep(Path(tmp), scheme)
            (folder / f"{scheme}.json").write_text(json.dumps(snapshot(Path(tmp)), indent=1, sort_keys=True)
                                                   + "\n")
        print(f"wrote {folder / (scheme + '.json')}")
