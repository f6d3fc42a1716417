"""``load_panel``: a DataConfig -> a validated, normalised, split Panel (split with the study's
pinned widths, ``data.split.*``); the leak guard (:mod:`sweeper.data.leak`) runs on the train split."""

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from sweeper.config import DataConfig
from sweeper.data import synth
from sweeper.data.build import Alloc, Built, OracleFn, build, in_memory, to_panel
from sweeper.data.cache import cache_root, cached
from sweeper.data.columns import Columns
from sweeper.data.features import select as select_columns
from sweeper.data.leak import judge_leaks
from sweeper.data.panel import Panel
from sweeper.data.parquet import feature_blocks, file_fingerprint, oracle_from_metadata, read_keys, read_plan
from sweeper.data.split import SPLITS
from sweeper.errors import DataError

Blocks = Iterable[tuple[int, np.ndarray]]  # (first column, [rows, columns] values) of the features


@dataclass
class Recipe:
    """What identifies a panel before it is built, and how to read it: ``columns`` gives the
    rows' keys and label, the feature blocks and the oracle, before anything is split."""

    cfg: DataConfig
    source: str
    label_col: str
    fingerprint: str
    columns: Callable[[], tuple[Columns, Blocks, OracleFn]]

    def make(self, alloc: Alloc) -> Built:
        keys, blocks, oracle = self.columns()
        return build(keys, blocks, self.cfg, oracle, alloc)


def recipe(cfg: DataConfig) -> Recipe:
    """How ``cfg``'s panel is read: from ``data.synthetic`` or the Parquet file ``data.path``
    (``sweeper refit`` reads the same columns and builds its own window of them)."""
    return _synthetic_recipe(cfg) if cfg.synthetic is not None else _file_recipe(cfg)


def still_the_data(cfg: DataConfig, fingerprint: str | None) -> tuple[str, bool | None]:
    """``cfg``'s data (its source), and whether its fingerprint is still ``fingerprint`` (None: unknown)."""
    return (how := recipe(cfg)).source, None if fingerprint is None else how.fingerprint == fingerprint


def load_panel(cfg: DataConfig) -> Panel:
    """Read ``cfg.path`` (or generate ``cfg.synthetic``) into a Panel; raises DataError.

    With ``data.cache`` (the default) the arrays are built once per host and mapped
    read-only from the panel cache (:mod:`sweeper.data.cache`); without it they are built
    in this process's memory. Both run the same builder and give the same bits."""
    how = recipe(cfg)
    if cfg.cache:
        built, entry = cached(cfg, how.fingerprint, how.make)
        # the entry keeps the guard's figures: judged against this config's threshold
        judge_leaks(np.asarray(built.leak_corr), np.asarray(built.leak_rows), cfg.max_feature_label_corr,
                    built.features, how.source, how.label_col)
        panel = to_panel(built, cfg, how.fingerprint, how.source, str(entry))
    else:
        panel = to_panel(how.make(in_memory), cfg, how.fingerprint, how.source)
    for name in SPLITS:
        if len(panel.sample_index(name)) == 0:
            first, last = panel.days(panel.splits[name])
            raise DataError(f"{panel.source}: column '{how.label_col}': no usable rows in the {name} split "
                            f"({first} to {last}): no present row has a finite label")
    return panel


def _file_recipe(cfg: DataConfig) -> Recipe:
    path, features, metadata = read_plan(cfg)
    selection = {"date": cfg.date_col, "asset": cfg.asset_col, "label": cfg.label, "features": features}

    def columns() -> tuple[Columns, Blocks, OracleFn]:
        keys = read_keys(path, cfg, features)
        return keys, feature_blocks(path, features, len(keys.label)), oracle_from_metadata(metadata)

    memo = cache_root(cfg) if cfg.cache else None
    return Recipe(cfg, str(path), cfg.label, file_fingerprint(path, selection, memo), columns)


class PanelMemo:
    """The panels this process has loaded, by what made them (a data config, and for a scoring panel its file
    and statistics), each loaded once; ``keep`` bounds how many stay (a worker keeps one: its next trial
    usually shares its data). Both the worker and ``predict`` keep theirs here."""

    def __init__(self, keep: int | None = None) -> None:
        self.keep = keep
        self._panels: dict[str, Panel] = {}

    def get(self, key: object, make: Callable[[], Panel]) -> Panel:
        """The panel made for ``key`` (anything JSON can write), made now if it is new."""
        if (text := json.dumps(key, sort_keys=True, default=str)) not in self._panels:
            if self.keep is not None and len(self._panels) >= self.keep:
                self._panels.pop(next(iter(self._panels)))  # the oldest goes first
            self._panels[text] = make()
        return self._panels[text]

    def load(self, cfg: DataConfig) -> Panel:
        return self.get(cfg.model_dump(mode="json"), lambda: load_panel(cfg))


def _synthetic_recipe(cfg: DataConfig) -> Recipe:
    params = cfg.synthetic
    assert params is not None
    if cfg.group_col is not None:
        raise DataError(f"data.group_col {cfg.group_col!r}: the synthetic panel (data.synthetic) has no "
                        "group column; set data.path to a Parquet file that has one")
    source = synth.describe(params.assets, params.dates, params.features, params.seed)
    names = synth.feature_names(params.features)
    chosen = select_columns(names, ["date", "asset", *names, "label"], cfg.features, cfg.exclude, source)
    blob = json.dumps({"synthetic": params.model_dump(), "generator": synth.GENERATOR_VERSION,
                       "features": chosen}, sort_keys=True)

    def columns() -> tuple[Columns, Blocks, OracleFn]:
        frame = synth.generate(params.assets, params.dates, params.features, params.seed)
        keys = Columns(source=source, date_col="date", asset_col="asset", label_col="label",
                       dates=frame["date"].to_numpy("datetime64[ns]"), assets=frame["asset"].to_numpy(object),
                       features=np.empty((len(frame), 0), dtype=np.float32),
                       label=frame["label"].to_numpy(np.float32), feature_names=chosen)
        blocks = ((k, frame[chosen[k:k + 8]].to_numpy(np.float32)) for k in range(0, len(chosen), 8))
        return keys, blocks, lambda dates, splits: synth.oracle_ic(frame, dates, splits)

    return Recipe(cfg, source, "label", hashlib.sha256(blob.encode()).hexdigest(), columns)
