"""Study-file sections beyond a short sweep: what of a trial's files survives it
(``study.keep``), which parameter sets a new study starts from (``study.warm_start``), which
trials are feasible (``study.constraints``) and the LightGBM baseline (``baseline``).

:mod:`sweeper.config.schema` holds them in the sections they belong to."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from sweeper.config.section import Section

KEPT = ("checkpoints", "weights", "predictions")


class KeepConfig(Section):
    """What survives a finished trial (applied as trials finish, and by ``sweeper gc``).

    - ``checkpoints``: ``none`` (the default: a finished trial's ``checkpoint.pt`` is removed;
      an interrupted trial's stays until its retry has ended), ``top_k`` or ``all``;
    - ``weights``: ``all`` (the default) or ``top_k`` (the ``k`` best COMPLETE trials' ``weights.pt``);
    - ``predictions``: a trial's per-date scores (``daily_ic_*.csv``) and its model's stored
      predictions (``predictions_*.parquet``), ``all`` (the default) or ``top_k``;
    - ``k``: how many trials ``top_k`` keeps (5).

    ``keep: all`` keeps everything; ``weights: {top_k: 3}`` is ``weights: top_k`` with ``k: 3``."""

    checkpoints: Literal["none", "top_k", "all"] = "none"
    weights: Literal["top_k", "all"] = "all"
    predictions: Literal["top_k", "all"] = "all"
    k: int = Field(5, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _shorthands(cls, value: Any) -> Any:
        if value == "all":
            return dict.fromkeys(KEPT, "all")
        if not isinstance(value, dict):
            return value
        value, ks = dict(value), set()
        for key in KEPT:
            if isinstance(item := value.get(key), dict):
                if set(item) != {"top_k"}:
                    raise ValueError(f"{key}: expected none, top_k, all or {{top_k: N}}, got {item!r}")
                value[key] = "top_k"
                ks.add(item["top_k"])
        if "k" in value:
            ks.add(value["k"])
        if len(ks) > 1:
            raise ValueError(f"one k for every top_k, got {sorted(ks, key=str)}")
        if ks:
            value["k"] = ks.pop()
        return value

    def keeps_all(self) -> bool:
        return all(getattr(self, key) == "all" for key in KEPT)


class WarmStartConfig(Section):
    """``study.warm_start``: enqueue the ``top_k`` best parameter sets of another study
    (best first) into a new study, before the sampler's own trials."""

    study: str
    storage: str | None = None  # null: study.storage, else the source's own default database
    top_k: int = Field(5, ge=1)


class Bound(Section):
    """``{max: X}`` and/or ``{min: X}``: the feasible range of one valid-split figure."""

    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _some(self) -> Bound:
        if self.min is None and self.max is None:
            raise ValueError("give min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min:g}) > max ({self.max:g})")
        return self


class BaselineConfig(Section):
    """``baseline``: the LightGBM model trained on the study's own dates and features
    (``sweeper baseline``). ``lags``: each date's features plus those of this many earlier
    dates. ``params``: LightGBM parameters over the defaults (Qlib's Alpha158 configuration,
    docs/baseline.md). ``max_rows``: a panel with more train rows is subsampled by dates."""

    lags: int = Field(0, ge=0)
    params: dict[str, Any] = Field(default_factory=dict)
    num_boost_round: int = Field(1000, ge=1)
    early_stopping_rounds: int = Field(50, ge=1)
    max_rows: int = Field(20_000_000, ge=1000)
