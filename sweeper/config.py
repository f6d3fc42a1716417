"""The typed study config: YAML -> validated pydantic model, once, at the edge.

The same dotted names are used in the YAML file, in ``--set key=value``, in
``search_space`` keys and in the stored study attributes.
"""
from __future__ import annotations

import copy
import datetime
import difflib
import hashlib
import json
from pathlib import Path
from typing import Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sweeper.errors import ConfigError

BUILTIN_MODELS = ("transformer", "lstm", "gru", "mlp")
METRICS = ("val_ic", "val_rank_ic", "val_icir", "val_loss")
SAMPLERS = ("tpe", "random", "cmaes", "gp", "qmc")
PRUNERS = ("median", "percentile", "asha", "hyperband", "wilcoxon", "none")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False)


class SamplerConfig(_Strict):
    name: Literal["tpe", "random", "cmaes", "gp", "qmc"] = "tpe"
    seed: int | None = None
    options: dict[str, Any] = Field(default_factory=dict)


class PrunerConfig(_Strict):
    name: Literal["median", "percentile", "asha", "hyperband", "wilcoxon", "none"] = "median"
    options: dict[str, Any] = Field(default_factory=dict)


class StudyConfig(_Strict):
    name: str = "sweep"
    storage: str | None = None
    artifacts: str | None = None
    metric: Literal["val_ic", "val_rank_ic", "val_icir", "val_loss"] = "val_ic"
    direction: Literal["maximize", "minimize"] | None = None
    n_trials: int = Field(20, ge=1)
    timeout: float | None = Field(None, gt=0)
    sampler: SamplerConfig = Field(default_factory=SamplerConfig)
    pruner: PrunerConfig = Field(default_factory=PrunerConfig)
    retries: int = Field(1, ge=0)
    retry_timeouts: bool = False
    max_consecutive_failures: int = Field(10, ge=1)
    heartbeat_interval: int = Field(5, ge=1)
    grace_period: int = Field(30, ge=2)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        # the name becomes a folder under runs/: keep it from escaping
        if not v or v in (".", "..") or any(c in v for c in "/\\\0"):
            raise ValueError("must be a non-empty name without '/', '\\' or '..'")
        return v

    @property
    def resolved_direction(self) -> str:
        if self.direction is not None:
            return self.direction
        return "minimize" if self.metric == "val_loss" else "maximize"

    @property
    def resolved_storage(self) -> str:
        return self.storage or f"sqlite:///runs/{self.name}/study.db"

    @property
    def resolved_artifacts(self) -> str:
        return self.artifacts or f"runs/{self.name}"


class SyntheticConfig(_Strict):
    assets: int = Field(300, ge=2)
    dates: int = Field(1000, ge=10)
    features: int = Field(16, ge=2)
    seed: int = 0


SplitPart = Union[float, tuple[str, str]]


class SplitConfig(_Strict):
    """Fractions of the dates, or explicit inclusive [start, end] date ranges."""

    train: SplitPart = 0.6
    valid: SplitPart = 0.2
    test: SplitPart = 0.2

    @field_validator("train", "valid", "test", mode="before")
    @classmethod
    def _dates_to_text(cls, v: Any) -> Any:
        # YAML reads an unquoted 2015-01-01 as a date; the split wants the text
        if isinstance(v, (list, tuple)):
            return tuple(x.isoformat() if isinstance(x, datetime.date) else x for x in v)
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "SplitConfig":
        parts = (self.train, self.valid, self.test)
        kinds = {isinstance(p, float) for p in parts}
        if len(kinds) != 1:
            raise ValueError("use fractions for all three splits, or date ranges for all three")
        if isinstance(self.train, float):
            if any(p <= 0 for p in parts):
                raise ValueError("split fractions must be > 0")
            if sum(parts) > 1.0 + 1e-9:
                raise ValueError(f"split fractions add up to {sum(parts):g}, more than 1")
        return self


