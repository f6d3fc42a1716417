"""The read-only commands import no torch: reading a study back (best, status, export, what gc
would remove) needs no tensor, and torch costs seconds to import on a cold disk. Nor does a
sweep's driver: its panel's summary and its models' check run in children forked from its
fork server, which has torch loaded already.

Each command runs in its own process on one small finished study, and says at exit whether
``torch`` is in ``sys.modules``."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import yaml

from conftest import TESTS, TINY, merge, real_env, swept_study

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
    env = real_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=swept, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.rstrip().endswith("torch not loaded"), done.stdout + done.stderr


WALK_FORWARD = merge(STUDY, {"validation": {"scheme": "walk_forward", "folds": 2},
                             "search_space": {"model.hidden_size": {"type": "categorical", "choices": [4, 8]}}})
USER_MODEL = merge(STUDY, {"model": {"name": "custom_model:Tiny", "scale": 0.5}})


@pytest.mark.slow
@pytest.mark.parametrize(("raw", "sets", "code", "line"), [
    # folds laid out on the panel and two built-in shapes built, in the forked children
    pytest.param(WALK_FORWARD, [], 0, "trials: complete 2", id="walk-forward-built-in-shapes"),
    # the user's model file beside the study (not on PYTHONPATH), checked in a forked child
    pytest.param(USER_MODEL, [], 0, "trials: complete 2", id="user-model-file"),
    # the data layer's error, raised in the summary's child, is the driver's one clean message
    pytest.param(STUDY, ["--set", "data.features=[f0]"], 2,
                 "Error: synthetic(assets=24,dates=160,features=3,seed=1): column 'f0' (data.features) "
                 "not found; the file has columns: date, asset, f00, f01, f02, label", id="data-error"),
])
def test_a_sweeps_driver_imports_no_torch(tmp_path, raw, sets, code, line):
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(raw))
    shutil.copy(TESTS / "custom_model.py", tmp_path / "custom_model.py")
    env = real_env()
    # the probe's last line, and then whether pandas or pyarrow were loaded
    probe = PROBE.rstrip() + '\n    print("also loaded:", [m for m in ("pandas", "pyarrow") if m in sys.modules], ' \
        'file=sys.stderr)\n'
    done = subprocess.run([sys.executable, "-c", probe, "run", "study.yaml", *sets], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == code, done.stdout + done.stderr
    # the sweep's lines carry their time first
    assert any(out.endswith(line) for out in (done.stdout + done.stderr).splitlines()), done.stdout + done.stderr
    # nor pandas and pyarrow (0.7 s more): the data layer's reading is the summary child's
    assert done.stderr.splitlines()[-2:] == ["torch not loaded", "also loaded: []"], done.stdout + done.stderr
    assert (tmp_path / "runs").exists() == (code == 0)  # a refused sweep wrote nothing
