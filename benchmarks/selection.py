"""Which validation scheme picks the better model: holdout vs walk-forward (issue 20).

Three schemes, each a real ``sweeper run`` (subprocess, its own SQLite study in a temporary
folder) on the same synthetic panel:

- ``holdout``: one valid block, one seed per trial;
- ``wf_r1``: ``validation.scheme: walk_forward``, 4 folds, 1 seed;
- ``wf_r2``: the same with ``validation.repeats: 2``.

**Equal total training time.** A trial trains ``folds x repeats`` runs (1, 4, 8) of the same
length (``train.samples_per_epoch`` x ``train.epochs`` steps whatever the window), so at equal
training time holdout runs 8 configs for each of wf_r2's, wf_r1 2: ``--configs N`` gives
holdout 8N trials, wf_r1 2N, wf_r2 N. The configs are drawn once per data seed (numpy, random
over ``SPACES[--space]``) and enqueued (``--enqueue``), so the schemes' sets are nested:
wf_r2's N configs are the first N of every scheme's. The summed ``duration_s`` of each
scheme's trials is printed so that the equal-time premise can be checked. No pruner (a pruned
trial has no test IC), no LightGBM baseline.

For each scheme and data seed (``data.synthetic.seed``), over the COMPLETE trials:

- ``spearman``: the rank correlation between the objective (trial value) and ``test_ic``;
- ``gap``: the pick's (the best objective's) objective minus its test IC;
- ``oracle_share``: the pick's test IC / the panel's oracle test IC (study attr ``oracle_ic``).

Also, ``same_configs``: the same three figures over the first N configs only (every scheme
judged the same models: the schemes' judgement alone, at unequal time). Medians over seeds are
the headline; ``last_fold_gap`` (a diagnostic) is the pick's val IC on its last valid block
(under walk-forward the last fold's, whose model scores the test IC) minus its test IC;
``abs_gap`` is the median over seeds of |gap| (an objective below the test IC is a
misjudgement too). The issue's aim: wf_r2's ``abs_gap`` at most half of holdout's
(``gap_ratio`` <= 0.5), with a median Spearman no lower (``spearman_delta`` >= 0): ``aim_met``.

**Equal wall time** (``--budget SECONDS``, issue 29): with stacked runs a trial's seeds and
folds train as one model, so evidence no longer costs its runs' time one after another. Each of
``holdout`` (1 seed), ``holdout_r4`` (4 seeds: the trial's model is their ensemble) and ``wf_r2``
(4 folds x 2 seeds) sweeps the same enqueued configs, in the same order, for ``SECONDS``
(``study.timeout``: no trial starts after it) and is judged on the trials it finished; ``trials``
then says how many configs each reached. ``train.max_stack`` keeps its default (8).

    python benchmarks/selection.py [--configs 8] [--seeds 0,1,2] [--space narrow|wide] [--budget S] [--smoke]

``--space narrow`` (the default) draws good configs only, as the main job's space does, so
that the gaps between them are about the size of the noise (the regime the issue measured:
among the good trials the ranking is noise); ``wide`` adds bad ones (a 30x range of lr, width
16), which any scheme ranks easily.

``--smoke`` (a minute or two: a tiny panel, 2 folds, 1 seed, 3 configs) runs every path for the test
suite. The last line is JSON: {"space", "seeds", "configs", "schemes": {name: {"trials", "train_s",
"spearman", "gap", "oracle_share", "same_configs": {...}, "per_seed": [...]}}, "gap_ratio",
"spearman_delta", "aim_met"}.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
import yaml

STUDY: dict[str, Any] = {
    "study": {"name": "sel", "metric": "val_ic", "sampler": {"name": "random", "seed": 0},
              "pruner": {"name": "none"}, "start_from_config": False, "retries": 0},
    "data": {"synthetic": {"assets": 200, "dates": 700, "features": 16, "seed": 0}, "lookback": 10,
             "horizon": 2, "feature_norm": "cs_zscore", "label_norm": "cs_rank"},
    "model": {"name": "mlp", "hidden_size": 32, "num_layers": 2, "dropout": 0.1},
    "train": {"epochs": 4, "batch_size": 512, "samples_per_epoch": 16384, "lr": 0.003, "patience": 3,
              "schedule": "cosine", "loss": "mse"},
    "devices": {"gpus": "none", "cpu_workers": 2},
    "report": {"baseline": None},
}
SPACES: dict[str, dict[str, Any]] = {
    # configs of very different quality (width 16 to 64, a 30x range of lr): easy to rank
    "wide": {
        "train.lr": {"type": "float", "low": 0.0003, "high": 0.01, "log": True},
        "train.weight_decay": {"type": "float", "low": 0.0001, "high": 0.1, "log": True},
        "model.hidden_size": {"type": "categorical", "choices": [16, 32, 64]},
        "model.num_layers": {"type": "int", "low": 1, "high": 2},
        "model.dropout": {"type": "float", "low": 0.0, "high": 0.3},
    },
    # good configs only, as in the main job's space: the gaps between them are about the noise
    "narrow": {
        "train.lr": {"type": "float", "low": 0.002, "high": 0.006, "log": True},
        "train.weight_decay": {"type": "float", "low": 0.0001, "high": 0.05, "log": True},
        "model.hidden_size": {"type": "categorical", "choices": [32, 64]},
        "model.dropout": {"type": "float", "low": 0.0, "high": 0.1},
    },
}
SMOKE = {"data": {"synthetic": {"assets": 30, "dates": 260, "features": 4}, "lookback": 5},
         "train": {"epochs": 1, "samples_per_epoch": 1024, "batch_size": 256}}
# scheme -> its validation section. Equal training time (the count design): runs per trial set
# each scheme's number of trials.
SCHEMES = {"holdout": {"scheme": "holdout"},
           "wf_r1": {"scheme": "walk_forward", "folds": 4, "repeats": 1},
           "wf_r2": {"scheme": "walk_forward", "folds": 4, "repeats": 2}}
# Equal wall time (``--budget``, issue 29): each scheme sweeps for the same seconds with its runs
# stacked (train.max_stack, default 8: a trial's 4 seeds, or 4 folds x 2 seeds, train as one model);
# what a trial's evidence costs then decides how many configs each scheme judges.
TIMED_SCHEMES = {"holdout": {"scheme": "holdout"},
                 "holdout_r4": {"scheme": "holdout", "repeats": 4},
                 "wf_r2": {"scheme": "walk_forward", "folds": 4, "repeats": 2}}


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def runs_per_trial(validation: dict[str, Any]) -> int:
    folds = validation.get("folds", 4) if validation.get("scheme") == "walk_forward" else 1
    return folds * validation.get("repeats", 1)


def draw_configs(space: dict[str, Any], n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` param sets drawn at random over ``space`` (log-uniform where ``log``)."""
    rng = np.random.default_rng(1000 + seed)
    out = []
    for _ in range(n):
        one: dict[str, Any] = {}
        for key, spec in space.items():
            if spec["type"] == "categorical":
                one[key] = spec["choices"][int(rng.integers(len(spec["choices"])))]
            elif spec["type"] == "int":
                one[key] = int(rng.integers(spec["low"], spec["high"] + 1))
            elif spec.get("log"):
                one[key] = float(np.exp(rng.uniform(np.log(spec["low"]), np.log(spec["high"]))))
            else:
                one[key] = float(rng.uniform(spec["low"], spec["high"]))
        out.append(one)
    return out


