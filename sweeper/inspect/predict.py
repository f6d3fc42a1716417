"""``sweeper predict``: a trial's best weights, or an ensemble of the best trials, applied
to a split of the study's data or to another file.

- ``--trial N`` or ``best``: one trial, rebuilt from its resolved config (``trials/<n>/config.yaml``)
  with ``weights.pt`` (see :mod:`sweeper.inspect.trial_model`); its valid IC is the stored ``val_ic``.
- ``--trial topK`` (``top3``): the K best COMPLETE trials by the study metric; the output ``pred``
  is the mean of their per-date z-scored predictions (:func:`sweeper.quant.ensemble.ensemble`).
- ``--split``: ``valid`` (the default), ``test``, ``train`` or ``all`` (every date with a
  full lookback window); ``--start``/``--end`` keep the split's dates within that range (and
  make ``all`` the default, as does ``--data`` scored by a refit). Under walk-forward folds the
  study's own ``train`` and ``valid`` are the last fold's (``Predictor.own_panel`` says why).
- ``--data``: another file, scored as :mod:`sweeper.data.scoring` says (the trial's features and
  statistics, no label needed), with a trial's refit where it has one (:mod:`sweeper.inspect.trial_model`);
  a note says so (of an ensemble: how many members had one).

Rows: every present (date, asset) with a full lookback window. A row whose label is not
known (the latest dates of a file) is predicted too, with a NaN label."""

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
from optuna.trial import FrozenTrial, TrialState

from sweeper.config import SweeperConfig
from sweeper.errors import ConfigError, StudyNotFound
from sweeper.inspect.trial_model import SPLITS, Predictor, read_refit
from sweeper.inspect.trials import model_dates, top_trials
from sweeper.store.layout import trial_files
from sweeper.store.studies import best_trial, no_best
from sweeper.validation import contract as K

__all__ = ["Prediction", "parse_trial", "pick_trial", "predict_trial", "top_trials"]

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
    weights: str = ""  # which weights scored, and the dates they saw (weights_line)

    @property
    def label(self) -> str:
        if isinstance(self.trial, list):
            return f"top{len(self.trial)} ensemble of trials {', '.join(map(str, self.trial))}"
        return f"trial {self.trial}"

    def written(self, out: Path) -> str:
        """``predict``'s last line: what it wrote and, where the rows have labels, their IC (live
        predictions, of dates whose label is not known yet, have nothing to be scored against)."""
        from sweeper.quant.ic import ic_report

        dates = self.frame["date"]
        span = f"{str(dates.min())[:10]} to {str(dates.max())[:10]}" if len(dates) else "no dates"
        head = f"wrote {out}: {self.label}, split {self.split} of {self.source} ({span}), " \
               f"{len(self.frame)} rows"
        if not self.frame["label"].notna().any():
            return head + ", no label yet: no IC"
        ic = ic_report(self.frame)
        constant = ic["n_constant_dates"]
        return (head + f", IC {ic['ic']:.4f}, rank IC {ic['rank_ic']:.4f} over {ic['n_dates']} dates"
                + (f" ({constant} with a constant prediction, scored 0)" if constant else ""))


def parse_trial(which: str | int) -> int | str:
    """``"best"``, a trial number, or ``"topK"`` (K >= 1); ConfigError for anything else."""
    text = str(which).strip().lower()
    if (top := _TOP.match(text)) is not None and int(top.group(1)) < 1:
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
    if (parsed := parse_trial(which)) == "best":
        if (best := best_trial(study)) is None:
            raise StudyNotFound(no_best(study))
        return best
    if isinstance(parsed, str):
        raise ConfigError(f"--trial {which}: an ensemble is not one trial")
    trials = study.get_trials(deepcopy=False)
    if not (match := [t for t in trials if t.number == parsed]):
        raise StudyNotFound(f"--trial {parsed}: study {study.study_name!r} has no trial {parsed} "
                            f"(it has {len(trials)} trials)")
    return match[0]


