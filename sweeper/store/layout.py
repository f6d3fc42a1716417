"""The run folder: where every file of a study lives. The one home of this rule.

::

    <run_dir>/                    study.artifacts, or runs/<study> when artifacts go to S3
      study.db                    the default SQLite storage (study.storage)
      owner.json                  which study the folder's trials belong to (its study_uuid)
      previous/<uuid>/            another study's trials/, logs/ and devices.csv, moved aside
      devices.csv                 GPU telemetry samples
      logs/<host>.slot-<k>.log    each worker's stdout and stderr
      artifacts/                  Optuna's artifact store (a folder store)
      trials/<number>/
        config.yaml               the trial's resolved config (its params applied)
        metrics.csv               one row per epoch
        train.log                 the training core's log lines
        weights.pt                the best epoch's state dict
        daily_ic_valid.csv        per-date IC and Rank IC of the best weights
        daily_ic_test.csv
        norm_stats.json           features and robust_zscore's train statistics (for new data)
        checkpoint.pt             the last end-of-epoch training state (core.checkpoint) of the
                                  run in progress (under walk_forward: of its fold and seed)
        runs/fold-<f>.seed-<r>/   walk_forward or repeats: one finished training run's files
          result.json             its metrics, best epoch and fold (sweeper.validation)
          daily_ic_valid.csv      per-date IC of its valid block
          predictions_valid.parquet  date, asset, pred of its valid block (seed ensembles)
        refit/                    sweeper refit: the production model (sweeper.refit)
          weights.pt              trained on every labelled date up to refit.json's until
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
files of one study (:mod:`sweeper.store.run_folder`): a study of the same name in another
storage, or one re-created after its database was deleted, moves the other's aside.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sweeper.config import SweeperConfig

# the trial files registered in the artifact store, so optuna-dashboard lists them
ARTIFACTS = ("config.yaml", "metrics.csv", "train.log", "weights.pt", "daily_ic_valid.csv",
             "daily_ic_test.csv")


def run_dir(cfg: SweeperConfig) -> Path:
    """The study's run folder on this host."""
    artifacts = cfg.study.resolved_artifacts
    return Path(f"runs/{cfg.study.name}") if artifacts.startswith("s3://") else Path(artifacts)


@dataclass(frozen=True)
class TrialFiles:
    """The files of one trial (see the module docstring)."""

    folder: Path

    @property
    def config(self) -> Path:
        return self.folder / "config.yaml"

    @property
    def metrics(self) -> Path:
        return self.folder / "metrics.csv"

    @property
    def log(self) -> Path:
        return self.folder / "train.log"

    @property
    def weights(self) -> Path:
        return self.folder / "weights.pt"

    @property
    def checkpoint(self) -> Path:
        return self.folder / "checkpoint.pt"

    @property
    def norm_stats(self) -> Path:
        """``norm_stats.json``: the features and what normalisation fitted on the train split."""
        return self.folder / "norm_stats.json"

    def daily_ic(self, split: str) -> Path:
        """``daily_ic_valid.csv`` / ``daily_ic_test.csv`` (columns date, ic, rank_ic)."""
        return self.folder / f"daily_ic_{split}.csv"

    @property
    def runs(self) -> Path:
        """``runs/``: the finished training runs of a trial that makes several (folds, seeds)."""
        return self.folder / "runs"

    def run(self, fold: int, repeat: int) -> Path:
        """One finished run's folder; ``fold`` and ``repeat`` count from 1 (as ``validate`` prints)."""
        return self.runs / f"fold-{fold}.seed-{repeat}"

    @property
    def refit(self) -> Path:
        """``refit/``: ``sweeper refit``'s production model of this trial."""
        return self.folder / "refit"


def trial_files(run_dir: str | Path, number: int) -> TrialFiles:
    return TrialFiles(Path(run_dir) / "trials" / str(number))


@dataclass(frozen=True)
class BaselineFiles:
    """The files of the study's LightGBM baseline (see the module docstring)."""

    folder: Path

    def predictions(self, split: str) -> Path:
        """``predictions_valid.parquet`` / ``predictions_test.parquet``."""
        return self.folder / f"predictions_{split}.parquet"

    def daily_ic(self, split: str) -> Path:
        """``daily_ic_valid.csv`` / ``daily_ic_test.csv`` (columns date, ic, rank_ic)."""
        return self.folder / f"daily_ic_{split}.csv"

    @property
    def train_rows(self) -> Path:
        return self.folder / "train_rows.parquet"

    @property
    def model(self) -> Path:
        return self.folder / "model.txt"


def baseline_files(run_dir: str | Path) -> BaselineFiles:
    return BaselineFiles(Path(run_dir) / "baseline")


def slot_log(run_dir: str | Path, host: str, slot_id: int) -> Path:
    return Path(run_dir) / "logs" / f"{_safe(host)}.slot-{slot_id}.log"


def baseline_log(run_dir: str | Path, host: str) -> Path:
    """The study's baseline job's stdout and stderr, on the host that ran it."""
    return Path(run_dir) / "logs" / f"{_safe(host)}.baseline.log"


def _safe(host: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", host)


def logs_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "logs"


def devices_csv(run_dir: str | Path) -> Path:
    return Path(run_dir) / "devices.csv"


def owner_file(run_dir: str | Path) -> Path:
    return Path(run_dir) / "owner.json"


def previous_dir(run_dir: str | Path, study_uuid: str) -> Path:
    """Where another study's files go when this folder is taken over (see run_folder)."""
    return Path(run_dir) / "previous" / study_uuid


# what belongs to the study that ran here, and moves with it
STUDY_OWNED = ("trials", "logs", "devices.csv", "baseline")
