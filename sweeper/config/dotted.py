"""Dotted names (``train.lr``, ``model.d_model``): one config, one naming, everywhere.

The YAML file, ``--set``, ``search_space`` keys, Optuna param names and the
stored study attributes all address a value by the same dotted path."""

import hashlib
import json
from typing import Any

from pydantic import BaseModel

from sweeper.config.anchor import redact
from sweeper.config.schema import ParamSpec, SweeperConfig


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    node = raw
    *parents, last = _parts(key)
    for part in parents:
        node[part] = node[part] if isinstance(node.get(part), dict) else {}
        node = node[part]
    node[last] = value


def _parts(key: str) -> list[str]:
    """``key``'s path; ``search_space`` is keyed by dotted names, each one part of it:
    ``search_space.train.lr.high`` is the ``high`` of the param ``train.lr``."""
    head, _, rest = key.partition(".")
    if head != "search_space" or not rest:
        return key.split(".")
    name, _, field = rest.rpartition(".")
    return [head, name, field] if name and field in ParamSpec.model_fields else [head, rest]


def to_dict(cfg: SweeperConfig, kept: bool = False) -> dict[str, Any]:
    """JSON-safe dict of the resolved config; ``kept``: as written where others read it (the study's
    attributes, a trial's config.yaml, a checkpoint), a storage URL's password hidden, as lines show it."""
    out = {**cfg.model_dump(mode="json"), "model": cfg.model.section()}
    for part in (out["study"], out["study"]["warm_start"] or {}) if kept else ():  # a user's password
        part["storage"] = part.get("storage") and redact(part["storage"])
    return out


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value and key != "options":
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_hash(cfg: SweeperConfig) -> str:
    blob = json.dumps(to_dict(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def config_value(cfg: SweeperConfig, key: str, *default: Any) -> Any:
    """The value at dotted ``key`` (``model.name``, ``train.lr``); if absent, ``default`` or KeyError."""
    node: Any = cfg
    for part in key.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, BaseModel) and (part in type(node).model_fields
                                              or part in (node.model_extra or {})):
            node = getattr(node, part)
        elif default:
            return default[0]
        else:
            raise KeyError(key)
    return node


def condition_met(spec: ParamSpec, cfg: SweeperConfig, chosen: dict[str, Any]) -> bool:
    """Whether ``spec``'s ``when`` holds: each key's value as ``chosen`` so far, else as ``cfg`` sets it."""
    return all(spec.allows(key, chosen[key] if key in chosen else config_value(cfg, key, None))
               for key in spec.when or {})
