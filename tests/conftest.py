from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

TESTS = Path(__file__).parent

TINY = {
    "study": {"name": "tiny", "n_trials": 4, "heartbeat_interval": 1, "grace_period": 4,
              "sampler": {"name": "random", "seed": 0}, "pruner": {"name": "none"}},
    "data": {"synthetic": {"assets": 24, "dates": 160, "features": 3, "seed": 1}, "lookback": 5},
    "model": {"name": "fault_models:Probe", "kind": "mlp", "hidden": 8},
    "train": {"epochs": 2, "batch_size": 256, "samples_per_epoch": 1024, "patience": 5},
    "devices": {"gpus": "none", "cpu_workers": 2},
    "search_space": {"train.lr": {"type": "float", "low": 1e-3, "high": 1e-2, "log": True}},
    # the suite's sweeps test other things: no LightGBM job beside them (tests/test_baseline.py
    # turns the default back on where it tests the sweep's baseline)
    "report": {"baseline": None},
}


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return out


def swept_study(root: Path, raw: dict[str, Any], name: str = "study.yaml", timeout: float = 300) -> Path:
    """``raw`` written to ``root/name`` and swept there by ``sweeper run`` in a subprocess (real
    fakes off, tests/ importable for its fault models); returns ``root``."""
    import subprocess
    import sys

    (root / name).write_text(yaml.safe_dump(raw))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWEEPER_FAKE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-m", "sweeper.cli", "run", name], cwd=root, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return root


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A clean working directory whose workers can import tests/fault_models.py."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.delenv("SWEEPER_FAKE_GPUS", raising=False)
    monkeypatch.delenv("SWEEPER_FAKE_BUSY", raising=False)
    monkeypatch.delenv("SWEEPER_FAKE_GPU_MEMORY_MB", raising=False)
    monkeypatch.delenv("SWEEPER_FAKE_TRIAL_MEMORY_MB", raising=False)
    return tmp_path


@pytest.fixture
def study_file(workdir):
    def make(over: dict[str, Any] | None = None, name: str = "study.yaml", replace: tuple[str, ...] = ()) -> Path:
        """TINY with ``over`` merged in; sections named in ``replace`` are taken whole from ``over``."""
        path = workdir / name
        raw = merge(TINY, {k: v for k, v in (over or {}).items() if k not in replace})
        raw.update({k: over[k] for k in replace})
        path.write_text(yaml.safe_dump(raw))
        return path
    return make


@pytest.fixture(autouse=True, scope="session")
def _panel_cache(tmp_path_factory):
    # the suite's panels are cached in a throw-away folder, not the user's ~/.cache
    os.environ["SWEEPER_CACHE_DIR"] = str(tmp_path_factory.mktemp("panels"))


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    # on a busy 2-core box, OpenMP threads fighting over cores make small steps many times slower
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _test_modules_importable(monkeypatch):
    # model classes named by dotted path (custom_model:Tiny, fault_models:Probe) live in tests/
    monkeypatch.syspath_prepend(str(TESTS))
