"""Fold trainings saved by pruning across walk-forward folds (issue 20, item 4).

The same walk-forward sweep twice, with real ``sweeper run`` subprocesses in a temporary
folder: once with ``studies/walk_forward.yaml``'s median pruner, once with ``pruner: none``.
Both arms run the same configs (drawn at random over the study file's search space, seeded,
and enqueued), so the only difference is the pruner. Each trial reports its intermediate
values at the step ``(fold * repeats + repeat) * epochs + epoch``, so the median pruner
compares trials at the same fold, seed and epoch, and a trial below its peers in fold 1 is
stopped before folds 2-4 run.

For each arm: the fold runs made (``trials/<n>/runs/*/result.json``, which a run cut short by
the pruner writes too, so the runs saved are those never started) against
``n_trials x folds x repeats``, the epochs trained (``metrics.csv`` rows, one per epoch of every
run, early stopping included in both arms), the wall time, and the best objective with that
trial's test IC, so that savings bought with a worse pick show. ``saved_runs`` is 1 - the
pruned arm's runs / the unpruned arm's; ``saved_epochs`` the same for epochs.

The default panel and model are the study file's (300 assets x 1000 dates x 16 features, a
small transformer); ``--trials`` (12 by default) is fewer than its 20 to keep the two arms
within about half an hour on 2 CPU cores. With the median pruner's 4 start-up trials never
pruned, a short sweep saves less than a long one would.

    python benchmarks/fold_pruning.py [--trials 12] [--seed 0] [--smoke]

``--smoke`` (about a minute: a tiny panel, 2 folds, 2 epochs, 6 trials) runs every path for the test
suite. The last line is JSON: {"trials", "folds", "repeats", "epochs", "arms": {"median":
{...}, "none": {...}}, "saved_runs", "saved_epochs", "best_objective_delta"}.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import optuna
import yaml
from selection import draw_configs, merge, sweep

ROOT = Path(__file__).resolve().parents[1]
STUDY_FILE = ROOT / "studies" / "walk_forward.yaml"
OVER: dict[str, Any] = {
    # the sampler is the study file's: every trial's params are enqueued, it draws none
    "study": {"start_from_config": False, "retries": 0, "timeout": None},
    "train": {"max_minutes": None}, "devices": {"gpus": "none"}, "report": {"baseline": None}}
SMOKE: dict[str, Any] = {
    "data": {"synthetic": {"assets": 30, "dates": 260, "features": 4}, "lookback": 5},
    "model": {"d_model": 8, "dim_feedforward": 16}, "validation": {"folds": 2},
    "train": {"epochs": 2, "samples_per_epoch": 1024, "batch_size": 256},
    "study": {"pruner": {"name": "median", "options": {"n_startup_trials": 2, "n_warmup_steps": 0}}},
    "search_space": {"train.batch_size": {"type": "categorical", "choices": [256]},
                     "model.d_model": {"type": "categorical", "choices": [8]}},
}


def arm(rows: list[dict], wall: float) -> dict[str, Any]:
    done = [r for r in rows if r["state"] == "COMPLETE" and r["value"] is not None]
    best = max(done, key=lambda r: r["value"]) if done else None
    states = [r["state"] for r in rows]
    return {"complete": states.count("COMPLETE"), "pruned": states.count("PRUNED"),
            "failed": states.count("FAIL"),
            "runs_finished": sum(r["runs"] for r in rows), "epochs_trained": sum(r["epochs"] for r in rows),
            "train_s": round(sum(r["duration_s"] for r in rows), 1), "wall_s": round(wall, 1),
            "best_trial": None if best is None else best["number"],
            "best_objective": None if best is None else round(best["value"], 5),
            "best_test_ic": None if best is None else round(best["test_ic"], 5)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0, help="the configs' draw")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    raw = merge(yaml.safe_load(STUDY_FILE.read_text()), OVER)
    n = args.trials
    if args.smoke:
        raw, n = merge(raw, SMOKE), 6
    if "storage" in raw["study"]:
        del raw["study"]["storage"]  # each arm's own runs/<name>/study.db
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    folds, repeats = raw["validation"]["folds"], raw["validation"].get("repeats", 1)
    epochs = raw["train"]["epochs"]
    configs = draw_configs(raw["search_space"], n, args.seed)
    arms: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, pruner in (("median", raw["study"]["pruner"]), ("none", {"name": "none"})):
            study = merge(raw, {"study": {"name": name, "pruner": pruner}})
            got, _, wall = sweep(Path(tmp) / name, study, configs)
            arms[name] = arm(got, wall)
            print(f"{name}: {arms[name]}", flush=True)
    med, none = arms["median"], arms["none"]
    delta = None if None in (med["best_objective"], none["best_objective"]) else \
        round(med["best_objective"] - none["best_objective"], 5)
    saved = {f"saved_{k}": round(1 - med[f"{k}_{v}"] / max(none[f"{k}_{v}"], 1), 3)
             for k, v in (("runs", "finished"), ("epochs", "trained"))}
    print(json.dumps({"trials": n, "folds": folds, "repeats": repeats, "epochs": epochs,
                      "possible_runs": n * folds * repeats, "possible_epochs": n * folds * repeats * epochs,
                      "arms": arms, **saved, "best_objective_delta": delta}))


if __name__ == "__main__":
    main()
