from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

TESTS = Path(__file__).parent

TINY = {
    "study": {"name": "tiny", "n_trials": 4, "heartbeat_interval": 1, "grace_period": 4,
              "sampler": {"name": "random", "seed": 0}, "pruner": {"name": "none"}},
    "data": {"synthetic": {"assets": 24, "dates": 160, "features": 3, "seed": 1}, "lookback": 5},
    # the built-in MLP (checked in a child forked from the sweep's fork server, with the user models)
    "model": {"name": "mlp", "hidden_size": 8, "num_layers": 1, "dropout": 0.0},
    "train": {"epochs": 2, "batch_size": 256, "samples_per_epoch": 1024, "patience": 5},
    "devices": {"gpus": "none", "cpu_workers": 2},
    "search_space": {"train.lr": {"type": "float", "low": 1e-3, "high": 1e-2, "log": True}},
    # the suite's sweeps test other things: no LightGBM job beside them (tests/test_baseline.py
    # turns the default back on where it tests the sweep's baseline)
    "report": {"baseline": None},
}


# the fault model of tests/fault_models.py, where a test needs a model that misbehaves (``kind``)
PROBE = {"name": "fault_models:Probe", "kind": "mlp", "hidden": 8}


def real_env() -> dict[str, str]:
    """This process's environment for a real child: the fake GPUs and shortened clocks (``SWEEPER_FAKE_*``)
    taken out, the CPU's bf16 seam kept, so the child's numbers are fp32's on every box as the suite's."""
    kept = "SWEEPER_FAKE_CPU_BF16"
    return {k: v for k, v in os.environ.items() if not k.startswith("SWEEPER_FAKE") or k == kept}


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` merged into ``base``, section by section; a model section that names another
    model replaces the base's whole (its keys are another constructor's)."""
    out = dict(base)
    for key, value in over.items():
        other_model = key == "model" and isinstance(value, dict) and value.get("name", (base.get(key) or {}).get(
            "name")) != (base.get(key) or {}).get("name")
        nested = isinstance(value, dict) and isinstance(base.get(key), dict) and not other_model
        out[key] = merge(base[key], value) if nested else value
    return out


def sweeper_cli(root: Path, *args: str, code: int | None = 0, env: dict[str, str] | None = None) -> Any:
    """``sweeper ARGS`` run in this process, through click's CliRunner, with ``root`` as the working
    directory (real fakes off unless ``env`` sets them, tests/ on the workers' PYTHONPATH for the
    fault models); asserts the exit ``code`` (None: any) and returns the click Result (``exit_code``,
    ``stdout``, ``stderr``, ``output``).

    In process, a sweep's workers fork from this process's shared fork server, preloaded once
    per test session: a subprocess driver would pay its imports and the server's preload (about
    4.5 s of CPU) again for each sweep. Tests whose subject is the process itself (signals,
    crashes, outages, several hosts, PYTHONPATH) start ``python -m sweeper.cli`` instead."""
    from click.testing import CliRunner

    from sweeper.cli import main

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        for key in set(os.environ) - set(real_env()):
            mp.delenv(key)
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
        for key, value in (env or {}).items():
            mp.setenv(key, value)
        result = CliRunner().invoke(main, list(map(str, args)), catch_exceptions=False)
    assert code is None or result.exit_code == code, result.output
    return result


def swept_study(root: Path, raw: dict[str, Any], name: str = "study.yaml") -> Path:
    """``raw`` written to ``root/name`` and swept there by ``sweeper run`` (:func:`sweeper_cli`,
    in process); returns ``root``."""
    (root / name).write_text(yaml.safe_dump(raw))
    sweeper_cli(root, "run", name)
    return root


def backdate_heartbeat(storage: Any, trial_id: int, seconds: float) -> None:
    """Move a trial's heartbeat row (Optuna's ``trial_heartbeats``, which ``record_heartbeat``
    stamps with the database's ``now()``) ``seconds`` into the past, on a connection of its own:
    what a trial that stopped beating that long ago looks like to the stale check, without
    waiting out the database's clock (SQLite's counts whole seconds)."""
    import datetime

    import sqlalchemy
    from optuna.storages._rdb import models

    rdb = getattr(storage, "_backend", storage)  # a study puts its RDBStorage behind a cache
    beats = models.TrialHeartbeatModel.__table__
    engine = sqlalchemy.create_engine(rdb.engine.url, poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.begin() as conn:
            row = beats.c.trial_id == trial_id
            beat = conn.execute(sqlalchemy.select(beats.c.heartbeat).where(row)).scalar_one()
            earlier = beat - datetime.timedelta(seconds=seconds)
            conn.execute(beats.update().where(row).values(heartbeat=earlier))
    finally:
        engine.dispose()


def stale_check_later(seconds: float) -> None:
    """What ``time.sleep(seconds)`` does to this process's stale-trial check, without the wait:
    the two monotonic stamps it compares with now (when it first saw each suspect stale,
    ``sweeper.dispatch.retries``, and the last storage trouble, ``sweeper.store.outage``) move
    ``seconds`` back, together, so their order is kept and none is left in the future."""
    from sweeper.dispatch import retries
    from sweeper.store import outage

    retries._first_seen = {k: v - seconds for k, v in retries._first_seen.items()}
    outage._last_trouble -= seconds


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
    # train.precision: auto stays fp32 on every box (measured only where a test asks), so the suite's
    # numbers do not depend on whether this CPU runs bf16 natively
    os.environ["SWEEPER_FAKE_CPU_BF16"] = "0"


@pytest.fixture(autouse=True)
def _ctrl_c_back():
    # an interrupted CLI command ignores SIGINT to the process's end (sweeper.cli): here, where CliRunner
    # runs commands in the test's process, the next test gets its Ctrl-C back
    handler = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, handler)


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    # on a busy 2-core box, OpenMP threads fighting over cores make small steps many times slower
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _test_modules_importable(monkeypatch):
    # model classes named by dotted path (custom_model:Tiny, fault_models:Probe) live in tests/
    monkeypatch.syspath_prepend(str(TESTS))


# ------------------------------------------------------------------ the slow-lane guard
# The fast lane (`pytest -m "not slow"`) is only fast if every test that starts a real process
# carries `slow`. At session start subprocess.Popen.__init__ and multiprocessing's
# BaseProcess.start are wrapped so that a process started while a test (or one of its fixtures)
# runs is recorded against that test; a test that started one without the mark fails at teardown,
# naming itself and what it started. A fixture that started one is remembered, so every test that
# uses it (a module fixture runs its sweep only for the first) must be slow too. The wrappers cost
# one list append per process started; nothing else runs per test.

class _SpawnGuard:
    def __init__(self) -> None:
        self.item: pytest.Item | None = None
        self.fixtures: list[Any] = []  # the FixtureDefs being set up, innermost last
        self.started: list[str] = []  # what the current test started
        self.spawning: set[int] = set()  # id() of FixtureDefs that started a process

    def record(self, what: str) -> None:
        if self.item is None:
            return
        self.started.append(what)
        if self.fixtures:
            self.spawning.add(id(self.fixtures[-1]))

    def install(self) -> None:
        import multiprocessing.process
        import subprocess

        guard = self
        popen_init = subprocess.Popen.__init__
        process_start = multiprocessing.process.BaseProcess.start

        def __init__(self, args, *a, **kw):
            guard.record(f"subprocess.Popen({_short(args)})")
            popen_init(self, args, *a, **kw)

        def start(self):
            guard.record(f"multiprocessing {type(self).__name__}.start()")
            process_start(self)

        subprocess.Popen.__init__ = __init__  # type: ignore[method-assign]
        multiprocessing.process.BaseProcess.start = start  # type: ignore[method-assign]

    def uses_spawning_fixture(self, item: pytest.Item) -> list[str]:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            return []
        return sorted(name for name, defs in info.name2fixturedefs.items()
                      if any(id(d) in self.spawning for d in defs))


def _short(args: Any) -> str:
    text = " ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args)
    return text if len(text) <= 80 else text[:77] + "..."


_GUARD = _SpawnGuard()


def pytest_sessionstart(session):
    _GUARD.install()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _GUARD.item, _GUARD.started = item, []
    try:
        return (yield)
    finally:
        _GUARD.item = None


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    _GUARD.fixtures.append(fixturedef)
    try:
        return (yield)
    finally:
        _GUARD.fixtures.pop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    result = yield
    if item.get_closest_marker("slow") is None:
        fixtures = _GUARD.uses_spawning_fixture(item)
        if _GUARD.started or fixtures:
            what = "; ".join(_GUARD.started[:3]) + (f" (+{len(_GUARD.started) - 3} more)"
                                                    if len(_GUARD.started) > 3 else "")
            why = f"it started {what}" if _GUARD.started else f"it uses fixture(s) {', '.join(fixtures)}"
            pytest.fail(f"{item.nodeid} starts a real process but is not marked slow: {why}. Mark it "
                        "@pytest.mark.slow (or the module: pytestmark = pytest.mark.slow), so that the "
                        'fast lane (-m "not slow") stays fast', pytrace=False)
    return result