def sweep(folder: Path, raw: dict[str, Any], configs: list[dict[str, Any]],
          budget_s: float | None = None) -> tuple[list[dict], dict, float]:
    """Run ``raw`` over ``configs`` (enqueued, one trial each) with ``sweeper run`` in
    ``folder``, for at most ``budget_s`` seconds (``study.timeout``: no trial starts after it,
    the running ones finish) where given: the trials in number order (= config order), the
    study's oracle IC, and the sweep's wall time."""
    folder.mkdir(parents=True)
    name = raw["study"]["name"]
    study = {"n_trials": len(configs), **({"timeout": budget_s} if budget_s else {})}
    (folder / "study.yaml").write_text(yaml.safe_dump(merge(raw, {"study": study})))
    (folder / "params.yaml").write_text(yaml.safe_dump(configs))
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "sweeper.cli", "run", "study.yaml", "--enqueue", "params.yaml"]
    proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"sweeper run failed in {folder} ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                         f"{proc.stderr[-3000:]}")
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{folder}/runs/{name}/study.db")
    trials = sorted(study.get_trials(), key=lambda t: t.number)
    # under a budget the configs it did not reach stay WAITING: they were never judged
    ran = [t for t in trials if t.state != optuna.trial.TrialState.WAITING]
    if budget_s and len(ran) == len(configs):
        raise SystemExit(f"{folder}: every one of the {len(configs)} configs ran before the {budget_s:g} s "
                         "budget ended, so the clock did not decide; enqueue more")
    rows = [trial_row(t, folder / "runs" / name) for t in ran]
    return rows, study.user_attrs.get("oracle_ic") or {}, wall


