"""The study file's schema: one pydantic model per section, validated once, at the edge.

Field names are the dotted names users write in YAML, in ``--set key=value``, in
``search_space`` keys and see in the stored study attributes."""
from __future__ import annotations

import datetime
import difflib
import os
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from sweeper.config.long_sweeps import BaselineConfig, Bound, KeepConfig, WarmStartConfig
from sweeper.config.search_space import ParamSpec, check_space_key, check_space_values, space_highs
from sweeper.config.section import Section, unknown_key
from sweeper.config.validation import ValidationConfig

BUILTIN_MODELS = ("transformer", "lstm", "gru", "mlp")
# the context of a study file read at the edge (load_config): rules a stored config (a trial's, or one an
# older version wrote) is not judged by again, so that its study still loads
EDGE = {"edge": True}


def _one_or_auto(v: int | str) -> int | str:  # the validator of every count that can be 'auto'
    if isinstance(v, int) and v < 1:
        raise ValueError("must be >= 1 or 'auto'")
    return v


class SamplerConfig(Section):
    name: Literal["tpe", "random", "cmaes", "gp", "qmc"] = "tpe"
    seed: int | None = Field(None, ge=0, lt=2**32)  # numpy's seeds
    options: dict[str, Any] = Field(default_factory=dict)


class PrunerConfig(Section):
    name: Literal["median", "percentile", "asha", "hyperband", "wilcoxon", "none"] = "median"
    options: dict[str, Any] = Field(default_factory=dict)


class StudyConfig(Section):
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
    # a worker that makes no training step and sends no event for this long is killed (FAIL stall)
    stall_timeout: float | None = Field(900, gt=0)
    # transient storage errors are retried with backoff for this long before the sweep gives up
    storage_outage_s: float = Field(300, ge=0)
    # long unattended sweeps (sweeper.config.long_sweeps, docs/long-sweeps.md)
    keep: KeepConfig = Field(default_factory=KeepConfig)
    warm_start: WarmStartConfig | None = None
    start_from_config: bool = True  # trial 0 of a new study is the study file's own values
    # stop after this many finished trials (study-wide) without a new best beyond min_improvement
    patience_trials: int | None = Field(None, ge=1)
    min_improvement: float = Field(0.0, ge=0)
    # valid-split figures a trial must keep within bounds (Trial.set_constraint), e.g.
    # {top_turnover: {max: 0.5}}: best, predict and ensembles pick among feasible trials only
    constraints: dict[Literal["top_turnover", "long_short_sharpe"], Bound] = Field(default_factory=dict)
    # stop when Optuna's Terminator judges that no further trial can beat the noise that the
    # folds (or seed repeats) measure (sweeper.study.convergence; needs validation.runs >= 2)
    stop_when_converged: bool = False
    # how many trials of one shape train as one stack (a population, docs/populations.md): 1 each
    # trial alone; auto: as many as the stack size measured on the first trial's device pays for
    population: int | Literal["auto"] = 1
    # the study file's folder, which the default run folder and storage lie in ('': the current
    # folder): set by sweeper.config.anchor; not a field, so the stored config is what the file says
    _root: str = PrivateAttr("")
    _home: str = PrivateAttr("")  # the study file's folder, absolute (sweeper.config.anchor)

    _population = field_validator("population")(_one_or_auto)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        # the name becomes a folder under runs/: keep it from escaping
        if not v or v in (".", "..") or any(c in v for c in "/\\\0"):
            raise ValueError("must be a non-empty name without '/', '\\' or '..'")
        return v

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> StudyConfig:
        # one late or lost beat (a slow write, a busy store) must never make a live host look dead
        if self.grace_period < 2 * self.heartbeat_interval:
            raise ValueError(f"grace_period ({self.grace_period}) must be at least 2 x "
                             f"heartbeat_interval ({self.heartbeat_interval})")
        # gp with a pruner: measured in issue 41's race, 51 of 58 LSTM trials pruned
        if self.sampler.name == "gp" and self.pruner.name != "none":
            raise ValueError(f"sampler gp learns from complete trials only: with pruner {self.pruner.name} "
                             "it keeps proposing pruned configs; set pruner: {name: none}, or use tpe")
        natural = "minimize" if self.metric == "val_loss" else "maximize"  # (a stored config of before: read)
        if info.context and self.direction not in (None, natural):
            raise ValueError(f"direction {self.direction} with metric {self.metric} picks the worst trial as "
                             f"the best: {self.metric} is {natural[:-1]}ed; leave direction out")
        return self

    @property
    def resolved_direction(self) -> Literal["maximize", "minimize"]:
        return self.direction or ("minimize" if self.metric == "val_loss" else "maximize")

    def located(self, root: str, home: str = "") -> StudyConfig:
        """This section with its default run folder in ``root`` (the study file's folder, as named)."""
        out = self.model_copy()
        out._root, out._home = root, home
        return out

    @property
    def home(self) -> str:
        return self._home

    @property
    def resolved_storage(self) -> str:
        return self.storage or f"sqlite:///{os.path.join(self._root, 'runs', self.name)}/study.db"

    @property
    def resolved_artifacts(self) -> str:
        return self.artifacts or self.default_run_dir

    @property
    def default_run_dir(self) -> str:  # the study file's folder's runs/<name> (an s3:// store's too)
        return os.path.join(self._root, "runs", self.name)


