"""Where ``model.name: module:Class`` is found: beside the study file, then in the current folder.

The CLI names the study file's folder in ``SWEEPER_MODEL_PATH`` while a command runs
(:func:`model_search_path`); workers and the check's child inherit the variable and the working
directory, so every process finds the same file without PYTHONPATH, the study's folder first."""

import importlib
import importlib.machinery
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

MODEL_PATH_ENV = "SWEEPER_MODEL_PATH"

# the folders this module put at the front of sys.path, so that the next study's folders
# replace them instead of piling up (tests run many studies in one process)
_ADDED: list[str] = []
# top-level module name -> the file it was imported from, for modules imported from those folders
_LOADED: dict[str, str] = {}


def model_import_dirs() -> list[str]:
    """The folders searched first, best first: ``SWEEPER_MODEL_PATH``, then the current folder."""
    named = [p for p in os.environ.get(MODEL_PATH_ENV, "").split(os.pathsep) if p]
    return list(dict.fromkeys(os.path.abspath(folder) for folder in [*named, os.getcwd()]))


@contextmanager
def model_search_path(study_file: str | Path) -> Iterator[None]:
    """Put the study file's folder first in ``SWEEPER_MODEL_PATH`` while the block runs."""
    before = os.environ.get(MODEL_PATH_ENV)
    folder = str(Path(study_file).resolve().parent)
    os.environ[MODEL_PATH_ENV] = os.pathsep.join([folder, *([before] if before else [])])
    try:
        yield
    finally:  # in-process callers (tests) must not see the last command's study folder
        if before is None:
            os.environ.pop(MODEL_PATH_ENV, None)
        else:
            os.environ[MODEL_PATH_ENV] = before


def top_module(name: str) -> str:
    """The top-level module of a ``model.name`` or a module's name: ``pkg.mynet:Net`` -> ``pkg``."""
    return str(name).partition(":")[0].partition(".")[0]


def import_model_module(module_name: str) -> ModuleType:
    """Import ``module_name`` (``mynet`` or ``pkg.mynet``) as a study's model module: its top-level
    name from :func:`model_import_dirs` first, else from the Python path. Raises ImportError when a
    different module of that name is already loaded, rather than use the wrong one."""
    top = top_module(module_name)
    folders = model_import_dirs()
    _put_first(folders)
    importlib.invalidate_caches()  # a model file written a moment ago must be seen
    if (spec := importlib.machinery.PathFinder.find_spec(top, folders)) is None:
        return importlib.import_module(module_name)
    where = spec.origin if spec.has_location else next(iter(spec.submodule_search_locations or []), "")
    where = os.path.realpath(where or "")
    if (cached := sys.modules.get(top)) is not None and _module_file(cached) != where:
        if _LOADED.get(top) != _module_file(cached):
            raise ImportError(f"a different module {top!r} is already loaded (from "
                              f"{_module_file(cached) or 'the interpreter'}), not {where}; rename {where}")
        _forget(top, _LOADED.pop(top))  # another study's model module of the same name: load this one
    module = importlib.import_module(module_name)
    _LOADED[top] = where
    return module


def _put_first(folders: list[str]) -> None:
    # kept on sys.path (not only while importing) so a model's own later imports of its sibling files work too
    if folders == _ADDED and sys.path[:len(folders)] == folders:
        return
    for folder in _ADDED:
        if folder in sys.path:
            sys.path.remove(folder)
    _ADDED[:] = folders
    sys.path[:0] = folders


def _module_file(module: ModuleType) -> str | None:
    where = getattr(module, "__file__", None) or next(iter(getattr(module, "__path__", []) or []), None)
    return os.path.realpath(where) if where else None


def _forget(top: str, old_file: str) -> None:
    """Drop another study's model module, its submodules and the single-file modules beside it (its
    helpers), so that this study's files of the same names are imported."""
    folder = os.path.dirname(old_file)
    if os.path.basename(old_file) == "__init__.py":  # a package: its helpers sit beside its folder
        folder = os.path.dirname(folder)
    for name, module in list(sys.modules.items()):
        where = _module_file(module)
        sibling = "." not in name and where is not None and os.path.dirname(where) == folder
        if name == top or name.startswith(top + ".") or sibling:
            del sys.modules[name]
