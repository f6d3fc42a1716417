"""Populations (issue 40): trials per minute and the sampler's efficiency, ``study.population: auto``
against ``1``, on the CPU.

Every sweep is a real ``python -m sweeper.cli run <study>`` process, as a user would run it, on a copy
of ``studies/{mlp,lstm,transformer}_ic.yaml`` (the default synthetic panel, 300 assets x 1,000 dates x
16 features, lookback 20; the study's search space, sampler (TPE, seed 7), pruner and devices
(``cpu_workers: auto``: two slots on a 2-core box)) in a temporary folder of its own. The two arms
differ in ``study.population`` alone (``auto`` or ``1``); what is shrunk for a 2-core box, both arms
alike: ``train.epochs`` 2 (3 for the sample efficiency), ``train.samples_per_epoch`` 8,192 (the
files: 65,536, the transformer's 32,768), ``study.timeout`` (the budget below) with ``study.n_trials``
10,000, and ``report.baseline: null`` (the LightGBM baseline is fitted once per study whatever the
population: it would only take a slot's minute from both arms). The sweeps share a panel cache of the
benchmark's own (``SWEEPER_CACHE_DIR``) whose kept stack sizes are removed before each sweep, so that
every ``auto`` sweep measures on the box as it is then (and pays for it) rather than reusing the
first sweep's measurement, as a host's second study of the same shape would.

**Throughput** (``--models``, ``--pairs``, ``--budget``): per model, ``--pairs`` pairs of sweeps of
``study.timeout`` seconds each (no trial starts after it, the running ones finish), populations on
then off, the next pair off then on, so both arms meet the same load. ``per_min``: the trials that
finished (COMPLETE + PRUNED, from the store) per minute of the store's span, from the first trial's
start to the last one's end (the stack size's measurement included, the process's start-up not);
``per_wall_min``: per minute of the whole process, start-up included. ``ratio``: the median over
pairs of on / off ``per_min``. ``population``: what ``auto`` chose in each sweep (the study's
``stack_size`` attribute, its ``population_size``; 1 when absent) with the rates it chose on;
``trained``: how many populations of each size trained (the trials' own ``population`` lists: the
last claims of a budget, and a retry, can be smaller than the size chosen).

**Sample efficiency** (``--trials``, ``--data-seeds``): the MLP study, ``--trials`` trials
(``study.n_trials``, no timeout) with populations on and off on each of ``--data-seeds`` panels
(``data.synthetic.seed`` 0, 1, ...; the arms alternate which runs first); ``best``: the highest
``val_ic`` of the COMPLETE trials numbered below ``--trials``. The check: the median over data
seeds of on - off is within one standard error (of those per-seed differences) of 0.

    python benchmarks/population.py [--models mlp,lstm,transformer] [--pairs 3]
                                    [--budget mlp=60,lstm=75,transformer=100]
                                    [--trials 32] [--data-seeds 5] [--no-throughput | --no-efficiency]
                                    [--file-length] [--smoke]

``--file-length``: the sweeps train the study file's own ``train.epochs`` and
``train.samples_per_epoch`` (the efficiency's 3 epochs aside), where a trial's training outweighs
its fixed cost as it does in a real sweep.

``--smoke`` (a tiny panel, 1 epoch of 1,024 samples, the MLP, one pair of 4 s sweeps and one data
seed of 4 trials: four ``sweeper run`` processes, 25 s on a quiet 2-core box, about a minute while
other work loads it) runs every path for the test suite. The last line is JSON:
{"throughput": {model: {...}}, "efficiency": {...}, "checks": {...}}.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SHRUNK = {"train.epochs": 2, "train.samples_per_epoch": 8192, "report.baseline": "null"}
SMOKE = {"data.synthetic.assets": 40, "data.synthetic.dates": 200, "data.synthetic.features": 4,
         "data.lookback": 5, "train.epochs": 1, "train.samples_per_epoch": 1024, "report.baseline": "null"}
BUDGET = {"mlp": 60.0, "lstm": 75.0, "transformer": 100.0}
FINISHED = ("COMPLETE", "PRUNED")


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _sweep(model: str, sets: dict[str, Any], cache: str) -> dict[str, Any]:
    """``sweeper run`` of a copy of ``model``'s study with ``sets``, in a folder of its own, the panel
    cache in ``cache`` (its kept stack sizes removed first): what the store holds of it afterwards."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory(prefix=f"population-{model}-") as tmp:
        study_file = Path(tmp) / f"{model}_ic.yaml"
        shutil.copy(ROOT / "studies" / f"{model}_ic.yaml", study_file)
        args = [sys.executable, "-m", "sweeper.cli", "run", str(study_file)]
        for key, value in sets.items():
            args += ["--set", f"{key}={value}"]
        shutil.rmtree(Path(cache) / ".stack-sizes", ignore_errors=True)  # each sweep measures afresh
        env = {**os.environ, "SWEEPER_CACHE_DIR": cache}
        began = time.perf_counter()
        proc = subprocess.run(args, cwd=tmp, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - began
        if proc.returncode:
            raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}:\n"
                               f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        study = optuna.load_study(study_name=f"{model}_ic", storage=f"sqlite:///{tmp}/runs/{model}_ic/study.db")
        trials = study.get_trials(deepcopy=False)
        chosen = study.user_attrs.get("stack_size") or {}
    # the populations that trained: a trial of several holds the list of them (its user attr population)
    groups = {tuple(t.user_attrs.get("population") or [t.number]) for t in trials}
    sizes = [len(g) for g in groups]
    states = [t.state.name for t in trials]
    counts = {s: states.count(s) for s in sorted(set(states))}
    finished = sum(counts.get(s, 0) for s in FINISHED)
    starts = [t.datetime_start for t in trials if t.datetime_start]
    ends = [t.datetime_complete for t in trials if t.datetime_complete]
    span = (max(ends) - min(starts)).total_seconds() if starts and ends else 0.0
    values = [(t.number, t.value) for t in trials if t.state.name == "COMPLETE" and t.value is not None]
    return {"population_asked": sets["study.population"], "states": counts, "finished": finished,
            "span_s": round(span, 2), "wall_s": round(wall, 2),
            "per_min": round(60 * finished / span, 3) if span else 0.0,
            "per_wall_min": round(60 * finished / wall, 3),
            "population": int(chosen.get("population_size", 1)),
            "trained": {str(k): sizes.count(k) for k in sorted(set(sizes))},
            "stack_size": chosen.get("stack_size"),
            "stack_size_from": chosen.get("stack_size_from"),
            "stack_rates": chosen.get("stack_rates"), "values": values,
            # train.precision: auto, where the CPU runs bf16 natively, is measured with the stack size
            "precision": chosen.get("precision"), "precision_rates": chosen.get("precision_rates")}