class DataConfig(_Strict):
    path: str | None = None
    synthetic: SyntheticConfig | None = None
    date_col: str = "date"
    asset_col: str = "asset"
    label: str = "label"
    features: list[str] | None = None
    lookback: int = Field(20, ge=1)
    horizon: int = Field(2, ge=0)
    embargo: int = Field(0, ge=0)
    feature_norm: Literal["cs_zscore", "cs_rank", "robust_zscore", "none"] = "cs_zscore"
    label_norm: Literal["cs_rank", "cs_zscore", "none"] = "cs_rank"
    split: SplitConfig = Field(default_factory=SplitConfig)
    device_share: float = Field(0.5, gt=0, le=1)

    @model_validator(mode="after")
    def _one_source(self) -> "DataConfig":
        if self.path is None and self.synthetic is None:
            raise ValueError("set data.path to a Parquet file, or data.synthetic for the built-in panel")
        if self.path is not None and self.synthetic is not None:
            raise ValueError("set data.synthetic: null to use data.path (both are set)")
        return self


class ModelConfig(BaseModel):
    """Built-in models take the named fields; a ``package.module:Class`` model
    takes every key the user set except ``name`` as constructor kwargs."""

    model_config = ConfigDict(extra="allow")

    name: str = "transformer"
    d_model: int = Field(64, ge=1)
    nhead: int = Field(4, ge=1)
    num_layers: int = Field(2, ge=1)
    dim_feedforward: int = Field(128, ge=1)
    dropout: float = Field(0.1, ge=0, lt=1)
    hidden_size: int = Field(64, ge=1)
    positional: Literal["learned", "sinusoidal"] = "learned"
    pooling: Literal["last", "mean"] = "last"
    gradient_checkpointing: bool = False

    @model_validator(mode="after")
    def _known(self) -> "ModelConfig":
        if ":" in self.name:
            return self
        if self.name not in BUILTIN_MODELS:
            raise ValueError(
                f"unknown model {self.name!r}: expected one of {', '.join(BUILTIN_MODELS)} "
                "or a dotted path 'package.module:Class'"
            )
        extra = sorted(self.model_extra or {})
        if extra:
            raise ValueError(_unknown_key_message(f"model.{extra[0]}", extra[0], type(self).model_fields, "model."))
        if self.name == "transformer" and self.d_model % self.nhead:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by nhead ({self.nhead})")
        return self

    @property
    def is_custom(self) -> bool:
        return ":" in self.name

    def custom_kwargs(self) -> dict[str, Any]:
        keys = (self.model_fields_set | set(self.model_extra or {})) - {"name"}
        return {k: getattr(self, k) for k in sorted(keys)}


