"""Issue 27's contract: one trial pipeline leaves a holdout study (3 trials, one seed, a median
pruner) and a 2-fold x 2-seed walk-forward study exactly as the two pipelines did. The golden
records were written by ``tests/pipeline_snapshot.py --write`` by the code of 83f89dc, before the
refactor, one per CPU kernel level and vendor (a CPU with none is compared with another's within
rounding); the walk-forward study as one stack of 4 has a record too, written by 47ebc4b (issue
40: a member draws its lone run's dropout masks). What is compared, and what is left out as
run-to-run noise, is in that module's docstring."""
from __future__ import annotations

import json

import pytest

import pipeline_snapshot as S


@pytest.mark.slow
@pytest.mark.parametrize("scheme", S.SCHEMES)
def test_a_study_records_exactly_what_it_recorded_before_the_refactor(tmp_path, scheme):
    S.sweep(tmp_path, scheme)
    got = S.comparable(json.loads(json.dumps(S.snapshot(tmp_path), sort_keys=True)), scheme)
    assert S.compare(scheme, got) == []


@pytest.mark.parametrize("scheme", ["holdout", "walk_forward"])
def test_a_cpu_without_its_own_record_is_compared_within_rounding_and_still_catches_a_change(scheme):
    """The two AVX512 records (Intel's and AMD's: the same code, rounded by other kernels) differ
    exactly and agree within rounding; a changed param, state, count or value does not."""
    records = (json.loads((S.GOLDEN / f"AVX512-{v}" / f"{scheme}.json").read_text())
               for v in ("GenuineIntel", "AuthenticAMD"))
    intel, amd = (S.comparable(S._clean(record), scheme) for record in records)
    assert S.diff(intel, amd) != []
    assert S.diff(intel, amd, exact=False) == []
    changed = json.loads(json.dumps(amd))
    changed["trials"][1]["params"]["train.lr"] *= 1.01
    changed["trials"][2]["value"] += 0.002
    changed["trials"][0]["state"] = "PRUNED"
    changed["trials"][0]["user_attrs"]["eval_batch_size"] += 1  # an int differs even by under 1e-3
    assert sorted(S.diff(intel, changed, exact=False)) == [
        "/trials[0]/state: COMPLETE != PRUNED",
        "/trials[0]/user_attrs/eval_batch_size: 16384 != 16385",
        f"/trials[1]/params/train.lr: {intel['trials'][1]['params']['train.lr']} != "
        f"{changed['trials'][1]['params']['train.lr']}",
        f"/trials[2]/value: {intel['trials'][2]['value']} != {changed['trials'][2]['value']}",
    ]


def test_an_older_cpu_record_compares_only_its_test_scores_within_rounding(monkeypatch):
    """On the AMD box its own holdout record predates test scored on its present rows: a test score a
    rounding off passes there, a test score off by more, or any other leaf a rounding off, does not."""
    monkeypatch.setattr(S, "cpu", lambda: "AVX512-AuthenticAMD")
    monkeypatch.setattr(S, "cpu_level", lambda: "AVX512")
    record, exact = S.golden("holdout")
    assert exact and "AVX512-AuthenticAMD/holdout" in S.TEST_ROWS_BEFORE
    got = S.comparable(record, "holdout")
    assert S.compare("holdout", got) == []
    attrs = got["trials"][0]["user_attrs"]
    attrs["test_ic"] *= 1 + 1e-9  # what the scored rows' batches change
    assert S.compare("holdout", got) == []
    val_ic = attrs["val_ic"]
    attrs["val_ic"] *= 1 + 1e-9  # not scored on test: exact
    assert [line.split(":")[0] for line in S.compare("holdout", got)] == ["/trials[0]/user_attrs/val_ic"]
    attrs["val_ic"] = val_ic
    attrs["test_ic"] *= 1.01  # beyond rounding
    assert [line.split(":")[0] for line in S.compare("holdout", got)] == ["/trials[0]/user_attrs/test_ic"]
