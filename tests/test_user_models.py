"""`model.name: module:Class` with the module beside the study file: every command finds it,
from any folder, with no PYTHONPATH; a model that kills the interpreter while the driver
checks it is one clean error; model shapes a trial may sample are built in advance."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
import pytest
import yaml

from conftest import TINY, merge, sweeper_cli
from sweeper.config import ModelConfig
from sweeper.errors import ConfigError
from sweeper.models import build_model, resolve_model_class
from sweeper.models.paths import model_search_path

REPO = str(Path(__file__).resolve().parents[1])

MYNET = textwrap.dedent('''
    import ctypes
    import os

    import torch
    from torch import nn

    from helpers import hidden_width  # a file beside this one


    class Net(nn.Module):
        def __init__(self, n_features, lookback, width=8):
            super().__init__()
            if width == 5:
                raise ValueError("width 5 is not supported")
            if width == 6:
                ctypes.string_at(0)
            self.net = nn.Sequential(nn.Flatten(), nn.Linear(n_features * lookback, hidden_width(width)),
                                     nn.GELU(), nn.Linear(hidden_width(width), 1))

        def forward(self, x):
            return self.net(x).squeeze(-1)


    class Exit(Net):
        def __init__(self, n_features, lookback, width=8):
            os._exit(0)


    class Segv(Net):
        def __init__(self, n_features, lookback, width=8):
            ctypes.string_at(0)


    class SegvForward(Net):
        def forward(self, x):
            ctypes.string_at(0)
''')

# a mynet.py in the current folder that must lose to the one beside the study
DECOY = textwrap.dedent('''
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self, n_features, lookback, width=8):
            super().__init__()
            if os.environ.get("DECOY_CONSTRUCTOR_FAILS"):
                raise RuntimeError("the decoy mynet.py in the current folder was used")
            self.linear = nn.Linear(n_features, 1)

        def forward(self, x):
            if self.training:  # the driver's check runs in eval mode: only a worker gets here
                raise RuntimeError("the decoy mynet.py in the current folder was used")
            return self.linear(x[:, -1]).squeeze(-1)
''').replace("import torch", "import os\nimport torch")


def _study(folder: Path, name: str = "study.yaml", model: dict | None = None, **over) -> Path:
    """TINY with mynet:Net (or ``model``, whole), 2 trials of 1 epoch on one CPU worker."""
    raw = merge(TINY, {"study": {"name": Path(name).stem, "n_trials": 2},
                       "train": {"epochs": 1, "samples_per_epoch": 512},
                       "devices": {"cpu_workers": 1}, "search_space": {}})
    raw = merge(raw, over)
    raw["model"] = model or {"name": "mynet:Net", "width": 8}
    path = folder / name
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture
def folders(tmp_path):
    """proj/ holds the study and mynet.py (with its helper); other/ is another folder."""
    proj, other = tmp_path / "proj", tmp_path / "other"
    proj.mkdir()
    other.mkdir()
    (proj / "mynet.py").write_text(MYNET)
    (proj / "helpers.py").write_text("def hidden_width(width):\n    return width\n")
    return proj, other


def _cli(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("PYTHONPATH", "SWEEPER_MODEL_PATH", "SWEEPER_FAKE_GPUS", "DECOY_CONSTRUCTOR_FAILS")}
    clean["PYTHONPATH"] = REPO  # this checkout's sweeper, from any folder; never the study's folder
    return subprocess.run([sys.executable, "-m", "sweeper.cli", *args], cwd=cwd, env={**clean, **(env or {})},
                          capture_output=True, text=True, timeout=300)


def _validate(cwd: Path, path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``sweeper validate`` in this process (conftest.sweeper_cli): which shapes build and whether a
    kept check is reused are the driver's decisions; a user model's check child is still a real
    process. The search paths' tests, which depend on the process's PYTHONPATH, use :func:`_cli`."""
    result = sweeper_cli(cwd, "validate", str(path), code=None, env=env)
    return subprocess.CompletedProcess(["validate", str(path)], result.exit_code, result.stdout, result.stderr)


def _states(cwd: Path, study: str) -> list[str]:
    loaded = optuna.load_study(study_name=study, storage=f"sqlite:///{cwd}/runs/{study}/study.db")
    return [t.state.name for t in loaded.get_trials()]