def trial_row(t: optuna.trial.FrozenTrial, run_dir: Path) -> dict[str, Any]:
    """What the figures need of a trial, with the training it did: runs made (their
    ``runs/*/result.json``, a run cut short by the pruner too; a single holdout run has none:
    its weights) and epochs trained
    (``metrics.csv`` rows, one per epoch of every run)."""
    from sweeper.store.layout import trial_files

    files = trial_files(run_dir, t.number)
    runs = len(list(files.runs.glob("*/result.json"))) if files.runs.is_dir() else int(files.weights.exists())
    epochs = max(len(files.metrics.read_text().splitlines()) - 1, 0) if files.metrics.exists() else 0
    ua = t.user_attrs
    folds = ua.get("fold_val_ic") or [t.value]  # holdout: its one valid block
    return {"number": t.number, "state": t.state.name, "value": t.value, "test_ic": ua.get("test_ic"),
            "last_fold": folds[-1],
            "duration_s": ua.get("duration_s", 0.0), "runs": runs, "epochs": epochs, "params": t.params}


def figures(rows: list[dict], oracle_test: float | None) -> dict[str, Any]:
    """Spearman(objective, test IC), the pick's gap and oracle share, over the COMPLETE rows."""
    done = [r for r in rows if r["state"] == "COMPLETE" and None not in (r["value"], r["test_ic"])]
    if len(done) < 3:
        keys = ("spearman", "gap", "pick_objective", "pick_number", "pick_test_ic", "best_test_ic",
                "oracle_share", "last_fold_gap")
        return {"n": len(done), **dict.fromkeys(keys)}
    df = pd.DataFrame(done)
    pick = df.loc[df["value"].idxmax()]
    rho = float(df["value"].corr(df["test_ic"], method="spearman"))
    value, test = float(pick["value"]), float(pick["test_ic"])
    return {"n": len(done), "spearman": round(rho, 4), "gap": round(value - test, 5),
            "pick_objective": round(value, 5), "pick_number": int(pick["number"]),
            "pick_test_ic": round(test, 5), "best_test_ic": round(float(df["test_ic"].max()), 5),
            "oracle_share": round(test / oracle_test, 4) if oracle_test else None,
            # the pick's last valid block (the fold whose model scores the test IC) minus its test IC
            "last_fold_gap": None if pick["last_fold"] is None else round(float(pick["last_fold"]) - test, 5)}


