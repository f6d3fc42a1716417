"""One anchor for a study file's relative paths: its own folder, whatever the current folder
(docs/study-config.md, "Where a study's files go"): ``data.path``, ``data.cache_dir``, a relative
SQLite file of ``study.storage`` or ``study.warm_start.storage``, ``study.artifacts`` and the
default run folder ``runs/<study>``. The folder is named as the command named the study file
(relative below the current folder, so ``sweeper run study.yaml`` still prints ``runs/x``; else
absolute); ``data.path`` and ``data.cache_dir`` are made absolute, as a trial's ``config.yaml``
keeps them for ``predict`` and ``refit`` to read from any folder.

A study made before this rule (issue 42) has its storage and run folder relative to the folder
it ran from (its data there too, when the file was there): found only there, it is used there,
with a one-line notice on how to move it."""

import json
import os
import sys
from pathlib import Path

import sqlalchemy

from sweeper.config.schema import StudyConfig, SweeperConfig


def anchored(cfg: SweeperConfig, study_file: str | Path) -> SweeperConfig:
    """``cfg`` with its relative paths taken from the study file's folder (or, for a study made
    before the rule and found only where it was, from the current folder, with a notice)."""
    # the study file's folder: '' for the current folder, relative below it, else absolute
    folder = os.path.dirname(os.path.abspath(study_file))
    rel = os.path.relpath(folder)
    root = "" if rel == "." else folder if rel.split(os.sep)[0] == ".." else rel
    if moves := _old_places(cfg.study, root, home := os.path.realpath(folder)):  # home: as any host names it
        where, how = ", ".join(old for old, _ in moves), " and ".join(f"{a} to {b}" for a, b in moves)
        print(f"sweeper: study {cfg.study.name!r} is used where an older sweeper put it, relative to the "
              f"current folder ({where}); to keep it beside {study_file}, as a new study is, move {how} "
              "while no sweep runs", file=sys.stderr, flush=True)
        root = ""
    data = cfg.data.model_copy(update={
        "path": cfg.data.path and os.path.abspath(_data_path(cfg.data.path, root, study_file)),
        "cache_dir": cfg.data.cache_dir and os.path.abspath(_folder_at(cfg.data.cache_dir, root))})
    warm = cfg.study.warm_start
    warm = warm and warm.model_copy(update={"storage": warm.storage and sqlite_at(warm.storage, root)})
    study = cfg.study.model_copy(update={
        "storage": cfg.study.storage and sqlite_at(cfg.study.storage, root),
        "artifacts": cfg.study.artifacts and _folder_at(cfg.study.artifacts, root), "warm_start": warm})
    return cfg.model_copy(update={"data": data, "study": study.located(root, home)})


def redact(url: str) -> str:
    """``url`` without its password, to print or keep (here, as :func:`sqlite_path`: the config keeps it)."""
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001
        return url


def sqlite_path(url: str) -> Path | None:
    """The database file a SQLite URL names (None for memory or another engine). Here, not in
    :mod:`sweeper.store.urls`: the store reads it too, and the config may not import the store."""
    if not url.startswith("sqlite"):
        return None
    return Path(path) if (path := sqlalchemy.engine.make_url(url).database) and path != ":memory:" else None


def sqlite_at(url: str, root: str) -> str:
    """``url`` with its relative SQLite file taken from ``root``; any other URL as it is."""
    path = sqlite_path(url)
    if not root or path is None or path.is_absolute():
        return url
    return sqlalchemy.engine.make_url(url).set(database=os.path.join(root, path)).render_as_string(False)


def _folder_at(folder: str, root: str) -> str:
    return folder if "://" in folder else os.path.join(root, os.path.expanduser(folder))


def _data_path(path: str, root: str, study_file: str | Path) -> str:
    path = os.path.expanduser(path)
    if root or os.path.isabs(path) or os.path.exists(path):
        return os.path.join(root, path)
    # the current folder's (an old study's rule, or the study file is here): else beside the file
    beside = os.path.join(os.path.dirname(str(study_file)), path)
    return beside if os.path.exists(beside) else path


def _old_places(study: StudyConfig, root: str, home: str) -> list[tuple[str, str]]:
    """``(where it is, where the rule puts it)`` for the files of a study made before the rule
    that are found relative to the current folder only (none: it is where the rule says, or the files
    there are another study file's of the same name, as their run folder's owner.json says)."""
    default = os.path.join("runs", study.name)
    run = study.artifacts if study.artifacts and "://" not in study.artifacts else default
    local = not os.path.isabs(os.path.expanduser(run))
    path = sqlite_path(study.storage or f"sqlite:///{default}/study.db")
    db = str(path) if path is not None and not path.is_absolute() else None
    mark = db or (os.path.join(run, "owner.json") if local else None)
    if not root or mark is None or not os.path.exists(mark) or os.path.exists(os.path.join(root, mark)):
        return []
    try:  # the study file's folder owner.json names (store.run_folder.take; none before it was kept)
        folder = json.loads(Path(run, "owner.json").read_text()).get("study_folder")
    except (OSError, ValueError, AttributeError):
        folder = None
    if local and folder not in (None, "", home):  # another study file's study of the same name
        return []
    places = [run] if local and os.path.exists(run) else []
    if db and not (places and Path(db).is_relative_to(run)):  # the default storage moves with its folder
        places.append(db)
    return [(p, os.path.join(root, p)) for p in places]

