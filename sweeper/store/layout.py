"""The run folder: where every file of a study lives. The one home of this rule.

::

    <run_dir>/                    study.artifacts, or runs/<study> (beside the study file) for S3 artifacts
      study.db                    the default SQLite storage (study.storage)
      owner.json                  which study the folder's trials belong to (its study_uuid)
      previous/<uuid>/            another study's trials/, logs/ and devices.csv, moved aside
      devices.csv                 GPU telemetry samples
      logs/<host>.slot-<k>.log    each worker's stdout and stderr
      artifacts/<id>              Optuna's artifact store (a folder store): copies of trial files
      trials/<number>/
        config.yaml               the trial's resolved config (its params applied)
        metrics.csv               one row per epoch of each run, naming its fold and repeat
        train.log                 the training core's log lines
        weights.pt                the best epoch's state dict (with seed repeats: the first seed's)
        weights.seed-<r>.pt       with seed repeats, each other seed's of the model's fold: the
                                  trial's model is the mean of its seeds' predictions
        daily_ic_valid.csv        per-date IC and Rank IC of the best weights
        daily_ic_test.csv
        predictions_valid.parquet date, asset, pred, label (raw) of the model on valid and test
        predictions_test.parquet  (what `sweeper best` scores without running the model; with seed
                                  repeats, the mean of the model fold's seeds)
        norm_stats.json           features and robust_zscore's train statistics (for new data)
        checkpoint.pt             the last end-of-epoch training state (core.checkpoint) of the
                                  run (or stack of runs) in progress, its owner stamp naming them
        runs/fold-<f>.seed-<r>/   one training run's files (folds, seeds; a holdout trial's one
                                  run is fold-1.seed-1; a one-run trial of sweeper before issue 39
                                  has no runs/, and its checkpoint and rows name no run: fold 1, seed 1)
          result.json             its metrics, best epoch and fold (sweeper.validation), written last
          daily_ic_valid.csv      per-date IC of its valid block
          predictions_valid.parquet  date, asset, pred, label of its valid block (seed ensembles)
          weights.pt              a model run's (the last fold's seeds) until the trial takes
          norm_stats.json         them (store.trial_folder); weights.pt is moved, the others
          daily_ic_test.csv       copied
          predictions_test.parquet  (and its predictions on valid, predictions_valid.parquet)
        refit/                    sweeper refit: the production model (sweeper.refit)
          weights.pt              trained on every labelled date up to refit.json's until (and
                                  weights.seed-<r>.pt: with seed repeats, one per seed)
          norm_stats.json
          refit.json              the trial, until, epochs, the dates it trained on
      baseline/                   the LightGBM baseline (sweeper.baseline, docs/baseline.md)
        predictions_valid.parquet date, asset, pred, label (raw) of each scored row
        predictions_test.parquet
        daily_ic_valid.csv        per-date IC and Rank IC of its predictions
        daily_ic_test.csv
        train_rows.parquet        date, asset of every row it was trained on
        model.txt                 the booster (LightGBM's text format)

Hosts may share a run folder, so each host writes its own slot logs. A folder holds the
files of one study; :mod:`sweeper.store.run_folder` moves another study's aside.

Every name above is spelled here and nowhere else. A path is worked out from the run folder and the trial's
number when it is used, never read back from a stored string: a study moved aside to ``previous/<uuid>/`` has
the same layout there. What copies, moves or removes a trial's files is :mod:`sweeper.store.trial_folder`."""

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweeper.config import StudyConfig, SweeperConfig
from sweeper.errors import ConfigError

# the names of a trial's files (trials/<n>/) and of a run's (runs/fold-<f>.seed-<r>/)
CONFIG, METRICS, LOG, CHECKPOINT = "config.yaml", "metrics.csv", "train.log", "checkpoint.pt"
WEIGHTS, NORM_STATS = "weights.pt", "norm_stats.json"
SPLITS = ("valid", "test")  # the splits a daily IC file and a predictions file are written for


def daily_ic_name(split: str) -> str:
    """``daily_ic_valid.csv`` / ``daily_ic_test.csv`` (columns date, ic, rank_ic)."""
    return f"daily_ic_{split}.csv"


# the trial files registered in the artifact store, so optuna-dashboard lists them
ARTIFACTS = (CONFIG, METRICS, LOG, WEIGHTS, daily_ic_name("valid"), daily_ic_name("test"))


def run_dir(cfg: SweeperConfig | StudyConfig) -> Path:
    """The study's run folder on this host (from the whole config or its study section)."""
    study = cfg.study if isinstance(cfg, SweeperConfig) else cfg
    artifacts = study.resolved_artifacts
    return Path(study.default_run_dir if artifacts.startswith("s3://") else artifacts)