class SyntheticConfig(Section):
    assets: int = Field(300, ge=2)
    dates: int = Field(1000, ge=10)
    features: int = Field(16, ge=2)
    seed: int = 0


SplitPart = float | tuple[str, str]


class SplitConfig(Section):
    """Fractions of the dates, or explicit inclusive [start, end] date ranges.

    ``lookback``, ``horizon`` and ``embargo`` are the values the split is computed with, so
    that every trial of a study is scored on the same dates: null (the default) is resolved
    when the config is validated, to the widest that data.* and the search space allow."""

    train: SplitPart = 0.6
    valid: SplitPart = 0.2
    test: SplitPart = 0.2
    lookback: int | None = Field(None, ge=1)
    horizon: int | None = Field(None, ge=0)
    embargo: int | None = Field(None, ge=0)

    @field_validator("train", "valid", "test", mode="before")
    @classmethod
    def _dates_to_text(cls, v: Any) -> Any:
        # YAML reads an unquoted 2015-01-01 as a date, 20150101 as a number; the split wants the text.
        # A null bound is an open end, as Qlib's segments write it: the days past any file's first or last
        if isinstance(v, (list, tuple)) and len(v) != 2:  # pydantic's own: "valid.float: ... a valid number"
            raise ValueError("expected a fraction (0.2) or a [start, end] date range, got "
                             f"[{', '.join(map(str, v))}]")
        if isinstance(v, (list, tuple)):
            return tuple(("0001-01-01", "9999-12-31")[k] if x is None else x.isoformat()
                         if isinstance(x, datetime.date) else str(x) if type(x) is int else x
                         for k, x in enumerate(v))
        return v

    @model_validator(mode="after")
    def _consistent(self) -> SplitConfig:
        fractions = [p for p in (self.train, self.valid, self.test) if isinstance(p, float)]
        if len(fractions) not in (0, 3):
            raise ValueError("use fractions for all three splits, or date ranges for all three")
        if any(not p > 0 for p in fractions):  # NaN too
            raise ValueError("split fractions must be > 0")
        if sum(fractions) > 1.0 + 1e-9:  # a fraction left out is its default: say so
            parts = [f"{k} {getattr(self, k):g}{'' if k in self.model_fields_set else ' (default)'}"
                     for k in ("train", "valid", "test")]
            raise ValueError(f"split fractions {' + '.join(parts)} add up to {sum(fractions):g}, more than 1")
        return self


