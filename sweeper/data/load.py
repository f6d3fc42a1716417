"""``load_panel``: a DataConfig -> a validated, normalised, split Panel."""
from __future__ import annotations

import hashlib
import json
from typing import Callable

import numpy as np
import torch

from sweeper.config import DataConfig
from sweeper.data import synth
from sweeper.data.layout import Columns, densify
from sweeper.data.normalize import normalize_features, normalize_label
from sweeper.data.panel import Panel
from sweeper.data.parquet import file_fingerprint, oracle_from_metadata, read_columns
from sweeper.data.split import SPLITS, split_dates
from sweeper.errors import DataError

OracleFn = Callable[[np.ndarray, dict[str, tuple[int, int]]], "dict[str, float] | None"]


def load_panel(cfg: DataConfig) -> Panel:
    """Read ``cfg.path`` (or generate ``cfg.synthetic``) into a Panel; raises DataError."""
    if cfg.synthetic is not None:
        return _synthetic_panel(cfg)
    cols, metadata = read_columns(cfg)
    selection = _selection(cols)
    oracle = oracle_from_metadata(metadata)
    return assemble(cols, cfg, file_fingerprint(str(cfg.path), selection), lambda dates, splits: oracle)


def _selection(cols: Columns) -> dict:
    return {"date": cols.date_col, "asset": cols.asset_col, "label": cols.label_col, "features": cols.feature_names}


def assemble(cols: Columns, cfg: DataConfig, fingerprint: str, oracle: OracleFn) -> Panel:
    """Dense layout, split, normalisation and the usable-sample checks."""
    _check_rows(cols)
    dense = densify(cols)
    splits = split_dates(dense.dates, cfg.split, cfg.lookback, cfg.horizon, cfg.embargo,
                         f"{cols.source}: column '{cols.date_col}'")
    mask = torch.from_numpy(dense.mask)
    train_start, train_stop = splits["train"]
    fit_dates = (max(train_start - cfg.lookback + 1, 0), train_stop)  # what train windows can see
    y_raw = torch.from_numpy(dense.y)
    panel = Panel(
        X=normalize_features(torch.from_numpy(dense.X), mask, cfg.feature_norm, fit_dates),
        y=normalize_label(y_raw, mask, cfg.label_norm), y_raw=y_raw, mask=mask,
        dates=dense.dates, assets=dense.assets, features=list(cols.feature_names), splits=splits,
        lookback=cfg.lookback, oracle_ic=oracle(dense.dates, splits), source=cols.source,
        fingerprint=fingerprint,
    )
    _check_samples(panel, cols)
    return panel


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
    if cfg.features is None:
        return names
    missing = [f for f in cfg.features if f not in names]
    if missing:
        raise DataError(f"{source}: column '{missing[0]}' (data.features) not found; "
                        f"the synthetic panel has columns: date, asset, {', '.join(names)}, label")
    return list(cfg.features)