def _throughput(model: str, base: dict[str, Any], budget: float, pairs: int, cache: str) -> dict[str, Any]:
    sets = {**base, "study.n_trials": 10000, "study.timeout": budget}
    on, off, ratios = [], [], []
    for i in range(pairs):
        order = ("auto", 1) if i % 2 == 0 else (1, "auto")
        runs = {}
        for population in order:
            runs[population] = _sweep(model, {**sets, "study.population": population}, cache)
            r = runs[population]
            _log(f"{model} pair {i} population={population}: {r['finished']} trials in {r['span_s']} s "
                 f"({r['per_min']}/min; wall {r['wall_s']} s), states {r['states']}, "
                 f"auto chose {r['population']} (rates {r['stack_rates']}; precision {r['precision']}), "
                 f"populations trained {r['trained']}")
        for r in runs.values():
            r.pop("values")
        on.append(runs["auto"])
        off.append(runs[1])
        ratios.append(runs["auto"]["per_min"] / runs[1]["per_min"] if runs[1]["per_min"] else float("nan"))
    out = {"budget_s": budget,
           "on_per_min": round(statistics.median(r["per_min"] for r in on), 3),
           "off_per_min": round(statistics.median(r["per_min"] for r in off), 3),
           "on_per_wall_min": round(statistics.median(r["per_wall_min"] for r in on), 3),
           "off_per_wall_min": round(statistics.median(r["per_wall_min"] for r in off), 3),
           "ratio": round(statistics.median(ratios), 3), "ratios": [round(r, 3) for r in ratios],
           "wall_ratio": round(statistics.median(a["per_wall_min"] / b["per_wall_min"]
                                                 for a, b in zip(on, off)), 3),
           "population": [r["population"] for r in on], "on": on, "off": off}
    _log(f"{model}: on {out['on_per_min']}/min, off {out['off_per_min']}/min, ratio {out['ratio']} "
         f"(pairs {out['ratios']}), auto chose {out['population']}")
    return out


