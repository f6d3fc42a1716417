"""Stacked runs against the same runs one after another (issue 29), on the CPU.

For each built-in model (its study file in ``studies/``: ``mlp_ic``, ``lstm_ic``, ``transformer_ic``,
all on the default synthetic panel), two trials' grids are trained through the trial runner
(:func:`sweeper.validation.runner.train_runs`, what a sweep's worker runs, with nothing kept
on disk):

- ``1x4``: holdout, ``validation.repeats: 4`` (one fold of four seeds);
- ``4x2``: ``validation.scheme: walk_forward``, 4 folds of 2 seeds;

each once with ``train.max_stack: 8`` (one stack, pinned) and once with ``train.max_stack: 1`` (today's
path: the runs one after another). Like a sweep on a 2-core box, **two slots of one torch thread
each** run at once: the stacked trial in one slot while the lone trial runs in the other, then
the other way round, so both meet the same load. ``ratio`` is the median over pairs of stacked /
lone wall time (< 1: stacking is faster).

**Quality** (``--quality-seeds``, 3 data seeds by default): on each panel (``data.synthetic.seed``)
four seeds of the MLP train as one stack with every member scored on test; the seed ensemble's
test IC (the IC of the mean of the four members' test predictions) against the mean of the four
single-seed test ICs.

**``sweeper train``** (``--cli``, or ``--cli-only`` for these figures alone): the wall time of
``sweeper train <study> --set validation.repeats=4`` with the stack size measured (``train.max_stack:
auto``, the default, its measurement included) over the same with ``train.max_stack: 1`` (the four
runs one after another), a real process each, start-up included, in alternating pairs; and the
size ``auto`` chose with the rates it chose on.

    python benchmarks/stacked.py [--models mlp,lstm,transformer] [--pairs 2] [--epochs 2]
                                 [--samples 16384] [--quality-seeds 0,1,2] [--cli | --cli-only] [--smoke]

``--smoke`` (well under a minute: a tiny panel, 1 epoch, the MLP) runs every path for the test
suite. The last line is JSON: {"models": {name: {"1x4": {...}, "4x2": {...}}}, "quality": [...],
"cli": {...}}.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from functools import cache
from multiprocessing import get_context
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GRIDS = {"1x4": {"validation.repeats": 4},
         "4x2": {"validation.scheme": "walk_forward", "validation.folds": 4, "validation.repeats": 2}}
SMOKE_DATA = {"data.synthetic": {"assets": 40, "dates": 200, "features": 4, "seed": 0}, "data.lookback": 5}


def _config(model: str, over: dict[str, Any]) -> Any:
    from sweeper.config import load_config, with_overrides

    return with_overrides(load_config(ROOT / "studies" / f"{model}_ic.yaml"), over, "benchmarks/stacked.py")


@cache
def _panel(data_json: str) -> Any:
    from sweeper.config import DataConfig
    from sweeper.data.load import load_panel

    return load_panel(DataConfig.model_validate(json.loads(data_json)))


def _trial_seconds(model: str, over: dict[str, Any]) -> float:
    """One trial's grid through the runner, in this (one-thread) slot; its wall time."""
    import torch

    from sweeper.core import NullHook
    from sweeper.validation.runner import Trainer, train_runs

    torch.set_num_threads(1)
    cfg = _config(model, over)
    panel = _panel(json.dumps(cfg.data.model_dump(mode="json")))
    began = time.perf_counter()
    train_runs(panel, Trainer(cfg, NullHook(), time.monotonic()))
    return time.perf_counter() - began