@pytest.mark.slow
def test_a_model_file_named_like_a_python_module_is_named_as_the_cause(folders):
    """A random.py in the folder a command runs in hides Python's own random from every ``python -m``
    started there (its start-up imports it), so the model check's child died and the message said only
    ``exit code 1``: it names the file now. The driver is the installed ``sweeper`` script, whose own
    path does not start with that folder."""
    proj, _ = folders
    (proj / "random.py").write_text(MYNET)
    path = _study(proj, model={"name": "random:Net", "width": 8})
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SWEEPER_MODEL_PATH", "SWEEPER_FAKE_GPUS")}
    done = subprocess.run([str(Path(sys.executable).with_name("sweeper")), "validate", str(path)], cwd=proj,
                          env={**env, "PYTHONPATH": REPO}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr == ("Error: model.name 'random:Net': checking it killed the Python process (exit code 1); "
                           "random.py hides Python's own module 'random' from every process started here: "
                           "rename it\n")


# ---------------------------------------------------------------- every command finds it

@pytest.mark.slow
def test_validate_db_init_and_train_from_another_folder(folders):
    proj, other = folders
    path = _study(proj)
    (other / "mynet.py").write_text(DECOY)  # the study's folder wins over the current one
    decoy = {"DECOY_CONSTRUCTOR_FAILS": "1"}

    done = _cli(other, "validate", str(path), env=decoy)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"{path}: ok"
    assert done.stderr == ""

    done = _cli(other, "db", "init", str(path), env=decoy)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"study 'study' in sqlite:///{proj}/runs/study/study.db: created"  # beside it

    done = _cli(other, "train", str(path), "--json", env=decoy)
    assert done.returncode == 0, done.stderr
    metrics = json.loads(done.stdout)
    assert metrics["epochs_run"] == 1 and -1 <= metrics["val_ic"] <= 1


@pytest.mark.slow
def test_the_current_folder_is_searched_after_the_study_folder(folders):
    proj, other = folders
    (proj / "sub").mkdir()
    (other / "cwdnet.py").write_text(DECOY)
    path = _study(proj / "sub", model={"name": "cwdnet:Net"})
    done = _cli(other, "validate", str(path))
    assert done.returncode == 0, done.stderr
    missing = _study(proj / "sub", "missing.yaml", model={"name": "nowhere:Net"})
    done = _cli(other, "validate", str(missing))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "Error: model.name 'nowhere:Net': cannot import module 'nowhere' (ModuleNotFoundError: No module named "
        f"'nowhere'); looked in {proj / 'sub'}, {other} and on the Python path")