class _File:
    """A named file of a files object's folder: ``files.weights`` is ``files.folder / "weights.pt"``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, files: Any, owner: type) -> Path:
        return files.folder / self.name


@dataclass(frozen=True)
class _Folder:
    folder: Path

    def daily_ic(self, split: str) -> Path:
        return self.folder / daily_ic_name(split)

    def predictions(self, split: str) -> Path:
        """``predictions_valid.parquet`` / ``predictions_test.parquet``: date, asset, pred, label (raw)."""
        return self.folder / f"predictions_{split}.parquet"


class RunFiles(_Folder):
    """The files of one training run of a trial: ``runs/fold-<f>.seed-<r>/`` (``daily_ic_test.csv``
    and ``predictions_test.parquet`` of the model's runs only)."""

    result = _File("result.json")  # written last: a run with one has finished
    weights, norm_stats = _File(WEIGHTS), _File(NORM_STATS)


class _Model(_Folder):
    """A model's files: with seed repeats, one weights file per seed."""

    weights, norm_stats = _File(WEIGHTS), _File(NORM_STATS)

    def member_weights(self, seed: int) -> Path:
        """The weights of seed ``seed`` (0-based): ``weights.pt`` for the first,
        ``weights.seed-<seed+1>.pt`` for the others."""
        return self.folder / (WEIGHTS if seed == 0 else f"weights.seed-{seed + 1}.pt")

    def other_members(self) -> list[Path]:
        """The weights files beyond the first seed's ``weights.pt`` (``weights.seed-2.pt``, ...), in
        seed order; none for a model of one seed."""
        return sorted(self.folder.glob("weights.seed-*.pt"), key=lambda p: int(p.stem.split("-")[-1]))


class RefitFiles(_Model):
    """``trials/<n>/refit/``: ``sweeper refit``'s production model (refit.json written last)."""

    record = _File("refit.json")

    def names(self, seeds: int) -> list[str]:  # in the order they are written (what ``sweeper refit`` prints)
        return [*(self.member_weights(k).name for k in range(seeds)), NORM_STATS, self.record.name]


class TrialFiles(_Model):
    """The files of one trial (see the module docstring)."""

    config, metrics, log, checkpoint = _File(CONFIG), _File(METRICS), _File(LOG), _File(CHECKPOINT)
    runs, refit = _File("runs"), _File("refit")

    def run(self, fold: int, repeat: int) -> Path:
        """One finished run's folder; ``fold`` and ``repeat`` count from 1 (as ``validate`` prints)."""
        return self.runs / f"fold-{fold}.seed-{repeat}"

    def run_files(self, fold: int, seed: int) -> RunFiles:
        """The files of run (``fold``, ``seed``), 0-based: ``runs/fold-<fold+1>.seed-<seed+1>/``."""
        return RunFiles(self.run(fold + 1, seed + 1))

    @property
    def refit_files(self) -> RefitFiles:
        return RefitFiles(self.refit)


def trial_files(run_dir: str | Path, number: int) -> TrialFiles:
    return TrialFiles(Path(run_dir) / "trials" / str(number))


def trial_of_checkpoint(path: str | Path) -> int | None:
    """The trial whose checkpoint ``path`` is (``.../trials/<n>/checkpoint.pt``), or None when it
    names no trial folder: how a retry stored before ``resume_from_trial`` names its source."""
    parts = Path(path).parts
    if len(parts) >= 3 and parts[-1] == CHECKPOINT and parts[-3] == "trials" and parts[-2].isdigit():
        return int(parts[-2])
    return None


class BaselineFiles(_Folder):
    """The files of the study's LightGBM baseline (see the module docstring)."""

    train_rows, model = _File("train_rows.parquet"), _File("model.txt")


def baseline_files(run_dir: str | Path) -> BaselineFiles:
    return BaselineFiles(Path(run_dir) / "baseline")


def slot_log(run_dir: str | Path, host: str, slot_id: int) -> Path:
    return logs_dir(run_dir) / f"{_safe(host)}.slot-{slot_id}.log"


def baseline_log(run_dir: str | Path, host: str) -> Path:
    """The study's baseline job's stdout and stderr, on the host that ran it."""
    return logs_dir(run_dir) / f"{_safe(host)}.baseline.log"


def _safe(host: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", host)


def logs_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "logs"


def devices_csv(run_dir: str | Path) -> Path:
    return Path(run_dir) / "devices.csv"


def artifacts_dir(location: str | Path) -> Path:
    """The folder artifact store under a run folder (``study.artifacts``)."""
    return Path(location) / "artifacts"


def artifact_copy(run_dir: str | Path, artifact_id: str) -> Path:
    """An uploaded file's copy in the folder artifact store (FileSystemArtifactStore's layout)."""
    return artifacts_dir(run_dir) / str(artifact_id)


def owner_file(run_dir: str | Path) -> Path:
    return Path(run_dir) / "owner.json"


def previous_dir(run_dir: str | Path, study_uuid: str) -> Path:
    """Where another study's files go when this folder is taken over (see run_folder)."""
    return Path(run_dir) / "previous" / study_uuid


# what belongs to the study that ran here, and moves with it
STUDY_OWNED = ("trials", "logs", "devices.csv", "baseline")


def not_an_input(out: Path, cfg: SweeperConfig, study: Path, data: str | None, storage: str | None) -> None:
    """``-o`` naming a file a command reads (the study file, its data, ``--data``, its SQLite database) or
    one of the study's in its run folder (``best`` reads a trial's files; a report beside them is no such
    file) would replace it with the output: a ConfigError, before the work."""
    from sweeper.config.anchor import sqlite_path

    inputs = {"the study file": study, "data.path": cfg.data.path, "--data": data,
              "the study's database": sqlite_path(storage or cfg.study.resolved_storage)}
    for name, path in inputs.items():  # samefile: a hard link, a case-insensitive file system
        if path is not None and (os.path.samefile(path, out) if out.exists() and Path(path).exists()
                                 else Path(path).resolve() == out.resolve()):
            raise ConfigError(f"-o {out}: that is {name}, which this command reads; write to another file")
    folder = run_dir(cfg)
    if any(out.resolve().is_relative_to((folder / name).resolve()) for name in (*STUDY_OWNED, "owner.json")):
        raise ConfigError(f"-o {out}: that is among the study's files in {folder}; write to another file")