def _best(values: list[tuple[int, float]], n: int) -> float | None:
    kept = [v for number, v in values if number < n]
    return max(kept) if kept else None


def _efficiency(base: dict[str, Any], trials: int, seeds: int, cache: str) -> dict[str, Any]:
    per_seed = []
    for seed in range(seeds):
        sets = {**base, "study.n_trials": trials, "data.synthetic.seed": seed}
        order = ("auto", 1) if seed % 2 == 0 else (1, "auto")
        runs = {p: _sweep("mlp", {**sets, "study.population": p}, cache) for p in order}
        on, off = _best(runs["auto"]["values"], trials), _best(runs[1]["values"], trials)
        row = {"data_seed": seed, "best_on": on, "best_off": off,
               "diff": None if on is None or off is None else on - off,
               "population": runs["auto"]["population"], "trained_on": runs["auto"]["trained"],
               "states_on": runs["auto"]["states"], "states_off": runs[1]["states"],
               "wall_on_s": runs["auto"]["wall_s"], "wall_off_s": runs[1]["wall_s"]}
        _log(f"efficiency seed {seed}: best val_ic on {on} off {off} (auto chose {row['population']}, "
             f"trained {row['trained_on']}; "
             f"walls {row['wall_on_s']} / {row['wall_off_s']} s; "
             f"states {row['states_on']} / {row['states_off']})")
        per_seed.append(row)
    diffs = [r["diff"] for r in per_seed if r["diff"] is not None]
    se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else None
    med = statistics.median(diffs) if diffs else None
    ons = [r["best_on"] for r in per_seed if r["best_on"] is not None]
    offs = [r["best_off"] for r in per_seed if r["best_off"] is not None]
    return {"trials": trials, "data_seeds": seeds,
            "median_best_on": statistics.median(ons) if ons else None,
            "median_best_off": statistics.median(offs) if offs else None,
            "median_diff": med, "se": se,
            "within_one_se": None if med is None or se is None else abs(med) <= se, "per_seed": per_seed}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,lstm,transformer")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--budget", default=",".join(f"{m}={int(s)}" for m, s in BUDGET.items()),
                        help="study.timeout per model, seconds: mlp=60,lstm=75,transformer=100")
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--data-seeds", type=int, default=5)
    parser.add_argument("--no-throughput", action="store_true")
    parser.add_argument("--no-efficiency", action="store_true")
    parser.add_argument("--file-length", action="store_true",
                        help="throughput at the study file's own epochs and samples per epoch")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    budgets = {**BUDGET, **{m: float(s) for m, s in (kv.split("=") for kv in args.budget.split(",") if kv)}}
    models = args.models.split(",")
    base: dict[str, Any] = dict(SHRUNK)
    if args.file_length:
        base = {k: v for k, v in SHRUNK.items() if not k.startswith("train.")}
    if args.smoke:
        base = dict(SMOKE)
        models, args.pairs, budgets["mlp"], args.trials, args.data_seeds = ["mlp"], 1, 4.0, 4, 1
    began = time.perf_counter()
    report: dict[str, Any] = {"machine": f"{os.cpu_count()} cores", "smoke": args.smoke, "settings": base,
                              "throughput": {}, "efficiency": None}
    with tempfile.TemporaryDirectory(prefix="population-cache-") as cache:
        if not args.no_throughput:
            for model in models:
                report["throughput"][model] = _throughput(model, base, budgets[model], args.pairs, cache)
        if not args.no_efficiency:
            report["efficiency"] = _efficiency({**base, "train.epochs": 3 if not args.smoke else 1},
                                               args.trials, args.data_seeds, cache)
    tp, eff = report["throughput"], report["efficiency"]
    report["checks"] = {
        "mlp_at_least_1.4x": tp["mlp"]["ratio"] >= 1.4 if "mlp" in tp else None,
        **{f"{m}_no_slower": tp[m]["ratio"] >= 1.0 for m in ("lstm", "transformer") if m in tp},
        "best_val_ic_within_one_se": eff["within_one_se"] if eff else None}
    report["seconds"] = round(time.perf_counter() - began, 1)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
