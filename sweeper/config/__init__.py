"""The typed study config: YAML -> validated pydantic model, once, at the edge.

- :mod:`~sweeper.config.schema`: the sections and their fields;
- :mod:`~sweeper.config.search_space`: a search-space parameter's spec, and what its keys and values may be;
- :mod:`~sweeper.config.section`: the base of every section (unknown keys, true/false as a number);
- :mod:`~sweeper.config.load`: reading a study file, ``--set`` overrides, error messages;
- :mod:`~sweeper.config.anchor`: the study file's relative paths, taken from its folder;
- :mod:`~sweeper.config.dotted`: dotted names, the JSON form that studies store, the hash;
- :mod:`~sweeper.config.drift`: which keys differ from a stored config;
- :mod:`~sweeper.config.validation`: the ``validation`` section (holdout, walk-forward folds, seeds);
- :mod:`~sweeper.config.long_sweeps`: long sweeps' sections (``study.keep``, the baseline, warm starts)."""

from sweeper.config.dotted import condition_met, config_hash, config_value, flatten, to_dict
from sweeper.config.drift import drift
from sweeper.config.load import load_config, read_yaml, validate_config, with_overrides
from sweeper.config.long_sweeps import BaselineConfig, KeepConfig, WarmStartConfig
from sweeper.config.schema import (
    BUILTIN_MODELS,
    EVAL_BATCH_START,
    DataConfig,
    DevicesConfig,
    ModelConfig,
    ParamSpec,
    PrunerConfig,
    SamplerConfig,
    SplitConfig,
    StudyConfig,
    SweeperConfig,
    SyntheticConfig,
    TrainConfig,
    unknown_model,
)
from sweeper.config.validation import ValidationConfig, objective_label

__all__ = [
    "BUILTIN_MODELS", "EVAL_BATCH_START", "BaselineConfig", "DataConfig", "DevicesConfig", "KeepConfig",
    "ModelConfig", "ParamSpec", "PrunerConfig", "SamplerConfig", "SplitConfig", "StudyConfig",
    "SweeperConfig", "SyntheticConfig", "TrainConfig", "ValidationConfig", "WarmStartConfig", "condition_met",
    "config_hash", "config_value", "drift", "flatten", "load_config", "objective_label", "read_yaml",
    "to_dict", "unknown_model", "validate_config", "with_overrides"]
