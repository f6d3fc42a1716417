"""The package layout's rules (docs/architecture.md), checked on the source and on a real sweep.

- no import cycles, counting imports inside functions too;
- no module over 450 lines, and at least five sub-packages;
- the training core reaches neither Optuna nor the sweep, the store or inspection;
- the worker process never loads the parent's dispatch code.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from sweeper.config import load_config
from sweeper.dispatch.live import NullView
from sweeper.dispatch.run import run

PACKAGE = Path(__file__).resolve().parent.parent / "sweeper"
DISPATCH_MARKS = ("subprocess.Popen", "study.ask(")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """(sweeper modules, other top-level packages) that ``path`` imports anywhere in its body."""
    ours, others = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from pkg import sub`` imports the module pkg.sub when there is one
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                     for a in node.names]
        for name in names:
            if name == "sweeper" or name.startswith("sweeper."):
                ours.add(name)
            else:
                others.add(name.split(".")[0])
    return ours, others


GRAPH = {name: _imports(path)[0] for name, path in MODULES.items()}


def _cycle() -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(GRAPH.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for name in sorted(GRAPH):
        if name not in state and (found := visit(name)):
            return found
    return None


def _reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(GRAPH.get(node, ()))
    return seen


def test_no_import_cycles():
    assert _cycle() is None, " -> ".join(_cycle())


def test_module_sizes_and_subpackages():
    sizes = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()}
    assert {n: s for n, s in sizes.items() if s > 450} == {}
    packages = {p.parent.name for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE}
    assert {"config", "core", "data", "models", "quant", "store", "dispatch", "worker", "study", "inspect",
            "devices"} <= packages
    assert not (PACKAGE / "sweep").exists()


def _long_functions(prefix: str, limit: int, sources: dict[str, str] | None = None) -> dict[str, int]:
    """Every function (a method, a click command, a nested one) of the modules under ``prefix``
    longer than ``limit`` lines, from its ``def`` to its last line, docstring and comments included."""
    found = {}
    texts = sources if sources is not None else {name: path.read_text() for name, path in MODULES.items()}
    for name, text in texts.items():
        if name.startswith(prefix):
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > limit:
                        found[f"{name}.{node.name}"] = length
    return found


def test_no_function_of_the_package_is_over_40_lines_and_the_driver_stays_small():
    """A decision hides in a long function: none in sweeper/ is over 40 lines (the training loop
    and the CLI's commands included), and the driver's loop stays under 300 lines (its decisions
    live elsewhere)."""
    assert _long_functions("sweeper.", 40) == {}
    assert len(MODULES["sweeper.dispatch.driver"].read_text().splitlines()) < 300
    # the check can fail: a 41-line function, a method and a decorated command are each found
    body = "\n".join(f"    x{i} = {i}  # a comment counts" for i in range(39))
    source = (f"def long():\n{body}\n    return x0\n\n"
              f"class C:\n    def method(self):\n    {body.replace(chr(10), chr(10) + '    ')}\n        return 1\n\n"
              f"@main.command()\ndef command():\n{body}\n    return 2\n")
    assert _long_functions("m", 40, {"m": source}) == {"m.long": 41, "m.method": 41, "m.command": 41}


def test_fake_devices_are_read_in_one_module():
    """Fake GPUs, fake NVML and fake trial memory sit behind one seam (tests set them through
    SWEEPER_FAKE_* variables); no production module reads them itself."""
    readers = {name for name, path in MODULES.items() if "SWEEPER_FAKE" in path.read_text()}
    assert readers == {"sweeper.devices.fake"}


def test_the_core_knows_nothing_of_optuna_the_sweep_or_the_store():
    reached = set().union(*(_reachable(m) for m in MODULES if m.startswith("sweeper.core")))
    assert {m for m in reached if m.startswith(("sweeper.dispatch", "sweeper.worker", "sweeper.study", "sweeper.store", "sweeper.inspect", "sweeper.cli"))} == set()
    assert {"optuna", "click"} & set().union(*(_imports(MODULES[m])[1] for m in reached if m in MODULES)) == set()


def test_no_module_outside_the_cli_imports_click():
    users = {m for m, path in MODULES.items() if "click" in _imports(path)[1]}
    assert users == {"sweeper.cli"}


def _dispatch_code(name: str) -> list[str]:
    origin = importlib.util.find_spec(name).origin
    text = Path(origin).read_text()
    return [mark for mark in DISPATCH_MARKS if mark in text]


@pytest.mark.slow
def test_the_worker_process_never_loads_dispatch_code(study_file, workdir, monkeypatch):
    out = workdir / "modules"
    out.mkdir()
    monkeypatch.setenv("SWEEPER_TEST_MODULES", str(out))
    path = study_file({"study": {"n_trials": 2}, "model": {"name": "module_probe:Recorder"},
                       "devices": {"cpu_workers": 1}}, replace=("model",))
    cfg = load_config(path)
    assert run(cfg, view=NullView()).exit_code == 0
    study = optuna.load_study(study_name=cfg.study.name, storage=cfg.study.resolved_storage)
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE] * 2

    records = sorted(out.glob("*.json"))
    assert {p.stem.split("-")[1] for p in records} == {"built", "eval"}  # at the start and at the final scoring
    loaded = set().union(*(json.loads(p.read_text()) for p in records)) | {"sweeper.worker.main"}
    assert {"sweeper.worker.trial", "sweeper.core.loop", "sweeper.worker.protocol"} <= loaded
    assert {m: _dispatch_code(m) for m in sorted(loaded) if _dispatch_code(m)} == {}
    # the check can fail: the parent's dispatch modules do carry the marks, and the worker has none of them
    assert _dispatch_code("sweeper.launch") == ["subprocess.Popen"]
    assert _dispatch_code("sweeper.dispatch.claim") == ["study.ask("]
    parents = {f"sweeper.dispatch.{m}" for m in ("run", "driver", "handle", "claim")} | {"sweeper.launch"}
    assert not parents & loaded


# The packages from the bottom up: a module imports only from its own layer or those below.
LAYERS = [
    {"sweeper", "sweeper.errors", "sweeper.atomic", "sweeper.interrupt", "sweeper.plain", "sweeper.config"},
    {"sweeper.quant", "sweeper.devices", "sweeper.data", "sweeper.models", "sweeper.core"},
    {"sweeper.store"},
    {"sweeper.validation"},
    {"sweeper.study"},
    {"sweeper.baseline", "sweeper.worker"},
    {"sweeper.inspect", "sweeper.refit", "sweeper.train_command"},
    {"sweeper.dispatch"},
    {"sweeper.cli"},
]


def _layer(module: str) -> int:
    for depth in (2, 1):
        top = ".".join(module.split(".")[:depth])
        for i, layer in enumerate(LAYERS):
            if top in layer:
                return i
    raise AssertionError(f"{module} is in no layer of tests/test_architecture.py")


def test_no_import_runs_from_a_lower_package_up_to_a_higher_one():
    """The worker never imports the parent (dispatch/), the study's rules import neither, and
    nothing below them imports any of the three: checked on the source, imports inside
    functions included (the runtime check of what a real worker loads is below)."""
    upward = sorted(f"{m} -> {n}" for m, deps in GRAPH.items() for n in deps
                    if n in MODULES and _layer(n) > _layer(m))
    assert upward == []
    worker = set().union(*(_reachable(m) for m in MODULES if m.startswith("sweeper.worker")))
    assert {m for m in worker if m.startswith(("sweeper.dispatch", "sweeper.cli"))} == set()
    study = set().union(*(_reachable(m) for m in MODULES if m.startswith("sweeper.study")))
    assert {m for m in study if m.startswith(("sweeper.dispatch", "sweeper.worker"))} == set()


def test_the_store_knows_no_run_grid():
    """The store names a run's files by plain cells (fold, seed) and paths: nothing it imports,
    TYPE_CHECKING's included, reaches validation/ (the run grid, the runner, the scores)."""
    assert _layer("sweeper.store.trial_folder") < _layer("sweeper.validation.grid")
    store = set().union(*(_reachable(m) for m in MODULES if m.startswith("sweeper.store")))
    assert {m for m in store if m.startswith("sweeper.validation")} == set()


def _package_maps(sources: dict[str, str]) -> dict[str, list[str]]:
    """For each package (a module whose name is a folder's ``__init__``), the modules and
    sub-packages right below it that its docstring, the package map, does not name in full
    (``sweeper.core.loop``, as ``:mod:`~sweeper.core.loop``` spells it)."""
    missing: dict[str, list[str]] = {}
    for package, text in sources.items():
        if not package.endswith("__init__"):
            continue
        name = package.removesuffix(".__init__")
        doc = ast.get_docstring(ast.parse(text)) or ""
        below = sorted({m.removesuffix(".__init__") for m in sources
                        if m.startswith(name + ".") and m != package
                        and m.removesuffix(".__init__").count(".") == name.count(".") + 1})
        absent = [m for m in below if not re.search(rf"\b{re.escape(m)}\b", doc)]
        if absent:
            missing[name] = absent
    return missing


def test_every_module_is_in_its_package_map():
    """A package's docstring is its map: every module and sub-package below it is named there
    (a new module without a line in its map fails here)."""
    sources = {(".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts)): p.read_text()
               for p in PACKAGE.rglob("*.py")}
    assert _package_maps(sources) == {}
    # the check can fail: a package whose map leaves out one of its two modules
    fake = {"pkg.__init__": '"""The map: :mod:`~pkg.one`."""', "pkg.one": "", "pkg.two": ""}
    assert _package_maps(fake) == {"pkg": ["pkg.two"]}
