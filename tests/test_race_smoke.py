"""benchmarks/race.py --smoke: sweeper and the plain Optuna loop race end to end, and agree on the split
and the IC function (issue 41). In a file of its own: tests/test_benchmarks_smoke.py's helper, copied."""
from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sweeper.devices.slots import cpu_slots

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_race_smoke_runs_both_sides_and_checks_they_agree():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWEEPER_")}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "race.py"), "--smoke"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    (run,) = out["runs"]
    assert (run["study"], run["data_seed"], run["clock_s"], out["smoke"]) == ("mlp", 0, 4.0, True)
    # both sides' sampler seed follows the data seed: the file's 7 + 10 x 0 here
    assert (run["sampler_seed"], out["sampler_seeds"]) == (7, "the file's + 10 x data seed")
    for split in ("valid", "test"):  # the script asserts these; here: they were compared, on labelled rows
        agree = run["agreement"][split]
        assert agree["rows"] > 0 and agree["plain_ic"] == pytest.approx(agree["stored"], abs=agree["tolerance"])
    # the MLP study scores a 2-seed ensemble: its valid file's IC is the trial's value, test's is the
    # stored test_ic (both files and figures from the seeds' model frames, to 1e-9)
    assert [(run["agreement"][s]["stored_as"], run["agreement"][s]["tolerance"]) for s in ("valid", "test")] \
        == [("value", 1e-9), ("test_ic", 1e-9)]
    assert run["agreement"]["test"]["unlabelled_rows"] > 0  # sweeper also predicts the last, unlabelled dates
    assert run["plain"]["processes"] == len(cpu_slots("auto"))  # as many as sweeper's CPU slots
    # what sweeper stacked by: the 2 seeds' measured size, every trial alone (study.population: 1)
    assert run["sweeper"]["stack_size"]["stack_size"] in (1, 2) and list(run["sweeper"]["populations"]) == ["1"]
    for side in ("sweeper", "plain"):
        s = run[side]
        assert s["finished"] == s["complete"] + s["pruned"] >= 1
        assert 0 < s["first_start_s"] <= s["first_finished_s"] <= s["last_end_s"]
        curve = s["best_over_time"]  # rising, ends at the final best, which the pick is
        assert curve and all(a[1] < b[1] and a[0] <= b[0] for a, b in itertools.pairwise(curve))
        assert s["final_best_val_ic"] == pytest.approx(curve[-1][1], abs=1e-5)
        assert s["time_to_final_best_s"] == pytest.approx(curve[-1][0], abs=0.06)
        assert s["pick"]["val_ic"] == pytest.approx(s["final_best_val_ic"], abs=1e-5)
        assert math.isfinite(s["pick"]["test_ic"])
        # every finished trial, in the order they ended, with its params; the pick among them
        ends = [t[3] for t in s["trials"]]
        assert len(ends) == s["finished"] and ends == sorted(ends)
        assert ends[-1] == pytest.approx(s["last_end_s"], abs=0.06)
        assert [t[4] for t in s["trials"] if t[0] == s["pick"]["trial"]] == [pytest.approx(s["pick"]["val_ic"])]
    # sweeper's time to the loop's final best over the loop's own time to it
    if run["sweeper_reached_loops_best"]:
        reach, own = run["sweeper"]["time_to_other_final_best_s"], run["plain"]["time_to_final_best_s"]
        assert run["ratio"] == pytest.approx(reach / own, rel=1e-2)
    else:
        assert run["ratio"] is None and out["studies"]["mlp"]["median_never_reached"] is True
    picks = [run[side]["pick"]["test_ic"] for side in ("sweeper", "plain")]
    assert run["test_ic_diff"] == pytest.approx(picks[0] - picks[1], abs=1e-5)
    mlp = out["studies"]["mlp"]
    assert mlp["data_seeds"] == [0] and mlp["check_on_3_seeds"] is False
    assert mlp["check_test_ic_at_least_loops"] == (run["test_ic_diff"] >= 0)
