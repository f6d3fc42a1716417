"""``load_panel``: a DataConfig -> a validated, normalised, split Panel.

The split is computed with the study's pinned lookback, horizon and embargo
(``data.split.*``, the widest any trial can sample), so every trial of a study has the
same target dates; the leak guard (:mod:`sweeper.data.leak`) runs on the train split.
"""
from __future__ import annotations

import hashlib
import json
from typing import Callable

import numpy as np
import torch

from sweeper.config import DataConfig
from sweeper.data import synth
from sweeper.data.features import select as select_columns
from sweeper.data.layout import Columns, densify
from sweeper.data.leak import check_leaks
from sweeper.data.normalize import fit_stats, normalize_features, normalize_label
from sweeper.data.panel import Panel
from sweeper.data.parquet import file_fingerprint, oracle_from_metadata, read_columns
from sweeper.data.split import SPLITS, split_dates, split_widths
from sweeper.errors import DataError

OracleFn = Callable[[np.ndarray, dict[str, tuple[int, int]]], "dict[str, float] | None"]


def load_panel(cfg: DataConfig) -> Panel:
    """Read ``cfg.path`` (or generate ``cfg.synthetic``) into a Panel; raises DataError."""
    if cfg.synthetic is not None:
        return _synthetic_panel(cfg)
    cols, metadata = read_columns(cfg)
    selection = _selection(cols)
    return assemble(cols, cfg, file_fingerprint(str(cfg.path), selection), oracle_from_metadata(metadata))


def _selection(cols: Columns) -> dict:
    return {"date": cols.date_col, "asset": cols.asset_col, "label": cols.label_col, "features": cols.feature_names}


def assemble(cols: Columns, cfg: DataConfig, fingerprint: str, oracle: OracleFn) -> Panel:
    """Dense layout, split, leak guard, normalisation and the usable-sample checks."""
    _check_rows(cols)
    dense = densify(cols)
    lookback, horizon, embargo = split_widths(cfg)
    splits = split_dates(dense.dates, cfg.split, lookback, horizon, embargo,
                         f"{cols.source}: column '{cols.date_col}'")
    check_leaks(dense, cols, splits["train"], cfg.max_feature_label_corr)
    mask = torch.from_numpy(dense.mask)
    train_start, train_stop = splits["train"]
    fit_dates = (max(train_start - cfg.lookback + 1, 0), train_stop)  # what train windows can see
    x_raw = torch.from_numpy(dense.X)
    stats = fit_stats(x_raw, mask, cfg.feature_norm, fit_dates, list(cols.feature_names))
    y_raw = torch.from_numpy(dense.y)
    panel = Panel(
        X=normalize_features(x_raw, mask, cfg.feature_norm, fit_dates, stats),
        y=normalize_label(y_raw, mask, cfg.label_norm), y_raw=y_raw, mask=mask,
        dates=dense.dates, assets=dense.assets, features=list(cols.feature_names), splits=splits,
        lookback=cfg.lookback, oracle_ic=oracle(dense.dates, splits), source=cols.source,
        fingerprint=fingerprint, norm_stats=stats,
    )
    _check_samples(panel, cols)
    _remember(cfg, panel)
    return panel


def _key(cfg: DataConfig) -> str:
    return json.dumps(cfg.model_dump(mode="json"), sort_keys=True)


# The parent loads the panel to check it (sweep.run.prepare) and, a moment later, records
# the study's split dates and features as study attributes: this keeps them from the last
# load in this process instead of reading the data a second time.
_RECENT: dict[str, dict] = {}


def _remember(cfg: DataConfig, panel: Panel) -> None:
    _RECENT.clear()
    _RECENT[_key(cfg)] = {"split_dates": panel.split_dates(), "features": list(panel.features)}


def panel_summary(cfg: DataConfig) -> dict:
    """``{"split_dates": {split: [first, last]}, "features": [...]}`` of the panel ``cfg`` gives
    (the study's fixed split dates); from the last load in this process when it was this config."""
    if _key(cfg) not in _RECENT:
        load_panel(cfg)
    return _RECENT[_key(cfg)]


def _check_rows(cols: Columns) -> None:
    if len(cols.label) == 0:
        raise DataError(f"{cols.source}: no usable rows: the data has no rows")
    if not np.isfinite(cols.label).any():
        raise DataError(f"{cols.source}: column '{cols.label_col}': no usable rows: "
                        f"none of the {len(cols.label)} rows has a finite label")


def _check_samples(panel: Panel, cols: Columns) -> None:
    for name in SPLITS:
        if len(panel.sample_index(name)) == 0:
            a, b = panel.splits[name]
            first, last = (np.datetime_as_string(panel.dates[k], unit="D") for k in (a, b - 1))
            raise DataError(f"{cols.source}: column '{cols.label_col}': no usable rows in the {name} split "
                            f"({first} to {last}): no present row has a finite label")


def _synthetic_panel(cfg: DataConfig) -> Panel:
    params = cfg.synthetic
    assert params is not None
    source = synth.describe(params.assets, params.dates, params.features, params.seed)
    frame = synth.generate(params.assets, params.dates, params.features, params.seed)
    names = synth.feature_names(params.features)
    chosen = _synthetic_features(cfg, names, source)
    cols = Columns(
        source=source, date_col="date", asset_col="asset", label_col="label",
        dates=frame["date"].to_numpy("datetime64[ns]"), assets=frame["asset"].to_numpy(object),
        features=frame[chosen].to_numpy(np.float32), label=frame["label"].to_numpy(np.float32),
        feature_names=chosen,
    )
    blob = json.dumps({"synthetic": params.model_dump(), "generator": synth.GENERATOR_VERSION,
                       "features": chosen}, sort_keys=True)
    return assemble(cols, cfg, hashlib.sha256(blob.encode()).hexdigest(),
                    lambda dates, splits: synth.oracle_ic(frame, dates, splits))


def _synthetic_features(cfg: DataConfig, names: list[str], source: str) -> list[str]:
    return select_columns(names, ["date", "asset", *names, "label"], cfg.features, cfg.exclude, source)
