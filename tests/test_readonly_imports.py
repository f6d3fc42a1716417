"""The read-only commands import no torch: reading a study back (best, status, export, what gc
would remove) needs no tensor, and torch costs seconds to import on a cold disk.

Each command runs in its own process on one small finished study, and says at exit whether
``torch`` is in ``sys.modules``."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import TESTS, TINY, merge, swept_study

STUDY = merge(TINY, {"study": {"n_trials": 2}, "train": {"epochs": 1}, "devices": {"cpu_workers": 1}})

PROBE = """
import sys
sys.argv = ["sweeper", *sys.argv[1:]]
try:
    from sweeper.cli import main
    main()
finally:
    print("torch loaded" if "torch" in sys.modules else "torch not loaded", file=sys.stderr)
"""

@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    return swept_study(tmp_path_factory.mktemp("readonly"), STUDY)


@pytest.mark.slow
@pytest.mark.parametrize("args", [
    # best's portfolio and top-3 ensemble read the predictions the workers stored (issue 28)
    pytest.param(["best", "study.yaml"], id="best"),
    pytest.param(["best", "study.yaml", "--json"], id="best-json"),
    pytest.param(["status", "study.yaml"], id="status"),
    pytest.param(["export", "study.yaml", "-o", "trials.csv"], id="export"),
    pytest.param(["gc", "study.yaml", "--dry-run"], id="gc-dry-run"),
    pytest.param(["gc", "study.yaml", "--dry-run", "--set", "study.keep.weights=top_k",
                  "--set", "study.keep.k=1"], id="gc-dry-run-top-k"),
    pytest.param(["validate", "--help"], id="validate-help"),
])
def test_a_read_only_command_imports_no_torch(swept, args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWEEPER_FAKE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=swept, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.rstrip().endswith("torch not loaded"), done.stdout + done.stderr
