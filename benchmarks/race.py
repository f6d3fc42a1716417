"""The race (issue 41): sweeper against a plain Optuna loop at equal wall clock, on the CPU.

Per shipped study (``studies/{mlp,lstm,transformer}_ic.yaml``) and data seed (``data.synthetic.seed``)
both sides get the same panel, model, search space, trial settings and wall clock, one after the
other (the side that goes first alternates with the seed), each on the whole box:

- **sweeper**: ``python -m sweeper.cli run <copy of the study>`` in a temporary folder, as a user runs
  it, with ``study.timeout`` = the clock, ``study.n_trials`` 100,000 (never binds) and
  ``devices.gpus: none`` (the race is on the CPU; ``cpu_workers: auto`` gives one one-thread slot per
  core: two on a 2-core box). Everything else is the file's: its sampler, pruner, the study file's
  own values as trial 0, its LightGBM baseline (a slot's turn after the first trial). Its trials are
  read back from its SQLite store; its pick is what ``sweeper best --json`` names, and the pick's
  test IC is that trial's (its seed ensemble's under ``validation.repeats >= 2``).
- **plain loop**: what a user writes from Optuna's docs, in this file (:func:`plain_worker`): as many
  processes as sweeper has CPU slots (``sweeper.devices.cpu_slots(devices.cpu_workers)``), each with one
  torch thread, running ``study.optimize`` on one SQLite study (created first, as ``optuna create-study``
  would) with ``TPESampler`` whatever the file's sampler is (the file's sampler options that TPE takes, such
  as ``n_startup_trials``; seed = the race's sampler seed + the process's index, so the two processes do not
  draw the same start-up trials) and ``MedianPruner`` (the file's median options, else ``LOOP_PRUNER``),
  ``trial.report`` / ``trial.should_prune()`` each epoch. The panel is sweeper's own
  (``sweeper.data.load_panel`` of the same config: the same split, purge and normalisation; the panel cache
  is built once before either side starts), served by a per-sample ``Dataset`` (a window of ``lookback``
  dates of one asset's features -> its normalised label) and a ``DataLoader`` (shuffled,
  ``train.batch_size`` a batch, ``train.samples_per_epoch`` an epoch; with ``train.loss: ic`` a batch is
  whole dates, as an IC loss needs). The model is ``sweeper.models.build_model`` of the trial's params;
  ``torch.optim.AdamW`` (the trial's lr and weight decay), ``CosineAnnealingLR`` over the trial's steps,
  gradient clipping ``train.grad_clip``, early stopping on val IC after ``train.patience`` epochs; the best
  epoch's weights are scored on test. Val and test IC: :func:`plain_ic`, the daily Pearson IC averaged over
  dates of ``sweeper.quant.ic.ic_report``, the function sweeper's final scoring gives ``val_ic`` /
  ``test_ic`` with. Its processes count the clock from after their imports (their data loading inside it, as
  sweeper's workers'); no trial starts after it on either side and the running ones finish.

**Sampler seeds.** Both sides' sampler seed is the study file's + 10 x the data seed (sweeper's
``study.sampler.seed``; the loop's processes add their index), so each data seed draws its own first
configs: with the file's seed on every data seed (``--fixed-sampler-seed``, the protocol before
2026-12-05's session 6) the loop drew the same start-up configs on all three and the median was over
one draw of that luck.

**Agreement**, asserted for every sweeper run: the labelled valid and test rows (date, asset) and raw
labels of a sweeper trial's stored predictions are exactly the plain side's, :func:`plain_ic` of them is the
trial's stored ``val_ic`` and ``test_ic`` (1e-9; under ``aggregate: ensemble`` the valid file is the seed
ensemble's and its IC the trial's value), and ``sweeper best``'s split dates are the plain
panel's.

**Figures**, per study and data seed, for each side, times from its launch: its first trial's start
(the start-up), the first finished trial (COMPLETE or PRUNED), the best val IC over time (COMPLETE
trials: what either side can pick), its final best and when it got there, the time it needs to reach
the other's final best (None: never), and the test IC of its pick. ``ratio`` = sweeper's time to the
loop's final best / the loop's own time to it (< 1: sweeper is faster; None: sweeper never got there,
an infinite ratio in the median). Per study, the medians over data seeds, and the check of issue 41:
median ratio <= 0.67 and median (sweeper's pick's test IC - the loop's) >= 0.

    python benchmarks/race.py [--studies mlp,lstm,transformer] [--data-seeds 0,1,2] [--clock 300]
                              [--seeds-for lstm=0 ...] [--clock-for transformer=180 ...] [--smoke]

``--smoke`` (under a minute: a tiny panel, 2 epochs of 1,024 samples, the MLP, one data seed, a 4 s
clock) runs every path for the test suite. The last line is JSON: {"runs": [...], "studies": {study:
{medians and checks}}, ...}.
"""
from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STUDIES = ("mlp", "lstm", "transformer")
# the loop's median pruner when the study file's is not one: the options every shipped file had when the
# race began (a user's loop does not change with sweeper's pruner)
LOOP_PRUNER = {"n_startup_trials": 4, "n_warmup_steps": 2}
SAMPLER_STRIDE = 10  # data seed d races with sampler seed file + 10 d on both sides (the loop: + its index)
SMOKE = ["data.synthetic.assets=40", "data.synthetic.dates=200", "data.synthetic.features=4",
         "data.lookback=5", "train.epochs=2", "train.samples_per_epoch=1024"]
