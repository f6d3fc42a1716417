"""Parent: a run folder holds one study's files. The one home of that rule.

``owner.json`` names the study the folder's ``trials/``, ``logs/`` and ``devices.csv`` belong to, by its
``study_uuid``. When a sweep starts on a folder that another study owns (a study of the same name in another
storage, one re-created after its database was deleted, or a folder from before this rule with no owner and
files a new study did not write) those files are moved to ``previous/<their uuid>/``, with one line saying
where; nothing is overwritten. A study whose files were moved aside gets them back when it runs here again.

Other files stay: the SQLite database (it may be the other study's storage), the artifact
store (its files are keyed by unique ids) and reports the user wrote."""

import json
from pathlib import Path

import optuna

from sweeper.atomic import unwritable, write_text
from sweeper.config import SweeperConfig
from sweeper.errors import ConfigError
from sweeper.store import layout
from sweeper.store.layout import STUDY_OWNED, owner_file, previous_dir
from sweeper.store.trial_folder import move

UNKNOWN = "unknown"  # the owner of files from before owner.json, which no study claimed


def take(run_dir: Path, study_name: str, study_uuid: str, storage: str, *, fresh: bool,
         study_folder: str = "") -> list[str]:
    """Make ``run_dir`` this study's; the lines to print (files moved aside or back).

    ``fresh``: the study has no trials yet, so files already here without an owner are not
    its own. ``study_folder``: the study file's (sweeper.config.anchor reads it: whose study this is).
    Call under the study's claim lock, so that two drivers never move at once."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lines, current = [], (kept := _owner_record(run_dir)).get("study_uuid")
    if current != study_uuid and (current is not None or (fresh and _holds_files(run_dir))):
        lines += _move(run_dir, previous_dir(run_dir, str(current or UNKNOWN)))
    if current != study_uuid and (back := previous_dir(run_dir, study_uuid)).is_dir():
        lines += _restore(back, run_dir)
    record = {"study": study_name, "study_uuid": study_uuid, "storage": storage, "study_folder": study_folder}
    if kept != record:  # else no write: a full disk
        write_text(owner_file(run_dir), json.dumps(record, indent=2) + "\n")
    return lines


def check_writable(run_dir: Path) -> None:
    """Pre-flight: ``run_dir`` and its ``trials/`` and ``logs/`` can be made and written, so that a sweep
    never creates its study and then finds it cannot keep a trial's files (each trial would crash)."""
    for folder in (run_dir, run_dir / "trials", run_dir / "logs"):
        if (why := unwritable(folder)) is not None:
            raise ConfigError(f"study.artifacts: the run folder {run_dir} cannot be made or written here "
                              f"({why})")


def _owner_record(run_dir: Path) -> dict[str, object]:
    try:  # owner.json's record; empty where there is none that can be read
        record = json.loads(owner_file(run_dir).read_text())
    except (OSError, ValueError):
        record = {}
    return record if isinstance(record, dict) else {}


def _holds_files(run_dir: Path) -> bool:
    """Whether any of the study's files or folders is here (an empty folder holds none)."""
    paths = [run_dir / name for name in STUDY_OWNED]
    return any(p.exists() and not (p.is_dir() and not any(p.iterdir())) for p in paths)


def _move(run_dir: Path, target: Path) -> list[str]:
    moved = [name for name in STUDY_OWNED if (run_dir / name).exists()]
    for name in moved:
        k, dst = 0, target / name
        while dst.exists():  # a folder of that name was moved aside before: name.1, name.2, ...
            k += 1
            dst = target / f"{name}.{k}"
        move(run_dir / name, dst)
    if not moved:
        return []
    who = "no owner recorded" if target.name == UNKNOWN else f"study_uuid {target.name}"
    return [f"{run_dir} held another study's {', '.join(moved)} ({who}): moved aside to {target}"]


def _restore(back: Path, run_dir: Path) -> list[str]:
    restored = [name for name in STUDY_OWNED if (back / name).exists() and not (run_dir / name).exists()]
    for name in restored:
        move(back / name, run_dir / name)
    if not any(back.iterdir()):
        back.rmdir()
    return [f"this study's {', '.join(restored)} moved back from {back}"] if restored else []


def files_folder(cfg: SweeperConfig, study: optuna.Study) -> Path:
    """The folder holding ``study``'s files now: its run folder, or ``previous/<uuid>/`` when another
    study took the folder over since (the same layout: trials/, logs/). Readers (best, predict,
    report, gc) go there, so they never read another study's weights."""
    run_dir, study_uuid = layout.run_dir(cfg), study.user_attrs.get("study_uuid")
    if _owner_record(run_dir).get("study_uuid") in (None, study_uuid) or study_uuid is None:
        return run_dir
    return previous_dir(run_dir, study_uuid)  # absent if its files never were here: none to read
