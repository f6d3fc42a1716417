"""Issue 27's contract: one trial pipeline leaves a holdout study (3 trials, one seed, a median
pruner) and a 2-fold x 2-seed walk-forward study exactly as the two pipelines did. The golden
records were written by ``tests/pipeline_snapshot.py --write`` by the code of 83f89dc, before the
refactor, one per CPU kernel level; what is compared, and what is left out as run-to-run noise,
is in that module's docstring."""
from __future__ import annotations

import json

import pytest

import pipeline_snapshot as S


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["holdout", "walk_forward"])
def test_a_study_records_exactly_what_it_recorded_before_the_refactor(tmp_path, scheme):
    S.sweep(tmp_path, scheme)
    want = S.comparable(S.golden(scheme), scheme)
    got = S.comparable(json.loads(json.dumps(S.snapshot(tmp_path), sort_keys=True)), scheme)
    assert S.diff(want, got) == []