def one_seed(root: Path, base: dict[str, Any], seed: int, n: int,
             budget_s: float | None = None) -> dict[str, dict]:
    """Every scheme on data seed ``seed``: at equal training time (``n`` configs for wf_r2, as
    many runs for the others), or, with ``budget_s``, for ``budget_s`` seconds each, over as many
    of the same configs as they reach (enqueued in the same order: the sets stay nested)."""
    base = merge(base, {"data": {"synthetic": {"seed": seed}}})
    schemes = TIMED_SCHEMES if budget_s else SCHEMES
    most = max(runs_per_trial(v) for v in SCHEMES.values())
    # at equal time, more configs than the fastest scheme can reach (2 slots, a one-run trial >= 0.25 s;
    # the smoke's are faster still): sweep() refuses a run that used them all
    configs = draw_configs(base["search_space"], int(budget_s * 10) + 16 if budget_s else n * most, seed)
    out = {}
    for name, validation in schemes.items():
        # equal training time: trials x runs per trial (equal wall time: the clock decides)
        k = len(configs) if budget_s else n * most // runs_per_trial(validation)
        raw = merge(base, {"study": {"name": name}, "validation": validation})
        rows, oracle, wall = sweep(root / f"seed{seed}-{name}", raw, configs[:k], budget_s)
        got = figures(rows, oracle.get("test"))
        got.update(trials=len(rows), wall_s=round(wall, 1),
                   train_s=round(sum(r["duration_s"] for r in rows), 1),
                   same_configs=figures(rows[:n], oracle.get("test")), oracle_test_ic=oracle.get("test"))
        print(f"seed {seed} {name}: {got['trials']} trials, wall {wall:.0f} s, "
              f"training {got['train_s']:.0f} s; "
              f"spearman {got['spearman']}, gap {got['gap']}, oracle share {got['oracle_share']}; first {n} "
              f"configs: {got['same_configs']}", flush=True)
        out[name] = got
    return out


def median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return round(statistics.median(vals), 5) if vals else None


def summary(per_seed: dict[int, dict[str, dict]], n: int) -> dict[str, Any]:
    schemes: dict[str, Any] = {}
    for name in next(iter(per_seed.values())):
        rows = [per_seed[s][name] for s in per_seed]
        schemes[name] = {
            "trials": median([r["trials"] for r in rows]), "train_s": median([r["train_s"] for r in rows]),
            "wall_s": median([r["wall_s"] for r in rows]),
            **{k: median([r[k] for r in rows]) for k in ("spearman", "gap", "oracle_share", "last_fold_gap")},
            "abs_gap": median([None if r["gap"] is None else abs(r["gap"]) for r in rows]),
            "same_configs": {k: median([r["same_configs"][k] for r in rows])
                             for k in ("spearman", "gap", "oracle_share")},
            "per_seed": [{"seed": s, **{k: per_seed[s][name][k] for k in
                                        ("trials", "spearman", "gap", "last_fold_gap", "oracle_share",
                                         "pick_test_ic", "train_s")}}
                         for s in per_seed]}
    ho, wf = schemes["holdout"], schemes["wf_r2"]
    ratio = wf["abs_gap"] / ho["abs_gap"] if ho["abs_gap"] and wf["abs_gap"] is not None else None
    delta = wf["spearman"] - ho["spearman"] if None not in (wf["spearman"], ho["spearman"]) else None
    return {"seeds": list(per_seed), "configs": n, "schemes": schemes,
            "gap_ratio": None if ratio is None else round(ratio, 3),
            "spearman_delta": None if delta is None else round(delta, 4),
            "aim_met": bool(ratio is not None and delta is not None and ratio <= 0.5 and delta >= 0)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", type=int, default=8, help="wf_r2's trials (holdout runs 8x)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--space", choices=sorted(SPACES), default="narrow")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds of sweeping per scheme: equal wall time, runs stacked (issue 29)")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    base = merge(STUDY, {"search_space": SPACES[args.space]})
    seeds, n = [int(s) for s in args.seeds.split(",")], args.configs
    if args.smoke:
        base, seeds, n = merge(base, SMOKE), seeds[:1], 3
        for v in [*SCHEMES.values(), *TIMED_SCHEMES.values()]:
            if "folds" in v:
                v["folds"] = 2
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        per_seed = {seed: one_seed(Path(tmp), base, seed, n, args.budget) for seed in seeds}
    print(json.dumps({"space": args.space, "budget_s": args.budget, **summary(per_seed, n)}))


if __name__ == "__main__":
    main()