FINISHED = ("COMPLETE", "PRUNED")
AGREE_TOL = 1e-9  # plain_ic of a stored predictions file against the trial's stored figure
TARGET_RATIO = 0.67


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ the plain loop (a user's script)


class Windows:
    """A split as per-sample windows: item k is (X[t-lookback+1..t, i, :], y[t, i]) of row (t, i); the
    rows are every present (date, asset) of the split with a finite training label, by date then asset."""

    def __init__(self, panel: Any, split: str) -> None:
        import numpy as np

        start, stop = panel.splits[split]
        usable = panel.mask[start:stop].numpy() & np.isfinite(panel.y[start:stop].numpy())
        t, i = np.nonzero(usable)
        self.t, self.i = t + start, i
        assert len(self.t) == 0 or self.t.min() >= panel.lookback - 1, "a window would start before the panel"
        self.X, self.y, self.lookback = panel.X.numpy(), panel.y.numpy(), panel.lookback
        self.dates, self.assets = panel.dates[self.t], panel.assets[self.i]
        self.label_raw = panel.y_raw.numpy()[self.t, self.i]

    def __len__(self) -> int:
        return len(self.t)

    def __getitem__(self, k: int) -> tuple[Any, Any, int]:
        t, i = self.t[k], self.i[k]
        return self.X[t - self.lookback + 1:t + 1, i], self.y[t, i], t


def plain_ic(pred: Any, rows: Windows) -> float:
    """The plain side's IC: the daily Pearson IC of ``pred`` (in ``rows``' order) against the raw label,
    averaged over dates (``sweeper.quant.ic.ic_report``, what sweeper scores val_ic and test_ic with)."""
    import pandas as pd

    from sweeper.quant import ic as M

    frame = pd.DataFrame({"date": rows.dates, "asset": rows.assets, "pred": pred, "label": rows.label_raw})
    return float(M.ic_report(frame)["ic"])


def _date_batches(rows: Windows, batch_size: int, limit: int) -> list[list[int]]:
    """Batches of whole dates (an IC loss correlates within a date), dates shuffled, ~``batch_size`` rows
    a batch, ``limit`` rows an epoch."""
    import numpy as np

    starts = np.flatnonzero(np.r_[True, rows.t[1:] != rows.t[:-1]])
    ends = np.r_[starts[1:], len(rows.t)]
    per_batch = max(1, round(batch_size * len(starts) / max(1, len(rows.t))))
    batches, taken = [], 0
    order = np.random.permutation(len(starts))
    for k in range(0, len(order), per_batch):
        batch = [j for d in order[k:k + per_batch] for j in range(starts[d], ends[d])]
        if taken and taken + len(batch) > limit:
            break
        batches.append(batch)
        taken += len(batch)
    return batches


def _predict(model: Any, rows: Windows, batch_size: int) -> Any:
    import torch
    from torch.utils.data import DataLoader

    model.eval()
    with torch.no_grad():
        out = [model(x.float()) for x, _, _ in DataLoader(rows, batch_size=batch_size, shuffle=False)]
    model.train()
    return torch.cat(out).numpy()


def _objective(trial: Any, cfg: Any, data: dict[str, Windows]) -> float:
    import optuna
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    from sweeper.config import with_overrides
    from sweeper.models import build_model
    from sweeper.quant.ic import ic_loss

    params = {}
    for key, spec in cfg.search_space.items():  # the study file's search space, asked as Optuna's docs do
        assert not spec.when, "the plain loop asks every parameter"
        if spec.type == "categorical":
            params[key] = trial.suggest_categorical(key, spec.choices)
        elif spec.type == "int":
            params[key] = trial.suggest_int(key, int(spec.low), int(spec.high), step=int(spec.step or 1),
                                            log=spec.log)
        else:
            params[key] = trial.suggest_float(key, spec.low, spec.high, step=spec.step, log=spec.log)
    tcfg = with_overrides(cfg, params, "plain loop")
    tc = tcfg.train
    torch.manual_seed(tc.seed)
    train, valid, test = data["train"], data["valid"], data["test"]
    model = build_model(tcfg.model, train.X.shape[2], train.lookback)
    optimizer = torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay)
    limit = min(tc.samples_per_epoch or len(train), len(train))
    steps = (math.ceil(limit / tc.batch_size) if tc.loss == "mse"
             else len(_date_batches(train, tc.batch_size, limit)))
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=tc.epochs * steps)
    began, best, best_state, bad = time.monotonic(), -math.inf, None, 0
    for epoch in range(1, tc.epochs + 1):
        if tc.loss == "mse":
            loader = DataLoader(train, batch_size=tc.batch_size,
                                sampler=RandomSampler(train, num_samples=limit))
        else:
            loader = DataLoader(train, batch_sampler=_date_batches(train, tc.batch_size, limit))
        for x, y, t in loader:
            pred = model(x.float())
            if tc.loss == "mse":
                loss = torch.nn.functional.mse_loss(pred, y.float())
            else:
                loss = ic_loss(pred, y.float(), t)
            optimizer.zero_grad()
            loss.backward()
            if tc.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            optimizer.step()
            scheduler.step()
        val_ic = plain_ic(_predict(model, valid, tc.resolved_eval_batch_size), valid)
        if val_ic > best:
            best, bad = val_ic, 0
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            bad += 1
        trial.report(val_ic, epoch)
        if trial.should_prune():
            raise optuna.TrialPruned()
        if bad >= tc.patience or (tc.max_minutes and time.monotonic() - began > tc.max_minutes * 60):
            break
    model.load_state_dict(best_state)
    trial.set_user_attr("val_ic", best)
    trial.set_user_attr("test_ic", plain_ic(_predict(model, test, tc.resolved_eval_batch_size), test))
    return best