@pytest.mark.slow
def test_run_from_its_own_folder_and_from_another_then_predict(folders):
    proj, other = folders
    _study(proj, "own.yaml")
    done = _cli(proj, "run", "own.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _states(proj, "own") == ["COMPLETE", "COMPLETE"]

    # the worker trains in other/, beside a decoy mynet.py that fails in training
    (other / "mynet.py").write_text(DECOY)
    path = _study(proj, "away.yaml")
    done = _cli(other, "run", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert _states(proj, "away") == ["COMPLETE", "COMPLETE"]  # beside the study file, wherever it ran from

    done = _cli(other, "predict", str(path), "-o", "preds.csv")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("wrote preds.csv: trial ")
    assert (other / "preds.csv").stat().st_size > 0


# ---------------------------------------------------------------- a model that kills the check

@pytest.mark.slow
@pytest.mark.parametrize("cls, command, how", [
    ("Exit", "validate", "exit code 0"),
    ("Segv", "run", "signal 11, SIGSEGV"),
    ("SegvForward", "validate", "signal 11, SIGSEGV"),
])
def test_a_model_that_kills_the_interpreter_is_a_clean_error(folders, cls, command, how):
    proj, other = folders
    path = _study(proj, model={"name": f"mynet:{cls}"})
    done = _cli(other, command, str(path))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == f"Error: model.name 'mynet:{cls}': checking it killed the Python process ({how})"
    assert "Traceback" not in done.stdout + done.stderr
    assert os.listdir(other) == []  # nothing written


# ---------------------------------------------------------------- model shapes

SHAPES = {"model": {"name": "transformer", "d_model": 16, "nhead": 4, "num_layers": 1, "dim_feedforward": 16},
          "search_space": {"model.d_model": {"type": "categorical", "choices": [32, 48]},
                           "model.nhead": {"type": "categorical", "choices": [4, 5]},
                           "model.dropout": {"type": "categorical", "choices": [0.1, 0.2]}}}
BAD_SHAPES = ("model.d_model=32, model.nhead=5: d_model (32) must be divisible by nhead (5); "
              "model.d_model=48, model.nhead=5: d_model (48) must be divisible by nhead (5)")


def _builtin_study(folder: Path, name: str = "shapes.yaml", **over) -> Path:
    return _study(folder, name, model=SHAPES["model"], **merge({"search_space": SHAPES["search_space"]}, over))


def test_validate_names_the_shapes_the_model_cannot_take(folders):
    proj, other = folders
    done = _validate(other, _builtin_study(proj))
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == f"warning: search_space: 2 of 4 model shapes cannot be built: {BAD_SHAPES}"

    none_build = _builtin_study(proj, "none.yaml", search_space={"model.nhead": {"choices": [5]}})
    done = _validate(other, none_build)
    assert done.returncode == 2
    assert done.stderr.strip() == f"Error: search_space: none of the 2 model shapes can be built: {BAD_SHAPES}"


@pytest.mark.slow
def test_a_numeric_model_key_the_file_does_not_set_is_built_at_its_low_bound(folders):
    """``model.hiden: {type: int}`` (a typo) passed validate and failed every trial: only categorical keys
    were built. Such a key, set nowhere else (a user model's own argument), joins each shape at its low."""
    proj, other = folders
    typo = _study(proj, "typo.yaml", search_space={"model.hiden": {"type": "int", "low": 8, "high": 16}})
    done = _validate(other, typo)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "Error: search_space: none of the 1 model shapes can be built: model.hiden=8: model.name 'mynet:Net': "
        "constructing it with n_features=3, lookback=5 and {'hiden': 8, 'width': 8} failed (TypeError: "
        "Net.__init__() got an unexpected keyword argument 'hiden')")
    # the same search on a real argument the file leaves to the sampler: built at width 5, which fails
    width = _study(proj, "width.yaml", model={"name": "mynet:Net"},
                   search_space={"model.width": {"type": "int", "low": 5, "high": 9}})
    assert _validate(other, width).stderr.strip() == (
        "Error: search_space: none of the 1 model shapes can be built: model.width=5: model.name 'mynet:Net': "
        "constructing it with n_features=3, lookback=5 and {'width': 5} failed (ValueError: width 5 is not "
        "supported)")
    # a user model's key the file sets joins at the file's value, as the spec draws it (it passed, and every
    # trial was pruned): a float range on its int size (8.0 from trial 0 on), a built-in's field it lacks
    floats = _study(proj, "floats.yaml", search_space={"model.width": {"type": "float", "low": 7, "high": 9}})
    assert "model.width=8.0: model.name 'mynet:Net': constructing it with n_features=3, lookback=5 and " \
           "{'width': 8.0} failed (TypeError: " in _validate(other, floats).stderr
    # the file's value, not the low: a low the model refuses (5) is one draw of many, not the study's end
    ints = _study(proj, "ints.yaml", search_space={"model.width": {"type": "int", "low": 5, "high": 9}})
    assert _validate(other, ints).returncode == 0
    builtin = _study(proj, "builtin.yaml", search_space={"model.hidden_size": {"type": "int", "low": 4, "high": 9}})
    assert _validate(other, builtin).stderr.strip() == (
        "Error: search_space: none of the 1 model shapes can be built: model.hidden_size=4: model.name "
        "'mynet:Net': constructing it with n_features=3, lookback=5 and {'hidden_size': 4, 'width': 8} failed "
        "(TypeError: Net.__init__() got an unexpected keyword argument 'hidden_size')")


@pytest.mark.slow
def test_run_warns_of_the_shapes_too(folders):
    proj, other = folders
    done = _cli(other, "run", str(_builtin_study(proj)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.splitlines()[0] == f"warning: search_space: 2 of 4 model shapes cannot be built: {BAD_SHAPES}"


@pytest.mark.slow
def test_custom_model_shapes_are_built_in_the_child_and_a_crash_costs_one_shape(folders):
    proj, other = folders
    path = _study(proj, search_space={"model.width": {"type": "categorical", "choices": [4, 5, 6, 8]}})
    done = _validate(other, path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == (
        "warning: search_space: 2 of 4 model shapes cannot be built: model.width=5: model.name 'mynet:Net': "
        "constructing it with n_features=3, lookback=5 and {'width': 5} failed (ValueError: width 5 is not "
        "supported); model.width=6: model.name 'mynet:Net': checking it killed the Python process "
        "(signal 11, SIGSEGV)")


# ---------------------------------------------------------------- one process, many studies

def _variant(folder: Path, marker: str) -> None:
    folder.mkdir()
    (folder / "varnet.py").write_text(textwrap.dedent('''
        from torch import nn
        from varhelp import MARKER


        class Net(nn.Module):
            marker = MARKER

            def __init__(self, n_features, lookback):
                super().__init__()
                self.linear = nn.Linear(n_features, 1)

            def forward(self, x):
                return self.linear(x[:, -1]).squeeze(-1)
    '''))
    (folder / "varhelp.py").write_text(f"MARKER = {marker!r}\n")


def test_two_study_folders_in_one_process_each_get_their_own_module(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SWEEPER_MODEL_PATH", raising=False)
    _variant(tmp_path / "a", "a")
    _variant(tmp_path / "b", "b")
    seen = []
    for folder in ("a", "b", "a"):
        with model_search_path(tmp_path / folder / "study.yaml"):
            model = build_model(ModelConfig(name="varnet:Net"), 3, 5)
            seen.append((type(model).marker, sys.modules["varhelp"].MARKER))
            assert str(tmp_path / folder) in sys.path
        assert "SWEEPER_MODEL_PATH" not in os.environ
    assert seen == [("a", "a"), ("b", "b"), ("a", "a")]
    assert str(tmp_path / "b") not in sys.path  # the folders of the last study but one are gone


def test_the_cli_names_the_study_folder_only_while_its_command_runs(folders, monkeypatch):
    from click.testing import CliRunner

    from sweeper.cli import main

    proj, other = folders
    monkeypatch.chdir(other)
    monkeypatch.delenv("SWEEPER_MODEL_PATH", raising=False)
    result = CliRunner().invoke(main, ["train", str(_study(proj)), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert sys.modules["mynet"].__file__ == str(proj / "mynet.py")  # built in this process, from proj/
    assert "SWEEPER_MODEL_PATH" not in os.environ


def test_a_module_of_the_same_name_loaded_from_elsewhere_is_refused(tmp_path, monkeypatch):
    import custom_model  # tests/custom_model.py, as other tests load it

    monkeypatch.chdir(tmp_path)
    (tmp_path / "custom_model.py").write_text("class Tiny:\n    pass\n")
    here = os.path.realpath(tmp_path / "custom_model.py")
    with pytest.raises(ConfigError) as err:
        resolve_model_class("custom_model:Tiny")
    assert str(err.value) == (
        "model.name 'custom_model:Tiny': cannot import module 'custom_model' (ImportError: a different module "
        f"'custom_model' is already loaded (from {os.path.realpath(custom_model.__file__)}), not "
        f"{here}; rename {here})")


# ---------------------------------------------------------------- the check's cache

# every process that imports the model module says so in $CHECK_MARK
MARKED = "import os as _os\nopen(_os.environ['CHECK_MARK'], 'a').write(f'{_os.getpid()}\\n')\n" + MYNET
PARENT_MARKED = "import os as _os\nopen(_os.environ['CHECK_MARK'], 'a').write(f'{_os.getppid()}\\n')\n" + MYNET


@pytest.mark.slow
def test_an_unchanged_user_model_is_checked_in_a_child_once_and_again_once_edited(folders):
    proj, other = folders
    (proj / "mynet.py").write_text(MARKED)
    mark = other.parent / "imports.txt"
    env = {"CHECK_MARK": str(mark)}
    path = _study(proj, search_space={"model.width": {"type": "categorical", "choices": [4, 5, 8]}})
    warning = ("warning: search_space: 1 of 3 model shapes cannot be built: model.width=5: model.name "
               "'mynet:Net': constructing it with n_features=3, lookback=5 and {'width': 5} failed "
               "(ValueError: width 5 is not supported)")

    def validate() -> int:
        done = _validate(other, path, env=env)
        assert done.returncode == 0, done.stderr
        assert done.stderr.strip() == warning  # a kept check says what the child said
        return len(mark.read_text().splitlines())

    assert validate() == 1  # one child imported it; the driver did not
    assert validate() == 1  # unchanged: no child at all
    (proj / "helpers.py").write_text("def hidden_width(width):\n    return width  # edited\n")
    assert validate() == 2  # a helper beside it changed: checked again
    assert validate() == 2
    (proj / "mynet.py").write_text(MARKED + "\n# edited\n")
    assert validate() == 3  # the module itself changed


@pytest.mark.slow
def test_a_sweeps_user_model_check_is_forked_from_its_fork_server(folders):
    """``sweeper run`` checks a user model in a child of the worker fork server (its imports
    done), not in a fresh interpreter of its own; the workers then import the model there too."""
    proj, other = folders
    (proj / "mynet.py").write_text(PARENT_MARKED)
    mark = other.parent / "parents.txt"
    sweeper_cli(other, "run", str(_study(proj)), env={"CHECK_MARK": str(mark)})
    check, *workers = [int(line) for line in mark.read_text().splitlines()]
    assert check != os.getpid()  # not a child of this process, the driver
    assert Path(f"/proc/{check}/cmdline").read_bytes().split(b"\0")[1:3] == [b"-m", b"sweeper.worker.forked"]
    assert workers and set(workers) == {check}  # the same server forked the sweep's worker


@pytest.mark.slow
def test_a_failed_user_model_check_is_checked_again_and_fails_the_same_way(folders):
    proj, other = folders
    (proj / "mynet.py").write_text(MARKED)
    mark = other.parent / "imports.txt"
    path = _study(proj, model={"name": "mynet:Net", "width": 5})
    for count in (1, 2):
        done = _validate(other, path, env={"CHECK_MARK": str(mark)})
        assert done.returncode == 2
        assert done.stderr.strip() == (
            "Error: model.name 'mynet:Net': constructing it with n_features=3, lookback=5 and {'width': 5} "
            "failed (ValueError: width 5 is not supported)")
        assert len(mark.read_text().splitlines()) == count


@pytest.mark.slow
def test_the_same_files_in_another_folder_and_a_module_on_the_python_path_are_checked_once(folders):
    proj, other = folders
    (proj / "mynet.py").write_text(MARKED)
    mark = other.parent / "imports.txt"
    copy = other.parent / "copy"  # the same two files in another folder: the same check
    copy.mkdir()
    for name in ("mynet.py", "helpers.py"):
        (copy / name).write_text((proj / name).read_text())

    def validate(folder: Path, env: dict[str, str]) -> int:
        env = {"CHECK_MARK": str(mark), **env}
        if "PYTHONPATH" in env:  # the model on the Python path: a path of the process's own
            done = _cli(other, "validate", str(_study(folder)), env=env)
        else:
            done = _validate(other, _study(folder), env=env)
        assert done.returncode == 0, done.stderr
        return len(mark.read_text().splitlines())

    assert validate(proj, {}) == 1
    assert validate(copy, {}) == 1  # kept: the check does not depend on the folder's path
    # the model on PYTHONPATH (a folder of the user's modules), the study in a folder without it
    lib, bare = other.parent / "lib", other.parent / "bare"
    lib.mkdir()
    bare.mkdir()
    for name in ("mynet.py", "helpers.py"):
        (lib / name).write_text((proj / name).read_text())
    on_path = {"PYTHONPATH": os.pathsep.join([REPO, str(lib)])}
    assert validate(bare, on_path) == 2  # found elsewhere: a new check, in a child
    assert validate(bare, on_path) == 2  # unchanged on the Python path: kept
    (lib / "helpers.py").write_text("def hidden_width(width):\n    return width  # edited\n")
    assert validate(bare, on_path) == 3  # a helper beside it changed
    (lib / "mynet.py").write_text(MARKED + "\n# edited\n")
    assert validate(bare, on_path) == 4


def _fingerprint(source: str) -> str:
    """A one-file model's fingerprint: the sha256 of its name and its content's sha256."""
    return hashlib.sha256(f"mynet={hashlib.sha256(source.encode()).hexdigest()}".encode()).hexdigest()


@pytest.mark.slow
def test_a_study_whose_model_code_changed_is_refused_until_reverted(folders):
    """A resumed study ranks its trials as one model's: an edited model file is drift, named by its
    fingerprint; a refit or a predict of a trial trained on other code is refused (each trial keeps
    the fingerprint of the code it trained), and the reverted file resumes."""
    proj, _other = folders
    path = _study(proj)
    sweeper_cli(proj, "run", str(path))
    study = optuna.load_study(study_name="study", storage=f"sqlite:///{proj}/runs/study/study.db")
    own, edited = _fingerprint(MYNET), _fingerprint(MYNET + "\n# edited\n")
    assert study.user_attrs["model_fingerprint"] == own
    assert [t.user_attrs["model_fingerprint"] for t in study.get_trials()] == [own, own]
    (proj / "mynet.py").write_text(MYNET + "\n# edited\n")
    (proj / "helpers.py").write_text("def hidden_width(width):\n    return width  # a helper: not the model's own\n")
    out = sweeper_cli(proj, "db", "init", str(path), code=2).output
    changed = f"model code ({own[:12]} -> {edited[:12]}): the files of the study's user model changed since it ran"
    assert f"{changed}, and its trials would rank two models as one" in out
    assert "--force" in out and "Traceback" not in out
    out = sweeper_cli(proj, "refit", str(path), "--trial", "0", code=2).output  # it would train another model
    assert out == (f"Error: {changed}, so a refit would train another model than trial 0's; restore them, or run "
                   "a new study with the new code\n")
    out = sweeper_cli(proj, "predict", str(path), "--trial", "1", "-o", "p.parquet", code=2).output
    assert out.startswith(f"Error: {changed}, so trial 1's weights would score another model than it trained")
    assert not list(proj.glob("runs/study/trials/*/refit")) and not (proj / "p.parquet").exists()
    # --force: the new trial trains the edited code, and records it; a refit of it is that model's
    sweeper_cli(proj, "run", str(path), "--force", "--set", "study.n_trials=3")
    assert study.get_trials()[2].user_attrs["model_fingerprint"] == edited
    sweeper_cli(proj, "refit", str(path), "--trial", "2")
    (proj / "mynet.py").write_text(MYNET)
    assert "already there (" in sweeper_cli(proj, "db", "init", str(path)).output
    out = sweeper_cli(proj, "refit", str(path), "--trial", "2", code=2).output
    assert out.startswith(f"Error: model code ({edited[:12]} -> {own[:12]}): ")


def test_the_model_fingerprint_names_each_file_and_leaves_out_the_files_beside_a_module(tmp_path, monkeypatch):
    """Two files' contents swapped in a package change it; a file beside a one-file module found on the
    Python path (another module's) does not."""
    from sweeper.config import validate_config
    from sweeper.models.check_cache import source_digest

    study, lib, empty = tmp_path / "study", tmp_path / "lib", tmp_path / "empty"
    for folder in (study / "pkg", lib, empty):
        folder.mkdir(parents=True)
    (study / "pkg" / "__init__.py").write_text("")
    (study / "pkg" / "small.py").write_text("WIDTH = 8\n")
    (study / "pkg" / "large.py").write_text("WIDTH = 64\n")
    (lib / "libnet.py").write_text("class Net: ...\n")
    (lib / "unrelated.py").write_text("X = 1\n")
    monkeypatch.chdir(empty)
    monkeypatch.setenv("SWEEPER_MODEL_PATH", str(study))
    monkeypatch.syspath_prepend(str(lib))

    def digest(name: str) -> str | None:
        return source_digest(validate_config({"model": {"name": name}, "data": {"synthetic": {}}}, "s.yaml"))

    before = digest("pkg.net:Net")
    (study / "pkg" / "small.py").write_text("WIDTH = 64\n")
    (study / "pkg" / "large.py").write_text("WIDTH = 8\n")
    assert before is not None and digest("pkg.net:Net") != before
    mine = digest("libnet:Net")
    (lib / "unrelated.py").write_text("X = 2\n")
    content = hashlib.sha256((lib / "libnet.py").read_bytes()).hexdigest()
    assert mine == digest("libnet:Net") == hashlib.sha256(f"libnet={content}".encode()).hexdigest()
    assert digest("mlp") is None  # a built-in model's code is sweeper's
