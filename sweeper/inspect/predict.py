"""``sweeper predict``: a trial's best weights, or an ensemble of the best trials, applied
to a split of the study's data or to another file.

- ``--trial N`` or ``best``: one trial, rebuilt from its resolved config
  (``trials/<n>/config.yaml``) with ``weights.pt`` (see :mod:`sweeper.inspect.trial_model`);
  its valid IC is the stored ``val_ic``.
- ``--trial topK`` (``top3``): the K best COMPLETE trials by the study metric; the output
  ``pred`` is the mean of their per-date z-scored predictions
  (:func:`sweeper.quant.ensemble.ensemble`).
- ``--split``: ``valid`` (the default), ``test``, ``train`` or ``all`` (every date with a
  full lookback window); ``--start``/``--end`` keep the split's dates within that range (and
  make ``all`` the default, as does ``--data`` scored by a refit). Under walk-forward folds the
  study's own ``train`` and ``valid`` are the last fold's: the trial's model trained on that
  fold, and its valid block is the one valid period the model has not seen.
- ``--data``: another file, scored with the trial's features and normalisation statistics
  (nothing is re-fitted on it); it needs only ``lookback - 1`` dates of history before the
  first date to score, and it may lack the label (live use). Its train / valid / test are
  the study's date ranges. A trial with a refit (``sweeper refit``) scores it with the
  refit's weights and statistics, and a note says so (of an ensemble: how many members had
  one); the study's own splits are always scored with the trial's own weights.

Rows: every present (date, asset) with a full lookback window. A row whose label is not
known (the latest dates of a file) is predicted too, with a NaN label.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import pandas as pd
from optuna.trial import FrozenTrial

from sweeper.config import SweeperConfig
from sweeper.errors import ConfigError, StudyNotFound
from sweeper.inspect.trial_model import SPLITS, Predictor, load_weights
from sweeper.inspect.trials import top_trials, trial_config
from sweeper.store.studies import best_trial

__all__ = ["SPLITS", "Prediction", "Predictor", "load_weights", "parse_trial", "pick_trial",
           "predict_trial", "top_trials", "trial_config"]

_TOP = re.compile(r"top(\d+)$")


@dataclass
class Prediction:
    frame: pd.DataFrame       # date, asset, pred, label (raw)
    trial: int | list[int]    # the trial, or the ensemble's members (best first)
    split: str
    source: str               # the data the predictions are of
    same_data: bool | None    # the study's data fingerprint matches (None: --data, or unknown)
    notes: list[str] = field(default_factory=list)
    refits: dict[int, str] = field(default_factory=dict)  # trial -> trained to, of each refit used

    @property
    def label(self) -> str:
        if isinstance(self.trial, list):
            return f"top{len(self.trial)} ensemble of trials {', '.join(map(str, self.trial))}"
        return f"trial {self.trial}"


def parse_trial(which: str | int) -> int | str:
    """``"best"``, a trial number, or ``"topK"`` (K >= 1); ConfigError for anything else."""
    text = str(which).strip().lower()
    top = _TOP.match(text)
    if top is not None and int(top.group(1)) < 1:
        raise ConfigError(f"--trial: topK needs K >= 1, got {which!r}")
    if text == "best" or top is not None:
        return text
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"--trial: expected a trial number, 'best' or 'topK' (e.g. top3), "
                          f"got {which!r}") from None


def pick_trial(study: optuna.Study, which: str | int) -> FrozenTrial:
    """``"best"`` or a trial number."""
    parsed = parse_trial(which)
    if parsed == "best":
        best = best_trial(study)
        if best is None:
            raise StudyNotFound(f"study {study.study_name!r} has no completed trial yet")
        return best
    if isinstance(parsed, str):
        raise ConfigError(f"--trial {which}: an ensemble is not one trial")
    trials = study.get_trials(deepcopy=False)
    match = [t for t in trials if t.number == parsed]
    if not match:
        raise StudyNotFound(f"--trial {parsed}: study {study.study_name!r} has no trial {parsed} "
                            f"(it has {len(trials)} trials)")
    return match[0]


def predict_trial(cfg: SweeperConfig, study: optuna.Study, *, trial: str | int = "best",
                  split: str | None = None, data: str | Path | None = None, device: str | None = None,
                  start: str | None = None, end: str | None = None,
                  predictor: Predictor | None = None, study_file: str | None = None) -> Prediction:
    """Predictions of ``trial`` (number, "best" or "topK") on ``split`` of the study's data,
    or of ``data``. ``study_file`` is named in the retrain command of a trial whose weights
    study.keep removed.

    ``split`` None: ``all`` with ``start``/``end``, or where ``data`` is scored by a refit (a
    refit has trained on the study's valid and test dates: new data is what it is for), else
    ``valid``."""
    from sweeper.quant.ensemble import ensemble

    if split is not None and split not in SPLITS:
        raise ConfigError(f"--split: expected one of {', '.join(SPLITS)}, got {split!r}")
    parsed = parse_trial(trial)
    top_k = int(parsed[3:]) if isinstance(parsed, str) and parsed != "best" else None
    is_ensemble = top_k is not None
    members = top_trials(study, top_k) if top_k is not None else [pick_trial(study, parsed)]
    predictor = predictor or Predictor(cfg, study, device, study_file)
    if split is None:
        refit = data is not None and any(predictor.has_refit(t) for t in members)
        split = "all" if start or end or refit else "valid"
    frames = [predictor.frame(t, split, data=data, start=start, end=end) for t in members]
    if data is None:
        own = predictor.own_panel(predictor.config(members[0]))
        source, stored = own.source, study.user_attrs.get("data_fingerprint")
        same = None if stored is None else stored == own.fingerprint
    else:
        source, same = str(data), None
    used = {t.number: predictor.refits[t.number] for t in members if t.number in predictor.refits}
    notes = list(predictor.notes) + refit_notes(members, used)
    refitted = [str(t.number) for t in members if data is None and predictor.has_refit(t)]
    if refitted:  # scoring the dates a refit trained on would be leakage
        notes.append(f"trial {', '.join(refitted)} has a refit: the study's own dates are scored with "
                     "the trial's own weights (the refit trained on them); --data scores new dates with it")
    return Prediction(frame=ensemble(frames) if is_ensemble else frames[0],
                      trial=[t.number for t in members] if is_ensemble else members[0].number,
                      split=split, source=source, same_data=same, notes=notes, refits=used)


def refit_notes(members: list[FrozenTrial], used: dict[int, str]) -> list[str]:
    """The line that says which refits scored ``--data``: none, one trial's, or how many members'."""
    if not used:
        return []
    if len(members) == 1:
        number = members[0].number
        return [f"using the refit of trial {number}, trained to {used[number]}"]
    whose = ", ".join(f"trial {n} trained to {day}" for n, day in used.items())
    own = [str(t.number) for t in members if t.number not in used]
    rest = "" if not own else (f"; trial {own[0]} uses its own weights" if len(own) == 1
                               else f"; trials {', '.join(own)} use their own weights")
    return [f"using the refits of {len(used)} of the {len(members)} trials ({whose}){rest}"]
