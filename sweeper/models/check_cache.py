"""The user-model check's cache: a child's clean answers, kept by the content they depend on.

Checking a user's ``module:Class`` costs a child process that imports torch (seconds); ``validate``
then ``run`` of an unchanged study would pay it every time. A check whose child answered every job,
none fatally failed and none killed it, is written to ``<panel cache root>/.model-checks/<key>.json``;
the key (:func:`check_key`) hashes the jobs, the interpreter, torch's version and the content of
every file a model may be imported from, each by its place in the search order (not its folder's
path: the same files in another folder check the same). An mtime is never trusted, and a failure
is never written: it is checked again, and so fails with the same message. A module with no file
to hash (one an import hook provides, as an editable install's finder does) is never cached.

Why the panel cache's root: it is this host's cache folder, which ``prepare`` may already write
(the run folder it must not touch, and ``validate`` has none); the panel cache's eviction skips
dot folders, and an entry is a few hundred bytes."""
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
from sweeper.models.paths import model_import_dirs, top_module

if TYPE_CHECKING:
    from sweeper.config import DataConfig, SweeperConfig

CHECKS_DIR = ".model-checks"
VERSION = 2  # 2: files by their place in the search order, and modules found on the Python path


def checks_folder(data: DataConfig) -> Path:
    """Where the user-model checks are kept: ``.model-checks/`` in the panel cache's root."""
    from sweeper.data.cache import cache_root

    return cache_root(data) / CHECKS_DIR


def check_key(jobs: list[dict[str, Any]], n_features: int, lookback: int) -> str | None:
    """The key of these jobs' answers (each job as the child reads it: ``name``, ``model``,
    ``fatal``), or None when a module's files cannot be found to hash (an import hook's)."""
    folders = model_import_dirs()
    files: dict[str, str] = {}
    for i, folder in enumerate(folders):  # by their place in the search order, not their path:
        with contextlib.suppress(OSError):  # the same files in another folder check the same
            for path in sorted(Path(folder).iterdir()):
                if path.suffix == ".py":
                    files[f"{i}:{path.name}"] = _sha256(path)
                elif (path / "__init__.py").is_file():
                    files[f"{i}:{path.name}/"] = "package"  # it may shadow a module found later
    for top in sorted({top_module(job["name"]) for job in jobs}):
        if (found := _module_files(top, folders)) is None:
            return None
        files.update(found)
    try:  # from the package's metadata: the parent imports no torch for this
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = None
    key = {"version": VERSION, "python": [sys.executable, sys.version], "torch": torch_version,
           "n_features": n_features, "lookback": lookback, "jobs": jobs, "files": files}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


def source_digest(cfg: SweeperConfig) -> str | None:
    """sha256 of the files of the study's user models (``module:Class``, its own and its search space's), each
    by its path from the module's own folder and its content (the same on another host or folder; the files
    beside a one-file module are not its own); None with none, or a module whose files cannot be found."""
    spec = cfg.search_space.get("model.name")
    names = [cfg.model.name, *(spec.choices or [] if spec is not None else [])]
    files: list[str] = []
    for top in sorted({top_module(n) for n in names if ":" in str(n)}):
        if (found := _module_files(top, model_import_dirs())) is None:
            return None
        files += [f"{'/'.join(parts[parts.index(top):])}={sha}" for where, sha in found.items()
                  if top in (parts := Path(where.split(":", 1)[-1]).with_suffix("").parts)]
    return hashlib.sha256(" ".join(sorted(files)).encode()).hexdigest() if files else None


def code_changed(now: str | None, *stored: dict[str, Any]) -> str | None:
    """How the user model's files (``now``, :func:`source_digest`) changed since the first of ``stored`` (a
    trial's user attributes, then its study's) that records them (``model_fingerprint``); None: unchanged."""
    was = str(next((s["model_fingerprint"] for s in stored if s.get("model_fingerprint")), now))
    if not now or was == now:
        return None
    return f"model code ({was[:12]} -> {now[:12]}): the files of the study's user model changed since it ran"


def _module_files(top: str, folders: list[str]) -> dict[str, str] | None:
    """The files of the top-level module ``top`` as the child will import it (the search folders
    first, then the Python path), each by where it was found and its sha256 (a file found on the
    Python path with every ``.py`` file beside it, which it may import); None when no file of it
    is found (a module an import hook provides, such as an editable install's)."""
    for i, where in [(i, [f]) for i, f in enumerate(folders)] + [(-1, None)]:
        if (spec := importlib.machinery.PathFinder.find_spec(top, where)) is None:
            continue
        base = f"{i}:" if i >= 0 else ""  # a search folder by its place; the Python path by path
        root = Path(where[0]) if where else None
        if spec.submodule_search_locations:  # a package: all of its files
            paths = [p for loc in spec.submodule_search_locations for p in sorted(Path(loc).rglob("*.py"))]
        elif spec.origin and root is None:  # a file on the Python path: it and the helpers beside it
            paths = sorted({Path(spec.origin), *Path(spec.origin).parent.glob("*.py")})
        else:  # a file in a search folder (its helpers are hashed with the folder's files)
            paths = [Path(spec.origin)] if spec.origin else []
        if not paths:
            return None  # a namespace package with no files, or a built-in module
        return {base + (str(p.relative_to(root)) if root else str(p)): _sha256(p) for p in paths}
    return None


def read(folder: Path, key: str, n_jobs: int) -> list[str | None] | None:
    """The answers kept under ``key``, or None when there are none (or they do not fit)."""
    try:
        answers = json.loads((folder / f"{key}.json").read_text())["answers"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    fits = isinstance(answers, list) and len(answers) == n_jobs
    return [a if isinstance(a, str) else None for a in answers] if fits else None


def write(folder: Path, key: str, answers: list[str | None]) -> None:
    """Keep a clean check's answers; a cache that cannot be written is only a slower next check."""
    with contextlib.suppress(OSError):  # (a DiskFull too)
        write_text(folder / f"{key}.json", json.dumps({"answers": answers}))


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        return f"unreadable: {exc}"
