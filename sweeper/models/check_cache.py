"""The user-model check's cache: a child's clean answers, kept by the content they depend on.

Checking a user's ``module:Class`` costs a child process that imports torch (seconds);
``validate`` then ``run`` of an unchanged study would pay it every time. A check whose child
answered every job, none fatally failed and none killed it, is written to
``<panel cache root>/.model-checks/<key>.json``, where the key is a sha256 of

- the jobs (each model section checked, fatal or not), ``n_features`` and ``lookback``;
- the Python interpreter (its path and version) and the installed torch version (read from
  the package metadata: the parent imports no torch for this);
- every ``.py`` file directly in the folders a model is imported from (the study file's
  folder, then the current folder: the user's modules and the helpers beside them), and every
  ``.py`` file of a user package found there, each by its path and its content's sha256.

Editing any of those files changes the key, so a changed file is always checked again; an
mtime is never trusted. A failure (a fatal job's error, a child that died or hung) is never
written: it is checked again, and so fails with the same message. A module found only on the
Python path (an installed package) is not hashed, so such checks are never cached.

Why the panel cache's root: it is this host's cache folder, which ``prepare`` may already write
(the run folder it must not touch, and ``validate`` has none); the panel cache's eviction skips
dot folders, and an entry is a few hundred bytes.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.metadata
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeper.atomic import write_text
from sweeper.models.paths import model_import_dirs

if TYPE_CHECKING:
    from sweeper.config import DataConfig

CHECKS_DIR = ".model-checks"
VERSION = 1


def checks_folder(data: DataConfig) -> Path:
    """Where the user-model checks are kept: ``.model-checks/`` in the panel cache's root."""
    from sweeper.data.cache import cache_root

    return cache_root(data) / CHECKS_DIR


def check_key(jobs: list[dict[str, Any]], n_features: int, lookback: int) -> str | None:
    """The key of these jobs' answers (each job as the child reads it: ``name``, ``model``,
    ``fatal``), or None when a module is not in the search folders."""
    folders = model_import_dirs()
    files: dict[str, str] = {}
    for folder in folders:
        with contextlib.suppress(OSError):
            for path in sorted(Path(folder).glob("*.py")):
                files[str(path)] = _sha256(path)
    for top in sorted({str(job["name"]).partition(":")[0].partition(".")[0] for job in jobs}):
        spec = importlib.machinery.PathFinder.find_spec(top, folders)
        if spec is None:
            return None  # from the Python path: its files are not ours to hash
        for where in spec.submodule_search_locations or []:  # a package: all of its files
            for path in sorted(Path(where).rglob("*.py")):
                files[str(path)] = _sha256(path)
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = None
    key = {"version": VERSION, "python": [sys.executable, sys.version], "torch": torch_version,
           "n_features": n_features, "lookback": lookback, "jobs": jobs,
           "folders": folders, "files": files}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


def read(folder: Path, key: str, n_jobs: int) -> list[str | None] | None:
    """The answers kept under ``key``, or None when there are none (or they do not fit)."""
    try:
        answers = json.loads((folder / f"{key}.json").read_text())["answers"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(answers, list) or len(answers) != n_jobs:
        return None
    return [a if isinstance(a, str) else None for a in answers]


def write(folder: Path, key: str, answers: list[str | None]) -> None:
    """Keep a clean check's answers; a cache that cannot be written is only a slower next check."""
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
        write_text(folder / f"{key}.json", json.dumps({"answers": answers}))


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        return f"unreadable: {exc}"