def plain_worker(spec: dict[str, Any]) -> None:
    """One process of the plain loop: ``study.optimize`` on the shared SQLite study until the clock
    (counted from here: after the imports, the data loading inside it) has run out."""
    import optuna
    import torch

    from sweeper.config import load_config
    from sweeper.data.load import load_panel

    began = time.monotonic()
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cfg = load_config(spec["study_file"], spec["sets"])
    sc, pc = cfg.study.sampler, cfg.study.pruner
    # the file's median pruner options; a file that prunes otherwise (or not at all) does not move the loop's
    options = pc.options if pc.name == "median" else LOOP_PRUNER
    panel = load_panel(cfg.data)  # sweeper's loader: the same split, purge and normalisation
    data = {split: Windows(panel, split) for split in ("train", "valid", "test")}
    seed = None if sc.seed is None else sc.seed + spec["index"]
    # TPE whatever sweeper's file samples with (the docs' first sampler), with the file's options it takes
    tpe = inspect.signature(optuna.samplers.TPESampler).parameters
    sampler = optuna.samplers.TPESampler(seed=seed, **{k: v for k, v in sc.options.items() if k in tpe})
    study = optuna.load_study(study_name=spec["name"], storage=spec["storage"], sampler=sampler,
                              pruner=optuna.pruners.MedianPruner(**options))
    left = spec["clock"] - (time.monotonic() - began)
    if left > 0:
        study.optimize(lambda trial: _objective(trial, cfg, data), timeout=left)


# ------------------------------------------------------------------ the two sides, run and read back


