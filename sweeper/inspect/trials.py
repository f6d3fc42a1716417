"""A stored trial read back without torch: its resolved config (``trials/<n>/config.yaml``), the order of the
study's top trials (``best``, ``predict --trial topK``, the ensemble) and the dates its model run saw."""

from typing import Any

import optuna
import yaml
from optuna.trial import FrozenTrial, TrialState

from sweeper.config import SweeperConfig, validate_config
from sweeper.errors import DataError, StudyNotFound
from sweeper.store.layout import TrialFiles
from sweeper.store.studies import n_infeasible, ranked
from sweeper.validation import contract as K


def trial_config(files: TrialFiles, study: SweeperConfig | None = None) -> SweeperConfig:
    """The trial's resolved config, its data file where the study file ``study`` says it is now (a study file
    read from another folder, or a folder moved, names the same data by another path; the data's fingerprint
    says whether it is the same). A trial written before the split was pinned per study (no
    ``data.split.lookback``) used its own lookback, horizon and embargo: keep them."""
    if not (path := files.config).exists():
        raise DataError(f"{path}: missing; the trial's resolved config is written when it starts")
    raw = yaml.safe_load(path.read_text())
    data = raw.get("data") if isinstance(raw, dict) else None
    if isinstance(data, dict) and "lookback" not in (data.get("split") or {}):
        raw = {**raw, "search_space": {}}  # its search space would widen the split it never had
        data["split"] = {**(data.get("split") or {}), "lookback": data.get("lookback", 20),
                         "horizon": data.get("horizon", 2), "embargo": data.get("embargo", 0)}
    cfg = validate_config(raw, str(path))
    if study is None or cfg.data.path is None or study.data.path is None:
        return cfg
    where = {"path": study.data.path, "cache_dir": study.data.cache_dir}
    return cfg.model_copy(update={"data": cfg.data.model_copy(update=where)})


def top_trials(study: optuna.Study, k: int) -> list[FrozenTrial]:
    """The ``k`` best COMPLETE trials with a finite value, best first (ties: lower number first)."""
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(order := ranked(done, study.direction == optuna.study.StudyDirection.MAXIMIZE)) < k:
        within = " within study.constraints" if n_infeasible(done) else ""  # (all infeasible: it said none)
        raise StudyNotFound(f"study {study.study_name!r} has {len(order)} completed trials{within}; "
                            f"top{k} needs {k}")
    return order[:k]


def model_dates(study_attrs: dict[str, Any]) -> dict[str, list[str]]:
    """``{split: [first, last]}`` of the trials' model run, which ``weights.pt``, the stored
    predictions and ``predict`` are of: its train and valid are the last fold's under walk-forward."""
    folds = K.layout(study_attrs)
    return {**(study_attrs.get("split_dates") or {}), **(folds[-1] if folds else {})}
