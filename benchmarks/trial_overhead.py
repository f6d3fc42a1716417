"""A trial's fixed cost (issue 41, item 1): everything in a sweep's trial but its epochs' training and
validation passes, for this tree and an older one (``--rev``) in the same run.

Each tree runs ``python -m sweeper.cli run`` (its own sweeper on ``PYTHONPATH``) on a copy of the study
file with an empty search space (every trial trains the file's one config, so every trial does the same
work), no pruner, no LightGBM baseline, ``train.epochs`` E, in a fresh folder. A trial's span is the
store's ``datetime_complete - datetime_start``: from the driver's claim to the result in the store, so
it holds the worker's set-up, the final scoring, predictions, files and the store writes. Two sweeps, of
1 and of 3 epochs, give a trial's time per epoch ``P = (median span(3) - median span(1)) / 2`` and its
fixed cost ``F = median span(1) - P`` (a first epoch's extra cost, warm-up, counts as fixed).

Three layouts: ``alone`` (``devices.cpu_workers`` 1: one trial on the box, with every core's thread),
``alone_one_core`` (the same sweep pinned to the first core: one trial, one thread) and ``beside`` (2
workers: two trials train at once, each with half the cores, the 2-core box's default). Sharing the CPU
slows an epoch by ``P_beside / P_alone``; the fixed cost should grow by no more than that
(``growth_vs_sharing`` <= 1). ``alone`` has twice ``beside``'s threads on a 2-core box, so
``growth_vs_sharing_same_threads`` compares ``beside`` with ``alone_one_core``: one thread a trial in
both, and what is left is the sharing (caches, memory bandwidth, the store). The trees alternate per
round (current first, then the other way round).

Two costs are read per trial instead of differenced: ``outside_s`` (its span less its training call,
``duration_s``: the worker's set-up, files and store writes) and ``scoring_s`` (its final scoring's own
time, ``final_scoring_s``, inside the training call: the best weights over valid and test, none for a
tree older than that attribute). Their growth beside a second trial over an epoch's, at one thread a
trial, is ``outside_growth_same_threads`` and ``scoring_growth_same_threads``.

    python benchmarks/trial_overhead.py [--rev 4d48ecd] [--study studies/transformer_ic.yaml]
                                        [--trials 5] [--rounds 2] [--smoke]

The last line is JSON: {"rev", "study", "layouts": {layout: {tree: {"fixed_s", "epoch_s", "outside_s",
"scoring_s", "rounds"}}},
"ratios": {layout: current fixed / old fixed}, "growth_vs_sharing": {tree: ...}}.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
LAYOUTS = {"alone": (1, False), "alone_one_core": (1, True), "beside": (2, False)}  # workers, pinned
SMOKE = ["data.synthetic.assets=40", "data.synthetic.dates=200", "data.synthetic.features=4",
         "data.lookback=5", "train.samples_per_epoch=1024"]


def _spans(tree: Path, study: Path, workers: int, epochs: int, trials: int, sets: list[str],
           pinned: bool = False) -> tuple[list[float], list[float], list[float]]:
    """The store's span of every finished trial of one sweep of ``tree``'s sweeper, its time outside the
    training call, and its final scoring's own time (``final_scoring_s``; a tree before it: none)."""
    import optuna

    raw = yaml.safe_load(study.read_text())
    raw["search_space"] = {}
    raw["study"].update(name="overhead", storage="sqlite:///overhead.db", n_trials=trials, timeout=None,
                        pruner={"name": "none"})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "study.yaml"
        path.write_text(yaml.safe_dump(raw))
        args = [sys.executable, "-m", "sweeper.cli", "run", str(path)]
        for s in [*sets, "report.baseline=null", "devices.gpus=none", f"devices.cpu_workers={workers}",
                  f"train.epochs={epochs}"]:
            args += ["--set", s]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        # pinned: the sweep and its workers (who inherit it) see one core, so sweeper gives a slot one thread
        first = min(os.sched_getaffinity(0))
        done = subprocess.run(args, cwd=tmp, capture_output=True, text=True, env=env,
                              preexec_fn=(lambda: os.sched_setaffinity(0, {first})) if pinned else None)
        if done.returncode:
            raise RuntimeError(f"{tree}: exit {done.returncode}\n{done.stdout[-2000:]}\n"
                               f"{done.stderr[-2000:]}")
        stored = optuna.load_study(study_name="overhead", storage=f"sqlite:///{tmp}/overhead.db")
        done_trials = [t for t in stored.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
        spans = [(t.datetime_complete - t.datetime_start).total_seconds() for t in done_trials]
        # outside the training call (duration_s: the epochs and the final scoring): set-up, files, store
        outside = [span - t.user_attrs["duration_s"] for span, t in zip(spans, done_trials)]
        scoring = [t.user_attrs["final_scoring_s"] for t in done_trials if "final_scoring_s" in t.user_attrs]
    if len(spans) != trials:
        raise RuntimeError(f"{tree}: {len(spans)} of {trials} trials completed")
    return spans, outside, scoring


def _measure(tree: Path, study: Path, layout: tuple[int, bool], trials: int,
             sets: list[str]) -> dict[str, Any]:
    (one, out1, sc1), (three, out3, sc3) = (_spans(tree, study, layout[0], e, trials, sets, layout[1])
                                            for e in (1, 3))
    epoch = (statistics.median(three) - statistics.median(one)) / 2
    # the final scoring read per trial: inside the training call, so neither "outside" nor an epoch
    return {"fixed_s": statistics.median(one) - epoch, "epoch_s": epoch,
            "outside_s": statistics.median(out1 + out3),
            "scoring_s": statistics.median(sc1 + sc3) if sc1 + sc3 else None, "spans": {"1": one, "3": three}}


def compare(rev: str, study: Path, trials: int, rounds: int, sets: list[str],
            layouts: list[str] | None = None) -> dict[str, Any]:
    report: dict[str, Any] = {"rev": rev, "study": str(study), "trials": trials, "rounds": rounds,
                              "layouts": {}}
    todo = {name: LAYOUTS[name] for name in layouts or LAYOUTS}
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(old), rev], cwd=ROOT, check=True)
        try:
            for layout, how in todo.items():
                got: dict[str, list[dict[str, Any]]] = {"current": [], "old": []}
                for r in range(rounds):
                    order = [("current", ROOT), ("old", old)][:: 1 if r % 2 == 0 else -1]
                    for name, tree in order:
                        got[name].append(_measure(tree, study, how, trials, sets))
                        print(f"{layout} round {r} {name}: fixed {got[name][-1]['fixed_s']:.2f} s, epoch "
                              f"{got[name][-1]['epoch_s']:.2f} s", file=sys.stderr, flush=True)
                report["layouts"][layout] = {name: _summary(runs) for name, runs in got.items()}
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, check=False)
    lay = report["layouts"]
    report["ratios"] = {layout: _ratio(lay[layout]["current"]["fixed_s"], lay[layout]["old"]["fixed_s"])
                        for layout in todo}
    # a fixed cost's growth beside a second trial over an epoch's (<= 1: sharing the CPU explains it)
    for key, alone, cost in (("growth_vs_sharing", "alone", "fixed_s"),
                             ("growth_vs_sharing_same_threads", "alone_one_core", "fixed_s"),
                             ("outside_growth_same_threads", "alone_one_core", "outside_s"),
                             ("scoring_growth_same_threads", "alone_one_core", "scoring_s")):
        if alone in lay and "beside" in lay:
            report[key] = {name: _ratio(_ratio(lay["beside"][name][cost], lay[alone][name][cost]),
                                        _ratio(lay["beside"][name]["epoch_s"], lay[alone][name]["epoch_s"]))
                           for name in ("current", "old")}
    return report