class DataConfig(Section):
    path: str | None = None
    synthetic: SyntheticConfig | None = None
    date_col: str = "date"
    asset_col: str = "asset"
    label: str = "label"
    features: list[str] | None = None
    exclude: list[str] = Field(default_factory=list)
    # a column of groups (e.g. sector): IC is also reported demeaned within each group per date
    group_col: str | None = None
    max_feature_label_corr: float = Field(0.3, gt=0, le=1)
    lookback: int = Field(20, ge=1)
    horizon: int = Field(2, ge=0)  # >= 1 at the edge (_spans_a_date)
    embargo: int = Field(0, ge=0)
    feature_norm: Literal["cs_zscore", "cs_rank", "robust_zscore", "none"] = "cs_zscore"
    label_norm: Literal["cs_rank", "cs_zscore", "none"] = "cs_rank"
    split: SplitConfig = Field(default_factory=SplitConfig)
    device_share: float = Field(0.5, gt=0, le=1)
    # the panel cache (docs/data.md): arrays built once per host, mapped read-only by every worker
    cache: bool = True
    cache_dir: str | None = None        # null: $SWEEPER_CACHE_DIR, else $XDG_CACHE_HOME/sweeper/panels
    cache_max_gb: float = Field(50.0, ge=0)

    @field_validator("horizon")
    @classmethod
    def _spans_a_date(cls, v: int, info: ValidationInfo) -> int:
        if v < 1 and info.context:
            raise ValueError("must be >= 1: a forward return spans a date (0 purges nothing between splits)")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> DataConfig:
        if self.path is None and self.synthetic is None:
            raise ValueError("set data.path to a Parquet file, or data.synthetic for the built-in panel")
        if self.path is not None and self.synthetic is not None:
            raise ValueError("set data.synthetic: null to use data.path (both are set)")
        roles = {k: getattr(self, k) for k in ("date_col", "asset_col", "label", "group_col")}
        if twice := [k for k, v in roles.items() if v is not None and list(roles.values()).count(v) > 1]:
            raise ValueError(f"{twice[0]} and {twice[1]} both name the column '{roles[twice[0]]}'; one each")
        return self


class ModelConfig(Section, extra="allow"):
    """Built-in models take the named fields; a ``package.module:Class`` model
    takes every key the user set except ``name`` as constructor kwargs."""

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
    def _known(self) -> ModelConfig:
        if ":" in self.name:
            return self
        if self.name not in BUILTIN_MODELS:
            raise ValueError(unknown_model(self.name))
        if extra := sorted(self.model_extra or {}):
            raise ValueError(unknown_key(f"model.{extra[0]}", extra[0], type(self).model_fields, "model."))
        if self.name == "transformer" and self.d_model % self.nhead:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by nhead ({self.nhead})")
        return self

    @property
    def is_custom(self) -> bool:
        return ":" in self.name

    def custom_kwargs(self) -> dict[str, Any]:
        keys = (self.model_fields_set | set(self.model_extra or {})) - {"name"}
        return {k: getattr(self, k) for k in sorted(keys)}

    def section(self) -> dict[str, Any]:
        """The section as stored and checked: a custom model's kwargs are what the user wrote."""
        return {"name": self.name, **self.custom_kwargs()} if self.is_custom else self.model_dump(mode="json")


EVAL_BATCH_START = 16384  # train.eval_batch_size: auto where nothing measured it (a GPU's probe starts here)
ENSEMBLE_METRICS = ("val_ic", "val_rank_ic", "val_icir")  # what validation.aggregate: ensemble can score


class TrainConfig(Section):
    epochs: int = Field(20, ge=1)
    batch_size: int | Literal["auto"] = 1024
    max_batch_size: int = Field(65536, ge=1)
    min_micro_batch: int = Field(8, ge=1)
    samples_per_epoch: int | None = Field(None, ge=1)
    # rows per evaluation forward; auto: on a GPU the probe's start (EVAL_BATCH_START, sized down to the
    # free memory), on a CPU the fastest size measured for the model (sweeper.core.eval_batch)
    eval_batch_size: int | Literal["auto"] = "auto"
    lr: float = Field(1e-3, gt=0, allow_inf_nan=False)  # .inf passed gt=0: every trial NaN
    weight_decay: float = Field(0.01, ge=0, allow_inf_nan=False)
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
    # a trial's runs (folds x seeds) train as stacks of at most this many members (1: one by one);
    # auto: the size measured on the device for the study's first trial, kept with the study
    max_stack: int | Literal["auto"] = "auto"

    _positive = field_validator("batch_size", "max_stack", "eval_batch_size")(_one_or_auto)

    @property
    def resolved_eval_batch_size(self) -> int:
        return EVAL_BATCH_START if self.eval_batch_size == "auto" else self.eval_batch_size

    @property
    def resolved_batch_order(self) -> str:
        return (self.batch_order if self.batch_order != "auto"
                else "cross_section" if self.loss == "ic" else "random")


