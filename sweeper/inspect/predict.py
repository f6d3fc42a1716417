"""``sweeper predict``: a trial's best weights applied to a split, or to another file.

The model is rebuilt from the trial's own resolved config (``trials/<n>/config.yaml``)
and given ``weights.pt`` (its best epoch's state dict). Predictions go through the
training core's :func:`sweeper.core.predict` with the trial's
``train.eval_batch_size``, the same path that scored the trial, so the IC of the
valid split's output is the trial's stored ``val_ic``.

Rows: every present (date, asset) of the split with a full lookback window. A row
whose label is not known (the latest dates of a file) is predicted too, with a NaN
label. ``--data`` loads another Parquet file with the trial's data config, so its
features are normalised on that file exactly as the trial's were on its own (a
``robust_zscore`` fit uses that file's train split).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import torch
import yaml
from optuna.trial import FrozenTrial

from sweeper.config import SweeperConfig, validate_config
from sweeper.errors import ConfigError, DataError, StudyNotFound
from sweeper.store.layout import TrialFiles, run_dir, trial_files
from sweeper.store.studies import best_trial

SPLITS = ("valid", "test", "train", "all")


@dataclass
class Prediction:
    frame: pd.DataFrame       # date, asset, pred, label (raw)
    trial: int
    split: str
    source: str               # the data the predictions are of
    same_data: bool | None    # the study's data fingerprint matches (None: --data, or unknown)


def pick_trial(study: optuna.Study, which: str | int) -> FrozenTrial:
    """``"best"`` or a trial number."""
    if str(which) == "best":
        best = best_trial(study)
        if best is None:
            raise StudyNotFound(f"study {study.study_name!r} has no completed trial yet")
        return best
    try:
        number = int(which)
    except ValueError:
        raise ConfigError(f"--trial: expected a trial number or 'best', got {which!r}") from None
    trials = study.get_trials(deepcopy=False)
    match = [t for t in trials if t.number == number]
    if not match:
        raise StudyNotFound(f"study {study.study_name!r} has no trial {number} (it has {len(trials)} trials)")
    return match[0]


def trial_config(files: TrialFiles) -> SweeperConfig:
    path = files.config
    if not path.exists():
        raise DataError(f"{path}: missing; the trial's resolved config is written when it starts")
    return validate_config(yaml.safe_load(path.read_text()), str(path))


def load_weights(files: TrialFiles, trial: FrozenTrial) -> dict[str, torch.Tensor]:
    path = files.weights
    if not path.exists():
        raise DataError(f"{path}: missing; trial {trial.number} is {trial.state.name} and wrote no weights")
    return torch.load(path, map_location="cpu", weights_only=True)


def scoring_panel(panel: Any, split: str) -> Any:
    """The panel with every present row scoreable (unknown labels stay NaN in y_raw) and
    an ``all`` split: every date with a full lookback window."""
    y = torch.where(panel.mask & ~torch.isfinite(panel.y), torch.zeros_like(panel.y), panel.y)
    splits = {**panel.splits, "all": (panel.lookback - 1, len(panel.dates))}
    if split not in splits:
        raise ConfigError(f"--split: expected one of {', '.join(SPLITS)}, got {split!r}")
    return dataclasses.replace(panel, y=y, splits=splits, _cache={})


def predict_trial(cfg: SweeperConfig, study: optuna.Study, *, trial: str | int = "best", split: str = "valid",
                  data: str | Path | None = None, device: str | None = None) -> Prediction:
    """Predictions of ``trial`` (number or "best") on ``split`` of the study's data, or of ``data``."""
    from sweeper.core import predict, resolve_device
    from sweeper.data import load_panel
    from sweeper.models import build_model

    chosen = pick_trial(study, trial)
    files = trial_files(run_dir(cfg), chosen.number)
    tcfg = trial_config(files)
    data_cfg = tcfg.data
    if data is not None:
        if not Path(data).exists():
            raise DataError(f"{data}: no such file (--data)")
        data_cfg = data_cfg.model_copy(update={"path": str(data), "synthetic": None})
    panel = scoring_panel(load_panel(data_cfg), split)
    model = build_model(tcfg.model, len(panel.features), tcfg.data.lookback)
    model.load_state_dict(load_weights(files, chosen))
    target = resolve_device(device)
    frame = predict(model.to(target), panel.to(target, tcfg.data.device_share), split, target,
                    tcfg.train.eval_batch_size)
    stored = study.user_attrs.get("data_fingerprint")
    same = None if data is not None or stored is None else stored == panel.fingerprint
    return Prediction(frame=frame, trial=chosen.number, split=split, source=panel.source, same_data=same)