def _ratio(a: float | None, b: float | None) -> float | None:
    """a / b to 3 places; None where b is 0 or either is unknown (a smoke's tiny spans can be)."""
    return None if a is None or not b else round(a / b, 3)


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds, with each round's figures."""
    keys = ("fixed_s", "epoch_s", "outside_s", "scoring_s")

    def median(k: str) -> float | None:
        known = [r[k] for r in runs if r[k] is not None]
        return round(statistics.median(known), 3) if known else None

    return {**{k: median(k) for k in keys},
            "rounds": [{**{k: None if r[k] is None else round(r[k], 3) for k in keys},
                        "spans": {e: [round(s, 3) for s in v] for e, v in r["spans"].items()}} for r in runs]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", default="HEAD~1", help="the older tree (a git revision)")
    ap.add_argument("--study", type=Path, default=ROOT / "studies" / "transformer_ic.yaml")
    ap.add_argument("--trials", type=int, default=5, help="trials per sweep (their median span counts)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help="which layouts, comma-separated")
    ap.add_argument("--smoke", action="store_true", help="a tiny panel, 2 trials, 1 round: every path")
    args = ap.parse_args(argv)
    sets = SMOKE if args.smoke else []
    trials, rounds = (2, 1) if args.smoke else (args.trials, args.rounds)
    report = compare(args.rev, args.study.resolve(), trials, rounds, sets, args.layouts.split(","))
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