class DevicesConfig(Section):
    gpus: Literal["auto", "none"] | list[int | str] = "auto"
    # auto: trials packed on each GPU by their measured memory (sweeper.devices.room)
    trials_per_gpu: Literal["auto"] | int = 1
    # auto only: the share of each GPU's memory that packing leaves free
    memory_margin: float = Field(0.1, ge=0, lt=1)
    max_trials_per_gpu: int | None = Field(None, ge=1)  # auto only: at most this many (default 8)
    # auto only: add no trial to a GPU this busy (NVML utilisation, %)
    max_gpu_util: float | None = Field(None, gt=0, le=100)
    skip_busy: bool = False
    busy_memory_mb: int = Field(1024, ge=0)
    cpu_workers: Literal["auto"] | int = "auto"

    _workers = field_validator("cpu_workers", "trials_per_gpu")(_one_or_auto)


class ReportConfig(Section):
    """What ``sweeper best`` and ``sweeper report`` show beyond the IC."""

    quantiles: int = Field(5, ge=2)
    # the baseline sweeper run computes once per study (docs/baseline.md); null: none
    baseline: Literal["lightgbm"] | None = "lightgbm"


class SweeperConfig(Section):
    study: StudyConfig = Field(default_factory=StudyConfig)
    data: DataConfig
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    devices: DevicesConfig = Field(default_factory=DevicesConfig)
    search_space: dict[str, ParamSpec] = Field(default_factory=dict)
    report: ReportConfig = Field(default_factory=ReportConfig)
    baseline: BaselineConfig = Field(default_factory=BaselineConfig)
    validation: ValidationConfig = Field(default_factory=ValidationConfig)

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> SweeperConfig:
        # the standard error that lcb and the Terminator read needs two scores per trial
        for key, on in (("validation.aggregate: lcb", self.validation.aggregate == "lcb"),
                        ("study.stop_when_converged: true", self.study.stop_when_converged)):
            if on and self.validation.runs < 2:
                raise ValueError(f"{key} needs at least two scores per trial: set "
                                 "validation.scheme: walk_forward, or validation.repeats >= 2")
        # a seed ensemble is scored by the IC of its mean prediction: a loss has no ensemble figure
        if self.validation.aggregate == "ensemble" and self.study.metric not in ENSEMBLE_METRICS:
            raise ValueError(f"validation.aggregate: ensemble scores the seed ensemble's "
                             f"{', '.join(ENSEMBLE_METRICS)}; study.metric is {self.study.metric!r}")
        for key, spec in self.search_space.items():  # every key names a field of a tunable section
            check_space_key(self, key, "search_space")
            if info.context:
                check_space_values(self, key, spec, info.context)
            for cond in (spec.when or {}):
                check_space_key(self, cond, f"search_space.{key}.when")
        return self

    @model_validator(mode="after")
    def _pin_split(self) -> SweeperConfig:
        # trials that sample another lookback, horizon or embargo must still be scored on the
        # same valid and test dates: the split takes the widest values any trial can have.
        # The result is part of the config, so it travels to the workers and into every trial.
        split = self.data.split
        widest = {key: max([getattr(split, key) or 0, getattr(self.data, key),
                            *space_highs(self.search_space.get(f"data.{key}"))])
                  for key in ("lookback", "horizon", "embargo")}
        if any(getattr(split, key) != value for key, value in widest.items()):
            self.data = self.data.model_copy(update={"split": split.model_copy(update=widest)})
        return self

    def with_train(self, **changes: Any) -> SweeperConfig:
        """This config with ``changes`` to its ``train`` section (not validated again: the code pins them)."""
        return self.model_copy(update={"train": self.train.model_copy(update=changes)})


# ---------------------------------------------------------------- helpers
def unknown_model(name: str) -> str:
    """What a model name that is neither a built-in nor ``module:Class`` is told (config, search space)."""
    close = difflib.get_close_matches(name.lower(), BUILTIN_MODELS, n=1, cutoff=0.6)
    return (f"unknown model {name!r}: expected one of {', '.join(BUILTIN_MODELS)} or a dotted path "
            "'package.module:Class'" + (f"; did you mean {close[0]!r}?" if close else ""))