class TrainConfig(_Strict):
    epochs: int = Field(20, ge=1)
    batch_size: int | Literal["auto"] = 1024
    max_batch_size: int = Field(65536, ge=1)
    min_micro_batch: int = Field(8, ge=1)
    samples_per_epoch: int | None = Field(None, ge=1)
    eval_batch_size: int = Field(16384, ge=1)
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    schedule: Literal["constant", "cosine", "onecycle"] = "cosine"
    warmup_frac: float = Field(0.05, ge=0, lt=1)
    grad_clip: float | None = Field(1.0, gt=0)
    loss: Literal["mse", "ic"] = "mse"
    batch_order: Literal["auto", "random", "cross_section"] = "auto"
    patience: int = Field(5, ge=1)
    early_stop_metric: Literal["val_ic", "val_rank_ic", "val_icir", "val_loss"] = "val_ic"
    seed: int = 0
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    compile: bool = False
    memory_margin: float = Field(0.1, ge=0, lt=1)
    probe_steps: int = Field(3, ge=1)
    nonfinite_patience: int = Field(10, ge=1)
    max_minutes: float | None = Field(None, gt=0)

    @field_validator("batch_size")
    @classmethod
    def _positive(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be >= 1 or 'auto'")
        return v

    @property
    def resolved_batch_order(self) -> str:
        if self.batch_order != "auto":
            return self.batch_order
        return "cross_section" if self.loss == "ic" else "random"


class DevicesConfig(_Strict):
    gpus: Literal["auto", "none"] | list[Union[int, str]] = "auto"
    trials_per_gpu: int = Field(1, ge=1)
    skip_busy: bool = False
    busy_memory_mb: int = Field(1024, ge=0)
    cpu_workers: Literal["auto"] | int = "auto"

    @field_validator("cpu_workers")
    @classmethod
    def _workers(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be >= 1 or 'auto'")
        return v


class ParamSpec(_Strict):
    type: Literal["float", "int", "categorical"]
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    choices: list[Any] | None = None
    when: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check(self) -> "ParamSpec":
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("categorical parameter needs a non-empty 'choices' list")
            if self.low is not None or self.high is not None:
                raise ValueError("categorical parameter takes 'choices', not low/high")
            return self
        if self.low is None or self.high is None:
            raise ValueError(f"{self.type} parameter needs 'low' and 'high'")
        if self.choices is not None:
            raise ValueError(f"{self.type} parameter takes low/high, not 'choices'")
        if self.low > self.high:
            raise ValueError(f"low ({self.low:g}) > high ({self.high:g})")
        if self.log and self.low <= 0:
            raise ValueError(f"log scale needs low > 0 (got {self.low:g})")
        if self.log and self.step is not None:
            raise ValueError("'step' and 'log' cannot be combined")
        if self.type == "int" and not (float(self.low).is_integer() and float(self.high).is_integer()):
            raise ValueError("int parameter needs integer low and high")
        return self


class SweeperConfig(_Strict):
    study: StudyConfig = Field(default_factory=StudyConfig)
    data: DataConfig
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    devices: DevicesConfig = Field(default_factory=DevicesConfig)
    search_space: dict[str, ParamSpec] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _space_keys(self) -> "SweeperConfig":
        for key, spec in self.search_space.items():
            _check_space_key(self, key, "search_space")
            for cond in (spec.when or {}):
                _check_space_key(self, cond, f"search_space.{key}.when")
        return self


# ---------------------------------------------------------------- helpers

_TUNABLE = ("model", "train", "data")


def _check_space_key(cfg: SweeperConfig, key: str, where: str) -> None:
    section, _, field = key.partition(".")
    if section not in _TUNABLE or not field:
        raise ValueError(f"{where}: key {key!r} must be a dotted path such as model.d_model or train.lr")
    if section == "model" and cfg.model.is_custom:
        return
    fields = type(getattr(cfg, section)).model_fields
    head = field.split(".")[0]
    if head not in fields:
        raise ValueError(f"{where}: " + _unknown_key_message(key, head, fields, prefix=f"{section}."))


def _unknown_key_message(dotted: str, key: str, fields: Any, prefix: str = "") -> str:
    close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.5)
    hint = f"; did you mean '{prefix}{close[0]}'?" if close else ""
    return f"unknown key '{dotted}'{hint}"


def _dotted(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if not (isinstance(p, str) and ("[" in p or p.startswith("function-")))]
    return ".".join(parts)


def _model_at(loc: tuple[Any, ...]) -> Any:
    """The pydantic model class whose fields live at ``loc`` (for suggestions)."""
    cls: Any = SweeperConfig
    for part in loc:
        field = getattr(cls, "model_fields", {}).get(part)
        if field is None:
            return None
        ann = field.annotation
        cls = next((a for a in getattr(ann, "__args__", (ann,)) if hasattr(a, "model_fields")), None)
        if cls is None:
            return None
    return cls


def _format_error(err: dict[str, Any]) -> str:
    loc = tuple(err["loc"])
    key = _dotted(loc)
    if err["type"] == "extra_forbidden":
        parent = _model_at(loc[:-1])
        fields = getattr(parent, "model_fields", {})
        close = difflib.get_close_matches(str(loc[-1]), list(fields), n=1, cutoff=0.5)
        prefix = _dotted(loc[:-1])
        hint = f"; did you mean '{prefix + '.' if prefix else ''}{close[0]}'?" if close else ""
        return f"unknown key '{key}'{hint}"
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    shown = "" if isinstance(got, (dict, list)) or err["type"] == "missing" else f" (got {got!r})"
    if not key or msg.startswith("unknown key"):
        return f"{msg}{shown}"
    return f"{key}: {msg}{shown}"


def validate_config(raw: dict[str, Any], source: str) -> SweeperConfig:
    """Validate a raw mapping; any problem becomes one ConfigError naming ``source``."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of sections (study, data, model, ...), got {type(raw).__name__}")
    try:
        return SweeperConfig.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        first = _format_error(errors[0])
        more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
        raise ConfigError(f"{source}: {first}{more}") from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: study file not found")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        ctx, ctx_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
        if ctx and ctx_mark:  # an unclosed bracket is reported at the end; point at its start too
            problem += f" ({ctx} at line {ctx_mark.line + 1}, column {ctx_mark.column + 1})"
        raise ConfigError(f"{path}:{where}: YAML syntax error: {problem}") from None
    return raw if raw is not None else {}


def parse_sets(sets: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["train.lr=0.01", "model.name=lstm"]`` -> ``{"train.lr": 0.01, ...}``; values are YAML scalars."""
    out: dict[str, Any] = {}
    for item in sets:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--set {item!r}: expected key=value, such as train.lr=0.001")
        try:
            out[key.strip()] = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    node = raw
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def with_overrides(cfg: SweeperConfig, overrides: dict[str, Any], source: str) -> SweeperConfig:
    """A new validated config with dotted ``overrides`` applied (``--set`` and trial params)."""
    raw = cfg.model_dump(mode="python", exclude_unset=False)
    if cfg.model.is_custom:
        raw["model"] = {"name": cfg.model.name, **cfg.model.custom_kwargs()}
    raw = copy.deepcopy(raw)
    for key, value in overrides.items():
        set_dotted(raw, key, value)
    return validate_config(raw, source)


def load_config(path: str | Path, sets: list[str] | tuple[str, ...] = ()) -> SweeperConfig:
    """Read, override and validate a study file. Raises ConfigError only."""
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections (study, data, model, ...)")
    for key, value in parse_sets(sets).items():
        set_dotted(raw, key, value)
    cfg = validate_config(raw, str(path))
    return cfg.model_copy(update={"data": _resolve_data_path(cfg.data, Path(path))})


def _resolve_data_path(data: DataConfig, study_file: Path) -> DataConfig:
    # a relative data.path is taken relative to the working directory when it
    # exists there, else relative to the study file (so `sweeper run x/y.yaml` works anywhere)
    if data.path is None or Path(data.path).is_absolute() or Path(data.path).exists():
        return data
    beside = study_file.parent / data.path
    return data.model_copy(update={"path": str(beside)}) if beside.exists() else data


def to_dict(cfg: SweeperConfig) -> dict[str, Any]:
    """JSON-safe dict of the resolved config (what the study stores)."""
    out = cfg.model_dump(mode="json")
    if cfg.model.is_custom:
        out["model"] = {"name": cfg.model.name, **cfg.model.custom_kwargs()}
    return out


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value and key != "options":
            flat.update(flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def config_hash(cfg: SweeperConfig) -> str:
    blob = json.dumps(to_dict(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def config_value(cfg: SweeperConfig, key: str) -> Any:
    """The value at dotted ``key`` (``model.name``, ``train.lr``); KeyError if absent."""
    node: Any = cfg
    for part in key.split("."):
        if isinstance(node, dict):
            node = node[part]
        elif isinstance(node, BaseModel) and (part in type(node).model_fields or part in (node.model_extra or {})):
            node = getattr(node, part)
        else:
            raise KeyError(key)
    return node
