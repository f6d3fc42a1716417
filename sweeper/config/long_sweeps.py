"""The study keys of long unattended sweeps: what of a trial's files survives it
(``study.keep``) and which parameter sets a new study starts from (``study.warm_start``).

Both are sections of ``study`` in the study file; :mod:`sweeper.config.schema` holds them.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

KEPT = ("checkpoints", "weights", "predictions")


class KeepConfig(BaseModel):
    """What survives a finished trial (applied as trials finish, and by ``sweeper gc``).

    - ``checkpoints``: ``none`` (the default: a finished trial's ``checkpoint.pt`` is removed;
      an interrupted trial's stays until its retry has ended), ``top_k`` or ``all``;
    - ``weights``: ``all`` (the default) or ``top_k`` (the ``k`` best COMPLETE trials' ``weights.pt``);
    - ``predictions``: the per-date scores of a trial's predictions (``daily_ic_*.csv``),
      ``all`` (the default) or ``top_k``;
    - ``k``: how many trials ``top_k`` keeps (5).

    ``keep: all`` keeps everything; ``weights: {top_k: 3}`` is ``weights: top_k`` with ``k: 3``.
    """

    model_config = ConfigDict(extra="forbid")

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
            item = value.get(key)
            if isinstance(item, dict):
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


class WarmStartConfig(BaseModel):
    """``study.warm_start``: enqueue the ``top_k`` best parameter sets of another study
    (best first) into a new study, before the sampler's own trials."""

    model_config = ConfigDict(extra="forbid")

    study: str
    storage: str | None = None  # null: this study's storage
    top_k: int = Field(5, ge=1)