def _speed(pool: ProcessPoolExecutor, model: str, base: dict[str, Any], pairs: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, grid in GRIDS.items():
        stacked, lone = {**base, **grid, "train.max_stack": 8}, {**base, **grid, "train.max_stack": 1}
        pool.submit(_trial_seconds, model, stacked).result()  # warm both slots' panels and imports
        pool.submit(_trial_seconds, model, lone).result()
        s_times, l_times, ratios = [], [], []
        for i in range(pairs):
            first, second = (stacked, lone) if i % 2 == 0 else (lone, stacked)
            a, b = pool.submit(_trial_seconds, model, first), pool.submit(_trial_seconds, model, second)
            s, lo = (a.result(), b.result()) if i % 2 == 0 else (b.result(), a.result())
            s_times.append(s)
            l_times.append(lo)
            ratios.append(s / lo)
        out[name] = {"stacked_s": round(statistics.median(s_times), 2),
                     "lone_s": round(statistics.median(l_times), 2),
                     "ratio": round(statistics.median(ratios), 3), "ratios": [round(r, 3) for r in ratios]}
        print(f"{model} {name}: stacked {out[name]['stacked_s']} s, one by one {out[name]['lone_s']} s, "
              f"ratio {out[name]['ratio']}", file=sys.stderr, flush=True)
    return out


def _quality(seed: int, base: dict[str, Any]) -> dict[str, Any]:
    """Four seeds of the MLP as one stack, each scored on test: the ensemble's test IC and theirs."""
    import pandas as pd
    import torch

    from sweeper.core import Member, train_stack
    from sweeper.quant import ic as M
    from sweeper.validation.grid import seeded

    torch.set_num_threads(1)
    synthetic = dict(base.get("data.synthetic") or _config("mlp", {}).data.synthetic.model_dump())
    cfg = _config("mlp", {**base, "data.synthetic": {**synthetic, "seed": seed}})
    panel = _panel(json.dumps(cfg.data.model_dump(mode="json")))
    results = train_stack([Member(seeded(cfg, r), panel) for r in range(4)], device="cpu")
    singles = [float(r.metrics["test_ic"]) for r in results]
    frames = [r.predictions["test"].set_index(["date", "asset"]) for r in results]
    mean = pd.concat([f["pred"] for f in frames], axis=1).mean(axis=1)
    ensemble = frames[0][["label"]].assign(pred=mean).reset_index()
    ens_ic = float(M.ic_report(ensemble)["ic"])
    return {"data_seed": seed, "ensemble_test_ic": round(ens_ic, 5),
            "mean_single_test_ic": round(statistics.mean(singles), 5),
            "single_test_ic": [round(v, 5) for v in singles], "ensemble_at_least_mean": ens_ic >= statistics.mean(singles)}


def _cli(study: str, sets: list[str], repeats: int) -> tuple[float, dict[str, Any]]:
    """``sweeper train`` of ``study`` (a real process, start-up included): its wall time and JSON."""
    args = [sys.executable, "-m", "sweeper.cli", "train", study, "--json", "--set", f"validation.repeats={repeats}"]
    for s in sets:
        args += ["--set", s]
    began = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    return time.perf_counter() - began, json.loads(proc.stdout)


def _cli_report(models: list[str], sets: list[str], pairs: int) -> dict[str, Any]:
    """``repeats: 4`` with the stack size measured (``train.max_stack: auto``, the default) against
    the same four runs one after another (``train.max_stack: 1``), in alternating pairs: the
    median ratio of their wall times (the measurement's own cost included), and the size chosen."""
    out: dict[str, Any] = {}
    for model in models:
        study, auto_s, lone_s, ratios, chosen = f"studies/{model}_ic.yaml", [], [], [], []
        for i in range(pairs):
            order = [("auto", sets), ("lone", [*sets, "train.max_stack=1"])]
            times = {}
            for name, extra in (order if i % 2 == 0 else order[::-1]):
                times[name], result = _cli(study, extra, 4)
                if name == "auto":
                    chosen.append({k: result.get(k) for k in ("stack_size", "stack_rates")})
            auto_s.append(times["auto"])
            lone_s.append(times["lone"])
            ratios.append(times["auto"] / times["lone"])
        out[model] = {"auto_s": round(statistics.median(auto_s), 2), "lone_s": round(statistics.median(lone_s), 2),
                      "ratio": round(statistics.median(ratios), 3), "ratios": [round(r, 3) for r in ratios],
                      # the first auto run measures (once per study and shape on a host); the rest read it
                      "ratio_after_measuring": round(statistics.median(ratios[1:] or ratios), 3),
                      "chosen": chosen}
        print(f"cli {model}: auto {out[model]['auto_s']} s, one by one {out[model]['lone_s']} s, "
              f"ratio {out[model]['ratio']} ({out[model]['ratio_after_measuring']} after measuring), "
              f"chose {[c['stack_size'] for c in chosen]}", file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,lstm,transformer")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=16384, help="train.samples_per_epoch")
    parser.add_argument("--quality-seeds", default="0,1,2")
    parser.add_argument("--cli", action="store_true",
                        help="also time sweeper train, repeats 4: the measured stack size against one by one")
    parser.add_argument("--cli-only", action="store_true", help="only the --cli figures")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    base: dict[str, Any] = {"train.epochs": args.epochs, "train.samples_per_epoch": args.samples,
                            "train.max_minutes": None, "train.patience": 100}
    models = args.models.split(",")
    seeds = [int(s) for s in args.quality_seeds.split(",") if s]
    if args.smoke:
        base.update({**SMOKE_DATA, "train.epochs": 1, "train.samples_per_epoch": 1024})
        models, seeds, args.pairs = ["mlp"], [0], 1
    report: dict[str, Any] = {"machine": f"{os.cpu_count()} cores", "settings": base, "models": {}}
    args.cli = args.cli or args.cli_only
    if not args.cli_only:
        with ProcessPoolExecutor(max_workers=2, mp_context=get_context("spawn")) as pool:
            for model in models:
                report["models"][model] = _speed(pool, model, base, args.pairs)
            report["quality"] = list(pool.map(_quality, seeds, [base] * len(seeds)))
    if args.cli:
        sets = [f"{k}={v}" for k, v in base.items() if not isinstance(v, dict) and v is not None]
        sets.append("train.max_minutes=null")
        report["cli"] = _cli_report(models if not args.cli_only else args.models.split(","), sets, args.pairs)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