def _run_sweeper(tmp: Path, study_file: Path, sets: list[str], clock: float, cache: str) -> dict[str, Any]:
    import optuna

    from sweeper.config import load_config

    args = [sys.executable, "-m", "sweeper.cli", "run", str(study_file)]
    for s in [*sets, f"study.timeout={clock}", "study.n_trials=100000"]:
        args += ["--set", s]
    shutil.rmtree(Path(cache) / ".stack-sizes", ignore_errors=True)  # a stack size is measured afresh
    launch, began = datetime.now(), time.perf_counter()
    proc = subprocess.run(args, cwd=tmp, capture_output=True, text=True)
    wall = time.perf_counter() - began
    (tmp / "sweeper.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}:\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    cfg = load_config(study_file, sets)
    study = optuna.load_study(study_name=cfg.study.name, storage=cfg.study.resolved_storage)
    got = subprocess.run([sys.executable, "-m", "sweeper.cli", "best", str(study_file), "--json"], cwd=tmp,
                         capture_output=True, text=True)
    if got.returncode:
        raise RuntimeError(f"sweeper best exited {got.returncode}: {got.stderr[-2000:]}")
    best = json.loads(got.stdout)
    return {"launch": launch, "wall_s": wall, "trials": study.get_trials(deepcopy=False), "best": best,
            "run_dir": Path(cfg.study.resolved_artifacts), "cfg": cfg,
            "pick": {"trial": best["trial"], "val_ic": best["value"], "test_ic": best["metrics"]["test_ic"],
                     "seed_ensemble": cfg.validation.repeats >= 2,
                     "top3_ensemble_test_ic": ((best.get("ensemble") or {}).get("test") or {}).get("ic")},
            "baseline_s": (best.get("baseline") or {}).get("elapsed_s"),
            # what the study stacked by (its measured size, with population_size under study.population),
            # and how many populations of each size trained (1: a trial alone)
            "stack_size": study.user_attrs.get("stack_size"),
            "populations": dict(Counter(len(g) for g in {tuple(t.user_attrs.get("population") or [t.number])
                                                         for t in study.get_trials(deepcopy=False)}))}


def _run_plain(tmp: Path, study_file: Path, sets: list[str], clock: float) -> dict[str, Any]:
    import optuna

    from sweeper.config import load_config
    from sweeper.devices.slots import cpu_slots

    cfg = load_config(study_file, sets)
    folder = tmp / "plain"
    folder.mkdir()
    storage, name = f"sqlite:///{folder}/study.db", f"plain_{cfg.study.name}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(study_name=name, storage=storage, direction=cfg.study.resolved_direction)
    n = len(cpu_slots(cfg.devices.cpu_workers))  # what sweeper's CPU slots are on this box
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    spec = {"study_file": str(study_file), "sets": sets, "storage": storage, "name": name, "clock": clock}
    launch, began = datetime.now(), time.perf_counter()
    logs = [(folder / f"worker-{k}.log").open("w") for k in range(n)]
    procs = [subprocess.Popen([sys.executable, __file__, "--plain-worker", json.dumps({**spec, "index": k})],
                              cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT)
             for k, log in enumerate(logs)]
    codes = [p.wait() for p in procs]
    wall = time.perf_counter() - began
    for log in logs:
        log.close()
    if any(codes):
        tails = "\n".join((folder / f"worker-{k}.log").read_text()[-2000:] for k in range(n))
        raise RuntimeError(f"plain loop workers exited {codes}:\n{tails}")
    trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
    done = [t for t in trials
            if t.state.name == "COMPLETE" and t.value is not None and math.isfinite(t.value)]
    pick = max(done, key=lambda t: (t.value, -t.number)) if done else None
    return {"launch": launch, "wall_s": wall, "trials": trials, "processes": n,
            "pick": None if pick is None else {"trial": pick.number, "val_ic": pick.value,
                                               "test_ic": pick.user_attrs.get("test_ic")}}


def _agreement(side: dict[str, Any], panel: Any, rows: dict[str, Windows]) -> dict[str, Any]:
    """Both sides score the same rows with the same function: a sweeper trial's stored predictions,
    aligned to the plain side's rows, give its stored val_ic and test_ic through :func:`plain_ic`."""
    import numpy as np
    import pandas as pd

    from sweeper.store import layout

    cfg, out = side["cfg"], {}
    scored = side["best"]["scored_on"]["metrics"]
    for split in ("valid", "test"):
        # the split's span (its last dates may have no label yet: their rows are compared below)
        assert scored[split]["dates"] == panel.split_dates()[split], \
            f"{split} dates: sweeper {scored[split]['dates']}, plain {panel.split_dates()[split]}"
    done = sorted((t for t in side["trials"] if t.state.name == "COMPLETE"), key=lambda t: t.number)
    trial = next(t for t in done
                 if layout.trial_files(side["run_dir"], t.number).predictions("test").exists())
    ensemble = cfg.validation.aggregate == "ensemble"
    for split, key in (("valid", "value" if ensemble else "val_ic"), ("test", "test_ic")):
        if split == "valid" and cfg.validation.runs > 1 and not ensemble:
            continue  # val_ic is then a mean over runs, not the IC of one file
        stored = pd.read_parquet(layout.trial_files(side["run_dir"], trial.number).predictions(split))
        frame = stored[stored["label"].notna()]  # it also predicts the present rows whose label is unknown
        keys = pd.MultiIndex.from_arrays([rows[split].dates, rows[split].assets])
        aligned = frame.set_index(["date", "asset"]).reindex(keys)
        assert len(frame) == len(rows[split]) and not aligned["pred"].isna().any(), \
            f"{split}: sweeper scored {len(frame)} rows, the plain side has {len(rows[split])}"
        assert np.array_equal(aligned["label"].to_numpy(np.float32), rows[split].label_raw.astype(np.float32),
                              equal_nan=True), f"{split}: the raw labels differ"
        # a seed ensemble's valid file is the ensemble's: its IC is the trial's value, not the runs' mean
        # (both from the seeds' model frames since 2026-12-05, session 6; 3.1e-9 apart before)
        stored_ic = trial.value if key == "value" else trial.user_attrs[key]
        ours, theirs = plain_ic(aligned["pred"].to_numpy(), rows[split]), float(stored_ic)
        assert abs(ours - theirs) <= AGREE_TOL, \
            f"{split}: plain_ic {ours} against sweeper's stored {key} {theirs}"
        out[split] = {"trial": trial.number, "rows": len(frame), "unlabelled_rows": len(stored) - len(frame),
                      "plain_ic": ours, "stored": theirs, "stored_as": key, "tolerance": AGREE_TOL,
                      "dates": scored[split]["dates"]}
    return out


# ------------------------------------------------------------------ the figures


def _timeline(trials: list[Any], launch: datetime) -> dict[str, Any]:
    """Finished trials from the side's launch: counts, the first one's time, the best val IC over time."""
    ended = sorted(((t.datetime_complete - launch).total_seconds(), t) for t in trials
                   if t.state.name in FINISHED and t.datetime_complete is not None)
    curve: list[tuple[float, float]] = []
    for s, t in ended:
        if t.state.name == "COMPLETE" and t.value is not None and math.isfinite(t.value) \
                and (not curve or t.value > curve[-1][1]):
            curve.append((s, t.value))
    states = [t.state.name for _, t in ended]
    starts = [(t.datetime_start - launch).total_seconds() for t in trials if t.datetime_start is not None]
    return {"first_start_s": min(starts) if starts else None, "finished": len(ended),
            "complete": states.count("COMPLETE"), "pruned": states.count("PRUNED"),
            "first_finished_s": ended[0][0] if ended else None, "last_end_s": ended[-1][0] if ended else None,
            "curve": curve, "final_best_val_ic": curve[-1][1] if curve else None,
            "time_to_final_best_s": curve[-1][0] if curve else None,
            # each finished trial, to read what a side tried: number, state, start, end, value (a pruned
            # trial's: its last report), params
            "trials": [[t.number, t.state.name, round((t.datetime_start - launch).total_seconds(), 1),
                        round(s, 1),
                        _r(t.value if t.value is not None else t.intermediate_values.get(t.last_step or 0)),
                        {k: _r(v, 6) for k, v in t.params.items()}] for s, t in ended]}


def _time_to(curve: list[tuple[float, float]], target: float | None) -> float | None:
    return None if target is None else next((s for s, v in curve if v >= target), None)


def _r(v: Any, nd: int = 5) -> Any:
    """``v`` rounded; a float that is not finite is None (JSON has neither NaN nor infinity)."""
    if isinstance(v, float):
        return round(v, nd) if math.isfinite(v) else None
    return v


def _race(study: str, seed: int, clock: float, base: list[str], cache: str,
          sweeper_first: bool, fixed_sampler_seed: bool = False) -> dict[str, Any]:
    from sweeper.config import load_config
    from sweeper.data.load import load_panel

    sets = [*base, f"data.synthetic.seed={seed}", "devices.gpus=none"]
    with tempfile.TemporaryDirectory(prefix=f"race-{study}-{seed}-") as name:
        tmp = Path(name)
        study_file = tmp / f"{study}_ic.yaml"
        shutil.copy(ROOT / "studies" / f"{study}_ic.yaml", study_file)
        cfg = load_config(study_file, sets)
        sampler_seed = cfg.study.sampler.seed
        if sampler_seed is not None and not fixed_sampler_seed:
            # each data seed draws its own first configs on both sides (the loop's processes: this + 0, 1):
            # with the file's seed on every data seed, the median would be over one draw of that luck
            sampler_seed += SAMPLER_STRIDE * seed
            sets.append(f"study.sampler.seed={sampler_seed}")
        panel = load_panel(cfg.data)  # the panel cache, built before either side (the seed moves no data)
        rows = {split: Windows(panel, split) for split in ("valid", "test")}
        sides: dict[str, dict[str, Any]] = {}
        for side in (("sweeper", "plain") if sweeper_first else ("plain", "sweeper")):
            _log(f"{study} seed {seed}: {side} for {clock:g} s")
            sides[side] = (_run_sweeper(tmp, study_file, sets, clock, cache) if side == "sweeper"
                           else _run_plain(tmp, study_file, sets, clock))
        agree = _agreement(sides["sweeper"], panel, rows)
    out: dict[str, Any] = {"study": study, "data_seed": seed, "sampler_seed": sampler_seed, "clock_s": clock,
                           "order": "sweeper first" if sweeper_first else "plain first", "agreement": agree}
    lines = {name: _timeline(side["trials"], side["launch"]) for name, side in sides.items()}
    for name, other in (("sweeper", "plain"), ("plain", "sweeper")):
        line, side = lines[name], sides[name]
        out[name] = {**{k: _r(v, 2) for k, v in line.items() if k not in ("curve", "final_best_val_ic")},
                     "final_best_val_ic": _r(line["final_best_val_ic"]),
                     "best_over_time": [[round(s, 1), round(v, 5)] for s, v in line["curve"]],
                     "time_to_other_final_best_s":
                         _r(_time_to(line["curve"], lines[other]["final_best_val_ic"]), 2),
                     "wall_s": round(side["wall_s"], 1),
                     "pick": {k: _r(v) for k, v in (side["pick"] or {}).items()} or None}
    for key in ("baseline_s", "stack_size", "populations"):
        out["sweeper"][key] = sides["sweeper"][key]
    out["plain"]["processes"] = sides["plain"]["processes"]
    reach, own = out["sweeper"]["time_to_other_final_best_s"], out["plain"]["time_to_final_best_s"]
    out["sweeper_reached_loops_best"] = reach is not None
    out["ratio"] = None if own is None or reach is None else round(reach / max(own, 1e-9), 3)
    picks = [(out[s]["pick"] or {}).get("test_ic") for s in ("sweeper", "plain")]
    out["test_ic_diff"] = None if None in picks else _r(picks[0] - picks[1])
    return out


def _say(run: dict[str, Any]) -> None:
    _log(f"== {run['study']} data seed {run['data_seed']} (sampler seed {run['sampler_seed']}, "
         f"{run['clock_s']:g} s each, {run['order']}): "
         f"ratio {run['ratio']}, test IC of the picks: sweeper - plain = {run['test_ic_diff']}")
    for name in ("sweeper", "plain"):
        s = run[name]
        pick = s["pick"] or {}
        _log(f"  {name:7s} first finished {s['first_finished_s']} s; {s['finished']} finished "
             f"({s['complete']} complete, {s['pruned']} pruned), last end {s['last_end_s']} s; final best "
             f"val IC {s['final_best_val_ic']} at {s['time_to_final_best_s']} s; reaches the other's final "
             f"best at {s['time_to_other_final_best_s']} s; pick trial {pick.get('trial')} test IC "
             f"{pick.get('test_ic')}")
        curve = ", ".join(f"{t:g}s {v:.4f}" for t, v in s["best_over_time"])
        _log(f"          best val IC over time: {curve}")


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for study in dict.fromkeys(r["study"] for r in runs):
        mine = [r for r in runs if r["study"] == study]
        # a seed where sweeper never reached the loop's best counts as an infinite ratio
        ratios = [r["ratio"] if r["sweeper_reached_loops_best"] else math.inf
                  for r in mine if r["plain"]["time_to_final_best_s"] is not None]
        diffs = [r["test_ic_diff"] for r in mine if r["test_ic_diff"] is not None]

        def med(values: list[Any]) -> Any:
            values = [v for v in values if v is not None]
            return _r(statistics.median(values)) if values else None

        ratio, diff = statistics.median(ratios) if ratios else None, med(diffs)
        never = ratio == math.inf
        ratio = _r(ratio, 3)
        out[study] = {
            "data_seeds": [r["data_seed"] for r in mine], "median_ratio": ratio, "median_test_ic_diff": diff,
            **{f"median_{k}_{s}": med([r[s][k] for r in mine]) for s in ("sweeper", "plain")
               for k in ("first_start_s", "first_finished_s", "final_best_val_ic", "time_to_final_best_s",
                         "finished")},
            "median_pick_test_ic_sweeper": med([(r["sweeper"]["pick"] or {}).get("test_ic") for r in mine]),
            "median_pick_test_ic_plain": med([(r["plain"]["pick"] or {}).get("test_ic") for r in mine]),
            "median_never_reached": never,
            "check_ratio_at_most_0.67": None if not ratios else (not never and ratio <= TARGET_RATIO),
            "check_test_ic_at_least_loops": None if diff is None else diff >= 0,
            "check_on_3_seeds": len(mine) >= 3}
        _log(f"{study}: median ratio {ratio} (<= {TARGET_RATIO}: {out[study]['check_ratio_at_most_0.67']}), "
             f"median test IC diff {diff} (>= 0: {out[study]['check_test_ic_at_least_loops']}), "
             f"{len(mine)} data seed(s)")
    return out


def _pairs(items: list[str], cast: Any) -> dict[str, Any]:
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        out[key] = cast(value)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", default=",".join(STUDIES))
    parser.add_argument("--data-seeds", default="0,1,2")
    parser.add_argument("--clock", type=float, default=300.0, help="seconds of wall clock for each side")
    parser.add_argument("--seeds-for", action="append", default=[], help="STUDY=0,1: that study's data seeds")
    parser.add_argument("--clock-for", action="append", default=[], help="STUDY=SECONDS: that study's clock")
    parser.add_argument("--fixed-sampler-seed", action="store_true",
                        help="every data seed races with the study file's sampler seed (the old protocol)")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--plain-worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.plain_worker:
        plain_worker(json.loads(args.plain_worker))
        return {}
    studies = args.studies.split(",")
    seeds = {s: [int(v) for v in args.data_seeds.split(",") if v] for s in studies}
    seeds.update(_pairs(args.seeds_for, lambda v: [int(x) for x in v.split(",") if x]))
    clocks = dict.fromkeys(studies, args.clock) | _pairs(args.clock_for, float)
    base: list[str] = []
    if args.smoke:
        base, studies, seeds, clocks = list(SMOKE), ["mlp"], {"mlp": [0]}, {"mlp": 4.0}
    began = time.perf_counter()
    runs = []
    with tempfile.TemporaryDirectory(prefix="race-cache-") as cache:
        os.environ["SWEEPER_CACHE_DIR"] = cache  # one panel cache for both sides, built before either runs
        for study in studies:
            for n, seed in enumerate(seeds[study]):
                runs.append(_race(study, seed, clocks[study], base, cache, sweeper_first=n % 2 == 0,
                                  fixed_sampler_seed=args.fixed_sampler_seed))
                _say(runs[-1])
    report = {"machine": f"{os.cpu_count()} cores", "smoke": args.smoke, "settings": base,
              "sampler_seeds": ("the file's" if args.fixed_sampler_seed
                                else f"the file's + {SAMPLER_STRIDE} x data seed"),
              "clocks": {s: clocks[s] for s in studies}, "runs": runs, "studies": _summary(runs),
              "seconds": round(time.perf_counter() - began, 1)}
    print(json.dumps(report, default=str, allow_nan=False))
    return report


if __name__ == "__main__":
    main()