def predict_trial(cfg: SweeperConfig, study: optuna.Study, *, trial: str | int = "best",
                  split: str | None = None, data: str | Path | None = None, device: str | None = None,
                  start: str | None = None, end: str | None = None, study_file: str | None = None,
                  allow_unrefit: bool = False) -> Prediction:
    """Predictions of ``trial`` (number, "best" or "topK") on ``split`` of the study's data, or of ``data``.
    ``study_file`` is named in the retrain command of a trial whose weights study.keep removed, and in the
    refit command of :func:`refuse_unrefit`, which ``allow_unrefit`` turns off.

    ``split`` None: ``all`` with ``start``/``end``, or where ``data`` is scored by a refit (a refit has
    trained on the study's valid and test dates: new data is what it is for), else ``valid``."""
    from sweeper.quant.ensemble import ensemble

    if split is not None and split not in SPLITS:
        raise ConfigError(f"--split: expected one of {', '.join(SPLITS)}, got {split!r}")
    parsed = parse_trial(trial)
    top_k = int(parsed[3:]) if isinstance(parsed, str) and parsed != "best" else None
    members = top_trials(study, top_k) if top_k is not None else [pick_trial(study, parsed)]
    predictor = Predictor(cfg, study, device, study_file)
    if data is not None and parsed == "best" and not allow_unrefit:
        refuse_unrefit(study, members[0], predictor, study_file)
    if split is None:
        refit = data is not None and any(predictor.has_refit(t) for t in members)
        split = "all" if start or end or refit else "valid"
    frames = [predictor.frame(t, split, data=data, start=start, end=end) for t in members]
    source, same = (str(data), None) if data is not None else predictor.study_data
    used = {t.number: predictor.refits[t.number] for t in members if t.number in predictor.refits}
    notes = list(predictor.notes) + _in_sample(frames[0], used)
    refitted = [str(t.number) for t in members if data is None and predictor.has_refit(t)]
    if refitted:  # scoring the dates a refit trained on would be leakage
        notes.append(f"trial {', '.join(refitted)} has a refit: the study's own dates are scored with "
                     "the trial's own weights (the refit trained on them); --data scores new dates with it")
    return Prediction(frame=ensemble(frames) if top_k else frames[0],
                      trial=[t.number for t in members] if top_k else members[0].number, split=split,
                      source=source, same_data=same, refits={n: str(r.get("until")) for n, r in used.items()},
                      notes=notes, weights=weights_line(study.user_attrs, members, used))


def _in_sample(frame: pd.DataFrame, used: dict[int, dict[str, Any]]) -> list[str]:
    """A note where a refit scores dates it trained on (``--data`` holds its window): an in-sample IC."""
    if not used or frame.empty:
        return []
    seen = max(str(r.get("last_target")) for r in used.values())
    dates = pd.to_datetime(frame["date"]).drop_duplicates()
    if not (inside := int((dates <= pd.Timestamp(seen)).sum())):
        return []
    return [f"{inside} of the {len(dates)} dates scored are on or before {seen}, the last target date a "
            "refit trained on: their IC is in-sample (score later dates, or --start after it)"]


def refuse_unrefit(study: optuna.Study, best: FrozenTrial, predictor: Predictor,
                   study_file: str | None) -> None:
    """New dates scored by the best trial, which has no refit, while another trial has one (it was
    the best when it was refit): the best's weights have seen only its train window, so scoring
    with them would silently use a weaker model than the one refit. A ConfigError that names the
    refit and the ways on (refit the best, ``--trial N``, ``--allow-unrefit``)."""
    if predictor.has_refit(best):
        return
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    refits = ((t.number, read_refit(trial_files(predictor.run_dir, t.number))) for t in done)
    n, record = next(((number, r) for number, r in refits if r), (None, None))
    if record is None:
        return
    seen = " to ".join(model_dates(study.user_attrs).get("train") or []) or "-"
    raise ConfigError(
        f"the best trial, {best.number}, has no refit, but trial {n} has one (trained to "
        f"{record.get('until')}): trial {best.number}'s own weights saw only its train window ({seen}). "
        f"Refit it (`sweeper refit {study_file or 'STUDY'}`), use trial {n}'s refit (--trial {n}), "
        f"or pass --allow-unrefit to score with trial {best.number}'s own weights")


def own_weights(study_attrs: dict[str, Any]) -> str:
    """The dates a trial's own weights saw, in words: the model run's train window, and the valid
    block that early-stopped it (under walk-forward, the last fold's)."""
    dates = model_dates(study_attrs)
    train, valid = (" to ".join(dates.get(k) or []) or "dates -" for k in ("train", "valid"))
    window, block = (("the last fold's train window", "its valid block") if K.folded(study_attrs)
                     else ("the train split", "the valid split"))
    return f"trained on {window} ({train}), early-stopped on {block} ({valid})"


def weights_line(study_attrs: dict[str, Any], members: list[FrozenTrial],
                 used: dict[int, dict[str, Any]]) -> str:
    """Which weights scored and the dates they saw: each refit used (the last date whose labels it
    read, and its target dates) and the trials' own weights (:func:`own_weights`)."""
    own = [str(t.number) for t in members if t.number not in used]
    if len(members) == 1:
        record = used.get(members[0].number)
        return (f"using trial {own[0]}'s own weights, {own_weights(study_attrs)}" if record is None else
                f"using the refit of trial {members[0].number}, trained to {record.get('until')} "
                f"(target dates {record.get('first_target')} to {record.get('last_target')})")
    if not used:
        return f"using the own weights of trials {', '.join(own)}, {own_weights(study_attrs)}"
    whose = ", ".join(f"trial {n} trained to {r.get('until')}" for n, r in used.items())
    rest = "" if not own else (f"; trial {own[0]} uses its own weights" if len(own) == 1
                               else f"; trials {', '.join(own)} use their own weights")
    return f"using the refits of {len(used)} of the {len(members)} trials ({whose}){rest}" \
           + (f", {own_weights(study_attrs)}" if own else "")
