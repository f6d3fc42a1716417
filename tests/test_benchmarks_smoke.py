"""The benchmark scripts run end to end on the CPU and end with their JSON line."""
from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(script: str, *args: str, timeout: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWEEPER_")}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_core_overhead_smoke():
    out = _run("core_overhead.py", "--smoke", timeout=120)
    assert {"core_samples_per_s", "plain_samples_per_s", "ratio"} <= set(out)
    assert (out["model"], out["repeats"], out["epochs_counted"]) == ("mlp", 1, 1)
    assert out["core_samples_per_s"] > 0 and out["plain_samples_per_s"] > 0
    # the rates are printed rounded to whole samples/s and the ratio is taken before that rounding:
    # the two agree to its third decimal, give or take its last digit (0.881 from 52,504 / 59,562)
    assert out["ratio"] == pytest.approx(out["core_samples_per_s"] / out["plain_samples_per_s"], abs=1e-3)


@pytest.mark.slow
def test_stacked_smoke_times_both_grids_and_scores_the_ensemble():
    out = _run("stacked.py", "--smoke", timeout=240)
    mlp = out["models"]["mlp"]
    for grid in ("1x4", "4x2"):
        assert mlp[grid]["stacked_s"] > 0 and mlp[grid]["lone_s"] > 0
        assert mlp[grid]["ratio"] == round(statistics.median(mlp[grid]["ratios"]), 3)
    (quality,) = out["quality"]
    assert len(quality["single_test_ic"]) == 4 and quality["data_seed"] == 0
    assert quality["mean_single_test_ic"] == pytest.approx(statistics.mean(quality["single_test_ic"]), abs=1e-5)


@pytest.mark.slow
def test_startup_smoke_forks_a_ready_worker():
    out = _run("startup.py", "--smoke", timeout=240)
    ours = out["ours"]
    assert (out["smoke"], ours["fork_server"], len(ours["ready_s"])) == (True, True, 1)
    assert ours["ready_median_s"] > 0 and ours["first_step_median_s"] > 0
    assert ours["idle_private_mb"] is None or ours["idle_private_mb"] > 0
    assert ours["status_median_s"] is None and ours["first_sweep_wall_median_s"] is None  # a smoke times no command
    # the baseline job (forked too): its slot time holds its fit and what it costs beyond it
    assert 0 < ours["baseline_fit_median_s"] < ours["baseline_slot_median_s"]
    beyond = ours["baseline_slot_median_s"] - ours["baseline_fit_median_s"]  # one job: its own figures
    assert abs(ours["baseline_beyond_fit_median_s"] - beyond) <= 0.002  # each rounded to 1 ms


@pytest.mark.slow
def test_gpu_check_cpu_smoke_runs_every_section():
    out = _run("gpu_check.py", "--cpu-smoke", timeout=300)
    assert (out["cuda"], out["cpu_smoke"], out["ok"]) == (False, True, True)
    runs = out["throughput"]["runs"]
    assert [(r["model"], r["precision"]) for r in runs] == [("mlp", "fp32"), ("mlp", "bf16"),
                                                              ("lstm", "fp32"), ("lstm", "bf16")]
    assert out["throughput"]["auto_precision"] == "fp32"
    # the stand-in memory: 90 % of 1 MB at 2 kB per row
    assert out["probe"]["micro_batch"] == 450 and out["probe"]["tried"][:4] == [64, 128, 256, 512]
    assert [s["size"] for s in out["probe"]["scan"]] == [64, 128, 256, 450, 512]
    assert out["oom"] == {**out["oom"], "batch_size": 256, "micro_batch_size": 128, "accum_steps": 2,
                          "recovered": True}
    stacked = out["stacked"]["runs"]
    assert [(r["model"], r["k"]) for r in stacked] == [(m, k) for m in ("mlp", "transformer", "lstm") for k in (1, 4)]
    assert all(r["samples_per_s"] > 0 and r["gpu_util"]["samples"] == 0 for r in stacked)
    assert [r["vs_k_separate"] for r in stacked if r["k"] == 1] == [1.0, 1.0, 1.0]
    population = out["population"]  # stacks of 1 and 4 different trials (own lr, weight decay, dropout, seed)
    assert [(r["model"], r["p"]) for r in population["runs"]] == [(m, p) for m in ("mlp", "transformer",
                                                                                   "lstm") for p in (1, 4)]
    assert all(r["member_samples_per_s"] > 0 and r["gpu_util"]["samples"] == 0 for r in population["runs"])
    assert [r["vs_p1"] for r in population["runs"] if r["p"] == 1] == [1.0, 1.0, 1.0]
    assert "dropped" not in population and set(population["members"]) == {"train.lr", "train.weight_decay",
                                                                          "model.dropout", "train.seed"}
    packing = out["packing"]
    for per_gpu in ("auto", 1):
        row = packing[f"per_gpu_{per_gpu}"]
        assert (row["trials_per_gpu"], row["finished"], row["failed"]) == (per_gpu, 4, 0)
        assert row["median_peak_mem_mb"] == 1200.0  # what the fake GPU's trials report
        assert row["gpu_util"]["samples"] == 0  # no NVML behind a fake GPU
    # packing stamps each trial's allotment, one of the three it gives on this fake GPU (a shape
    # measured or not yet); which trial gets which depends on when each worker was ready (a forked
    # one is ready sooner), so the median of the 4 trials is a median of 4 of those values
    allotments = (1200.0, 1500.0, 3600.0)
    medians = {statistics.median(c) for c in itertools.combinations_with_replacement(allotments, 4)}
    assert packing["per_gpu_auto"]["median_allotted_mb"] in medians
    assert packing["per_gpu_1"]["median_allotted_mb"] is None
    assert packing["trials_per_hour_ratio"] > 0


@pytest.mark.slow
def test_selection_smoke_compares_the_schemes_at_equal_training_time():
    out = _run("selection.py", "--smoke", timeout=600)
    assert (out["seeds"], out["configs"]) == ([0], 3)
    # 2 folds in the smoke: runs per trial 1, 2 and 4, so 12, 6 and 3 trials of equal training
    assert [out["schemes"][s]["trials"] for s in ("holdout", "wf_r1", "wf_r2")] == [12, 6, 3]
    for s in out["schemes"].values():
        assert len(s["per_seed"]) == 1 and -1 <= s["spearman"] <= 1
        assert s["gap"] == s["per_seed"][0]["gap"] and s["train_s"] > 0
    ho, wf = out["schemes"]["holdout"], out["schemes"]["wf_r2"]
    assert wf["abs_gap"] == abs(wf["gap"]) and out["gap_ratio"] == round(wf["abs_gap"] / ho["abs_gap"], 3)
    assert out["aim_met"] == (out["gap_ratio"] <= 0.5 and out["spearman_delta"] >= 0)


@pytest.mark.slow
def test_selection_smoke_at_equal_wall_time_sweeps_each_scheme_for_the_budget():
    # 6 s: study.timeout counts from the driver's start, and under the suite's load its workers
    # can take 3-5 s to be ready (a budget that ends before then starts no trial)
    out = _run("selection.py", "--smoke", "--budget", "6", timeout=600)
    assert (out["seeds"], out["budget_s"]) == ([0], 6.0)
    schemes = out["schemes"]
    assert list(schemes) == ["holdout", "holdout_r4", "wf_r2"]
    for s in schemes.values():
        # study.timeout: no trial starts after 6 s, the running ones finish
        (seed,) = s["per_seed"]
        assert s["trials"] == seed["trials"] >= 1 and s["wall_s"] > 6.0 and s["train_s"] > 0
        assert (s["oracle_share"], s["gap"]) == (seed["oracle_share"], seed["gap"])  # one seed: its own
    ho, wf = schemes["holdout"], schemes["wf_r2"]
    # a scheme that finished fewer than 3 trials has no pick (no gap): then no ratio either
    both = ho["abs_gap"] and wf["abs_gap"] is not None
    assert out["gap_ratio"] == (round(wf["abs_gap"] / ho["abs_gap"], 3) if both else None)


@pytest.mark.slow
def test_fold_pruning_smoke_counts_the_runs_of_each_arm():
    out = _run("fold_pruning.py", "--smoke", timeout=600)
    assert (out["trials"], out["folds"], out["repeats"], out["epochs"]) == (6, 2, 1, 2)
    assert (out["possible_runs"], out["possible_epochs"]) == (12, 24)
    # no pruner: every fold of every trial runs all its epochs (patience 3 > 2 epochs)
    none, median = out["arms"]["none"], out["arms"]["median"]
    assert (none["complete"], none["runs_finished"], none["epochs_trained"]) == (6, 12, 24)
    assert median["complete"] + median["pruned"] == 6 and median["runs_finished"] <= 12
    assert out["saved_runs"] == round(1 - median["runs_finished"] / 12, 3)
    assert out["saved_epochs"] == round(1 - median["epochs_trained"] / 24, 3)


@pytest.mark.slow
def test_population_smoke_sweeps_both_arms_and_compares_their_best():
    out = _run("population.py", "--smoke", timeout=300)
    mlp = out["throughput"]["mlp"]
    (on,), (off,) = mlp["on"], mlp["off"]
    assert (on["population_asked"], off["population_asked"], off["population"]) == ("auto", 1, 1)
    for arm in (on, off):  # study.timeout 4 s: at least one trial, none failed, the rate from the store
        assert arm["finished"] >= 1 and set(arm["states"]) <= {"COMPLETE", "PRUNED"}
        assert arm["per_min"] == pytest.approx(60 * arm["finished"] / arm["span_s"], rel=0.01)  # span rounded
    assert 1 <= on["population"] <= 8 and mlp["population"] == [on["population"]]
    # every trial in one population: the off arm's each alone
    assert sum(int(k) * n for k, n in on["trained"].items()) == sum(on["states"].values())
    assert off["trained"] == {"1": sum(off["states"].values())}
    assert mlp["ratio"] == round(on["per_min"] / off["per_min"], 3)
    eff = out["efficiency"]
    (seed,) = eff["per_seed"]
    assert (eff["trials"], seed["data_seed"]) == (4, 0)
    assert seed["diff"] == pytest.approx(seed["best_on"] - seed["best_off"])
    assert eff["se"] is None and eff["within_one_se"] is None  # one data seed: no standard error
    assert out["checks"]["mlp_at_least_1.4x"] == (mlp["ratio"] >= 1.4)


@pytest.mark.slow
def test_trial_overhead_smoke_times_both_trees_in_every_layout():
    out = _run("trial_overhead.py", "--smoke", "--rev", "HEAD", timeout=600)
    assert (out["rev"], out["trials"], out["rounds"]) == ("HEAD", 2, 1)
    assert set(out["growth_vs_sharing_same_threads"]) == {"current", "old"}
    assert set(out["outside_growth_same_threads"]) == {"current", "old"}
    assert set(out["scoring_growth_same_threads"]) == {"current", "old"}
    for layout in ("alone", "alone_one_core", "beside"):
        for tree in ("current", "old"):
            (run,) = out["layouts"][layout][tree]["rounds"]
            one, three = run["spans"]["1"], run["spans"]["3"]
            assert len(one) == len(three) == 2 and min(one + three) > 0
            # the fixed cost and the epoch's from the two sweeps' median spans (rounded to 1 ms)
            epoch = (statistics.median(three) - statistics.median(one)) / 2
            assert run["epoch_s"] == pytest.approx(epoch, abs=2e-3)
            assert run["fixed_s"] == pytest.approx(statistics.median(one) - epoch, abs=2e-3)
            # the median of the four trials' spans less their training calls: each under its own span (a
            # 3-epoch trial's can exceed a 1-epoch trial's whole span under load)
            assert 0 < run["outside_s"] < max(one + three)
            # the final scoring's own time, read per trial (both trees have final_scoring_s)
            assert 0 < run["scoring_s"] < max(one + three)
        lay = out["layouts"][layout]
        old = lay["old"]["fixed_s"]
        assert out["ratios"][layout] == (round(lay["current"]["fixed_s"] / old, 3) if old else None)
