from __future__ import annotations

import pytest
import yaml

from sweeper import config as C
from sweeper.errors import ConfigError

BASE = {"data": {"synthetic": {"assets": 20, "dates": 200, "features": 4}}}


def _err(raw: dict) -> str:
    with pytest.raises(ConfigError) as exc:
        C.validate_config(raw, "s.yaml", edge=True)  # as a study file is read
    return str(exc.value)


def _with(**sections) -> dict:
    return {**BASE, **sections}


def test_defaults_validate():
    cfg = C.validate_config(BASE, "s.yaml")
    assert cfg.study.resolved_storage == "sqlite:///runs/sweep/study.db"
    assert cfg.study.resolved_direction == "maximize"
    assert cfg.train.resolved_batch_order == "random"


@pytest.mark.parametrize("pruner", ["median", "percentile", "asha", "hyperband", "wilcoxon"])
def test_gp_is_refused_beside_any_pruner_and_taken_without_one(pruner):
    """Optuna's GPSampler never sees a pruned trial: with a pruner it proposes the pruned config again."""
    gp = {"name": "gp", "seed": 3}
    assert _err(_with(study={"sampler": gp, "pruner": {"name": pruner}})) == (
        f"s.yaml: study: sampler gp learns from complete trials only: with pruner {pruner} it keeps "
        "proposing pruned configs; set pruner: {name: none}, or use tpe")
    cfg = C.validate_config(_with(study={"sampler": gp, "pruner": {"name": "none"}}), "s.yaml")
    assert (cfg.study.sampler.name, cfg.study.sampler.seed, cfg.study.pruner.name) == ("gp", 3, "none")


def test_direction_follows_metric():
    cfg = C.validate_config(_with(study={"metric": "val_loss"}), "s.yaml")
    assert cfg.study.resolved_direction == "minimize"
    same = C.validate_config(_with(study={"metric": "val_loss", "direction": "minimize"}), "s.yaml")
    assert same.study.resolved_direction == "minimize"


@pytest.mark.parametrize("metric, direction, natural", [("val_loss", "maximize", "minimized"),
                                                        ("val_ic", "minimize", "maximized")])
def test_a_direction_against_the_metric_is_refused(metric, direction, natural):
    with pytest.raises(ConfigError) as err:
        C.validate_config(_with(study={"metric": metric, "direction": direction}), "s.yaml", edge=True)
    assert str(err.value) == (f"s.yaml: study: direction {direction} with metric {metric} picks the worst "
                              f"trial as the best: {metric} is {natural}; leave direction out")
    # at the edge only: a study (and its trials' config.yaml) stored by an earlier version still reads
    stored = C.validate_config(_with(study={"metric": metric, "direction": direction}), "config.yaml")
    assert stored.study.resolved_direction == direction


@pytest.mark.parametrize("raw, expected", [
    (_with(train={"epocs": 3}), "s.yaml: unknown key 'train.epocs'; did you mean 'train.epochs'?"),
    (_with(studdy={}), "s.yaml: unknown key 'studdy'; did you mean 'study'?"),
    (_with(model={"name": "lstm", "hiden_size": 3}), "s.yaml: unknown key 'model.hiden_size'; did you mean 'model.hidden_size'?"),
    (_with(search_space={"train.lx": {"type": "float", "low": 0, "high": 1}}),
     "s.yaml: search_space: unknown key 'train.lx'; did you mean 'train.lr'?"),
])
def test_unknown_keys_suggest_closest(raw, expected):
    assert _err(raw) == expected


@pytest.mark.parametrize("raw, fragment", [
    (_with(train={"epochs": "abc"}), "train.epochs: Input should be a valid integer"),
    (_with(search_space={"train.lr": {"type": "float", "low": 2, "high": 1}}), "search_space.train.lr: low (2) > high (1)"),
    (_with(search_space={"train.lr": {"type": "float", "low": 0, "high": 1, "log": True}}),
     "search_space.train.lr: log scale needs low > 0 (got 0)"),
    (_with(search_space={"model.d_model": {"type": "categorical", "choices": []}}),
     "search_space.model.d_model: categorical parameter needs a non-empty 'choices' list"),
    (_with(study={"sampler": {"name": "tpee"}}), "study.sampler.name: Input should be 'tpe'"),
    (_with(study={"pruner": {"name": "sometimes"}}), "study.pruner.name: Input should be 'median'"),
    (_with(model={"name": "transformr"}), "unknown model 'transformr'"),
    (_with(model={"name": "transformer", "d_model": 30, "nhead": 4}), "d_model (30) must be divisible by nhead (4)"),
    ({"data": {}}, "set data.path to a Parquet file, or data.synthetic"),
    ({"data": {"synthetic": {}, "path": "x.parquet"}}, "set data.synthetic: null to use data.path"),
    (_with(study={"name": "../evil"}), "study.name: must be a non-empty name"),
    # it said "add up to 1.1" where the user wrote 0.9: the test split's default was added unsaid
    (_with(data={**BASE["data"], "split": {"train": 0.7, "valid": 0.2}}),
     "data.split: split fractions train 0.7 + valid 0.2 + test 0.2 (default) add up to 1.1, more than 1"),
    (_with(data={**BASE["data"], "split": {"train": 0.6, "valid": float("nan"), "test": 0.2}}),  # a traceback
     "data.split: split fractions must be > 0"),
])
def test_bad_values_name_the_key(raw, fragment):
    message = _err(raw)
    assert message.startswith("s.yaml: ")
    assert fragment in message


@pytest.mark.parametrize("space, expected", [
    # every trial drawing these was pruned as a config the model refuses: a quarter of the study, or all of it
    ({"train.epochs": {"type": "int", "low": 0, "high": 3}},
     "search_space.train.epochs: low 0 is not a value train.epochs takes: Input should be greater than or equal to 1"),
    ({"train.loss": {"type": "categorical", "choices": ["mse", "ic_loss"]}},
     "search_space.train.loss: choice 'ic_loss' is not a value train.loss takes: Input should be 'mse' or 'ic'"),
    ({"train.max_stack": {"type": "categorical", "choices": ["auto", 0]}},  # a field validator's refusal
     "search_space.train.max_stack: choice 0 is not a value train.max_stack takes: must be >= 1 or 'auto'"),
    ({"model.dropout": {"type": "float", "low": 0.1, "high": 1.5}},
     "search_space.model.dropout: high 1.5 is not a value model.dropout takes: Input should be less than 1"),
    ({"data.horizon": {"type": "int", "low": 0, "high": 3}},  # 0 would purge nothing between the splits
     "search_space.data.horizon: low 0 is not a value data.horizon takes: must be >= 1: a forward return spans a "
     "date (0 purges nothing between splits)"),
    ({"train.epochs": {"type": "float", "low": 1, "high": 10}},  # every draw but the bounds was pruned
     "search_space.train.epochs: draw 4.437694 is not a value train.epochs takes: Input should be a valid integer, got "
     "a number with a fractional part"),
    # a condition the study's fixed values never meet: every trial trained the file's lr, without a word
    ({"train.lr": {"type": "float", "low": 1e-3, "high": 1e-2, "when": {"model.name": "lstm"}}},
     "search_space.train.lr.when: model.name is 'transformer' in this study and not searched, so train.lr is never "
     "drawn"),
    # a value its searched key never takes (a typo, a choice or a number out of its bounds): validate said ok
    ({"model.name": {"type": "categorical", "choices": ["mlp", "lstm"]},
      "train.lr": {"type": "float", "low": 1e-3, "high": 1e-2, "when": {"model.name": "lstmm"}}},
     "search_space.train.lr.when: model.name never takes 'lstmm' in its search space, so train.lr is never drawn"),
    ({"train.epochs": {"type": "int", "low": 1, "high": 3},
      "train.lr": {"type": "float", "low": 1e-3, "high": 1e-2, "when": {"train.epochs": [5, 8]}}},
     "search_space.train.lr.when: train.epochs never takes [5, 8] in its search space, so train.lr is never drawn"),
    ({"model.dropout": {"type": "float", "low": 0, "high": 0.3, "step": float("inf")}},  # a traceback at the draw
     "search_space.model.dropout.step: Input should be a finite number (got inf)"),
])
def test_a_search_space_value_its_key_refuses_is_refused_naming_both(space, expected):
    assert _err(_with(search_space=space)) == f"s.yaml: {expected}"


def test_a_search_space_is_not_refused_for_a_rule_that_other_draws_can_meet():
    # nhead 3 fits another d_model; only the trial that draws d_model 32 with it is pruned
    cfg = C.validate_config(_with(model={"name": "transformer", "d_model": 32, "nhead": 4}, search_space={
        "model.nhead": {"type": "categorical", "choices": [2, 3, 4]},
        "model.d_model": {"type": "categorical", "choices": [24, 32]}}), "s.yaml")
    assert list(cfg.search_space) == ["model.nhead", "model.d_model"]
    assert _err(_with(data={**BASE["data"], "horizon": 0})) == (
        "s.yaml: data.horizon: must be >= 1: a forward return spans a date (0 purges nothing between splits) (got 0)")


def test_a_stored_config_is_not_judged_again_by_the_study_files_rules():
    # a trial's config.yaml keeps the search space it was drawn from: a study made before a rule (a dropout
    # range up to 1.0, a horizon of 0) must still load in predict, report and refit
    raw = _with(data={**BASE["data"], "horizon": 0},
                search_space={"model.dropout": {"type": "float", "low": 0.0, "high": 1.0}})
    stored = C.to_dict(C.validate_config(raw, "config.yaml"))  # as a trial's config.yaml holds it
    assert (stored["data"]["horizon"], stored["data"]["split"]["horizon"]) == (0, 0)
    assert C.validate_config(stored, "config.yaml").data.split.horizon == 0  # the pinned split's too
    assert _err(raw).startswith("s.yaml: data.horizon: must be >= 1")
    custom = _with(model={"name": "pkg.m:Net"}, search_space={"model.positional": {
        "type": "categorical", "choices": ["rope", "learned"]}, "model.depth": {"type": "int", "low": 0, "high": 3}})
    # a built-in model field keeps its values under a custom model too (each trial checks them); its own
    # keywords (depth) are its constructor's to judge
    assert _err(custom) == ("s.yaml: search_space.model.positional: choice 'rope' is not a value model.positional "
                            "takes: Input should be 'learned' or 'sinusoidal'")


def test_yaml_syntax_error_gives_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("study:\n  name: x\n  n_trials: [1, 2\ndata: {}\n")
    with pytest.raises(ConfigError) as exc:
        C.load_config(path)
    assert str(exc.value).startswith(f"{path}: line ")
    assert "YAML syntax error" in str(exc.value)


def test_missing_study_file(tmp_path):
    with pytest.raises(ConfigError, match="study file not found"):
        C.load_config(tmp_path / "nope.yaml")


def test_sets_are_type_checked(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("data:\n  synthetic: {assets: 20, dates: 200, features: 4}\n")
    cfg = C.load_config(path, ["train.lr=3e-4", "model.name=lstm", "train.batch_size=auto"])
    assert (cfg.train.lr, cfg.model.name, cfg.train.batch_size) == (3e-4, "lstm", "auto")
    with pytest.raises(ConfigError, match=r"train.epochs: Input should be a valid integer.*got 'two'"):
        C.load_config(path, ["train.epochs=two"])
    with pytest.raises(ConfigError, match="expected key=value"):
        C.load_config(path, ["train.epochs"])


@pytest.mark.parametrize("override, message", [
    ("train.epochs=true", "train.epochs: expected a number (got True)"),
    ("train.lr=true", "train.lr: expected a number (got True)"),
    ("train.lr=false", "train.lr: Input should be greater than 0 (got False)"),  # its bound speaks first
    ("study.sampler.seed=false", "study.sampler.seed: expected a number (got False)"),
    ("validation.repeats=yes", "validation.repeats: expected a number (got True)"),
    ("model.hidden_size=true", "model.hidden_size: expected a number (got True)"),
    ("baseline.lags=true", "baseline.lags: expected a number (got True)"),  # config.long_sweeps' sections
    ("search_space.train.lr.low=true", "search_space.train.lr.low: expected a number (got True)"),
])
def test_true_or_false_is_never_read_as_a_number(tmp_path, override, message):
    """pydantic's lax mode reads True as 1: ``--set train.epochs=true`` would train one epoch unsaid."""
    path = tmp_path / "s.yaml"
    path.write_text("data:\n  synthetic: {assets: 20, dates: 200, features: 4}\n"
                    "search_space:\n  train.lr: {type: float, low: 0.001, high: 0.01}\n")
    with pytest.raises(ConfigError) as exc:
        C.load_config(path, [override])
    assert str(exc.value) == f"{path} with --set {override}: {message}"
    with pytest.raises(ConfigError) as exc:  # a --set's mistake was put to the study file's account
        C.load_config(path, ["train.epocs=3", "train.lr=0.01"])
    assert str(exc.value) == (f"{path} with --set train.epocs=3 train.lr=0.01: unknown key 'train.epocs'; "
                              "did you mean 'train.epochs'?")


@pytest.mark.parametrize("override", ["train.lr=.inf", "train.weight_decay=.nan", "train.weight_decay=.inf",
                                      "search_space.train.lr.high=.inf"])
def test_an_infinite_or_nan_number_is_refused_where_it_trains_nothing(tmp_path, override):
    # train.lr: .inf passed its gt=0 bound, and every trial trained to NaN; elsewhere .inf is "no limit"
    path = tmp_path / "s.yaml"
    path.write_text("data:\n  synthetic: {assets: 20, dates: 200, features: 4}\n"
                    "search_space:\n  train.lr: {type: float, low: 0.001, high: 0.01}\n")
    with pytest.raises(ConfigError) as exc:
        C.load_config(path, [override])
    key, value = override.split("=")
    assert str(exc.value) == (f"{path} with --set {override}: {key}: Input should be a finite number "
                              f"(got {float(value.strip('.'))})")
    cfg = C.load_config(path, ["study.storage_outage_s=.inf", "data.cache_max_gb=.inf", "train.grad_clip=.inf"])
    assert cfg.study.storage_outage_s == cfg.data.cache_max_gb == cfg.train.grad_clip == float("inf")


def test_a_yes_in_the_study_file_is_no_number_and_true_or_false_still_sets_a_flag(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("data:\n  synthetic: {assets: 20, dates: 200, features: 4}\ntrain:\n  epochs: yes\n")
    with pytest.raises(ConfigError) as exc:
        C.load_config(path)
    assert str(exc.value) == f"{path}: train.epochs: expected a number (got True)"
    flags = C.load_config(path, ["train.epochs=3", "model.gradient_checkpointing=true",
                                 "study.retry_timeouts=yes"])
    assert flags.train.epochs == 3 and flags.model.gradient_checkpointing is True
    assert flags.study.retry_timeouts is True


def test_sets_reach_a_search_space_param_by_its_dotted_name(tmp_path):
    """search_space is keyed by dotted names: --set search_space.train.lr.high sets train.lr's high (it
    used to make a param "train" and fail with "search_space.train.type: Field required")."""
    path = tmp_path / "s.yaml"
    path.write_text("data:\n  synthetic: {assets: 20, dates: 200, features: 4}\n"
                    "search_space:\n  train.lr: {type: float, low: 0.001, high: 0.01, log: true}\n")
    cfg = C.load_config(path, ["search_space.train.lr.high=0.1", "search_space.model.dropout={type: float, "
                               "low: 0.0, high: 0.3}", "search_space.train.lr.log=false"])
    assert cfg.search_space["train.lr"].model_dump(exclude_none=True) == {
        "type": "float", "low": 0.001, "high": 0.1, "log": False}
    assert cfg.search_space["model.dropout"].high == 0.3
    with pytest.raises(ConfigError, match=r"search_space.train.lr: low \(0.001\) > high \(0.0001\)"):
        C.load_config(path, ["search_space.train.lr.high=0.0001"])


def test_a_set_mapping_sets_its_keys_and_keeps_the_sections_others(tmp_path):
    """--set 'train={lr: 0.01}' replaced the file's whole train section, its other keys back at their
    defaults (20 epochs at batch 1,024 where the file said 2 at 256), without a word."""
    path = tmp_path / "s.yaml"
    path.write_text("data:\n  synthetic: {assets: 20, dates: 200, features: 4}\n  split: {train: 0.5}\n"
                    "train: {epochs: 2, batch_size: 256}\n"
                    "search_space:\n  train.lr: {type: float, low: 0.001, high: 0.01, log: true}\n")
    cfg = C.load_config(path, ["train={lr: 0.01}", "data={split: {valid: 0.3}}",
                               "search_space.train.lr={type: categorical, choices: [0.001, 0.01]}"])
    assert (cfg.train.lr, cfg.train.epochs, cfg.train.batch_size) == (0.01, 2, 256)
    assert (cfg.data.split.train, cfg.data.split.valid, cfg.data.synthetic.assets) == (0.5, 0.3, 20)
    # a search-space parameter's mapping is its whole spec: a float's bounds do not stay beside choices
    assert cfg.search_space["train.lr"].model_dump(exclude_none=True) == {
        "type": "categorical", "log": False, "choices": [0.001, 0.01]}
    # a mapping that names a model (or sampler, pruner) is that one's whole section: a custom model is
    # not handed the built-in's keywords; options are whole too, and {} is the section's defaults
    path.write_text(path.read_text() + "model: {name: mlp, hidden_size: 8}\n"
                    "study: {sampler: {name: tpe, options: {multivariate: true, n_startup_trials: 5}}}\n")
    cfg = C.load_config(path, ["model={name: pkg.m:Net, width: 7}", "study.sampler.options={n_startup_trials: 2}",
                               "train={}", "study={name: other, n_trials: 7}"])
    assert (cfg.model.custom_kwargs(), cfg.study.sampler.options) == ({"width": 7}, {"n_startup_trials": 2})
    assert (cfg.study.name, cfg.study.n_trials, cfg.study.sampler.name) == ("other", 7, "tpe")  # a study's name
    assert (cfg.train.epochs, cfg.train.batch_size) == (C.TrainConfig().epochs, C.TrainConfig().batch_size)


def test_custom_model_kwargs_are_the_rest_of_the_section():
    cfg = C.validate_config(_with(model={"name": "pkg.mod:Net", "width": 7, "dropout": 0.2}), "s.yaml")
    assert cfg.model.custom_kwargs() == {"dropout": 0.2, "width": 7}
    again = C.with_overrides(cfg, {"model.width": 9}, "trial 0")
    assert again.model.custom_kwargs() == {"dropout": 0.2, "width": 9}
    assert C.to_dict(again)["model"] == {"name": "pkg.mod:Net", "dropout": 0.2, "width": 9}


def test_overrides_revalidate_and_hash_changes():
    cfg = C.validate_config(BASE, "s.yaml")
    other = C.with_overrides(cfg, {"train.lr": 0.01}, "trial 3")
    assert other.train.lr == 0.01 and cfg.train.lr == 1e-3
    assert C.config_hash(other) != C.config_hash(cfg)
    assert C.config_hash(C.validate_config(BASE, "again")) == C.config_hash(cfg)
    with pytest.raises(ConfigError, match="trial 3: train.lr"):
        C.with_overrides(cfg, {"train.lr": -1}, "trial 3")


def test_flatten_and_config_value():
    cfg = C.validate_config(_with(model={"name": "gru", "hidden_size": 12}), "s.yaml")
    flat = C.flatten(C.to_dict(cfg))
    assert flat["model.hidden_size"] == 12 and flat["data.synthetic.assets"] == 20
    assert C.config_value(cfg, "model.name") == "gru"
    with pytest.raises(KeyError):
        C.config_value(cfg, "model.nope")


def test_unquoted_yaml_dates_in_split_ranges(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("data:\n  synthetic: {assets: 20, dates: 200, features: 4}\n  split:\n"
                    "    train: [2015-01-01, 2018-12-31]\n    valid: [2019-01-10, 2019-12-31]\n"
                    "    test: [2020-01-10, 2020-12-31]\n")
    cfg = C.load_config(path)
    assert cfg.data.split.train == ("2015-01-01", "2018-12-31")
    assert cfg.data.split.test == ("2020-01-10", "2020-12-31")


def test_a_day_that_is_no_day_reaches_the_split_as_its_text(tmp_path):
    """2012-13-01 looks like a day to YAML, whose constructor then raised ValueError out of the loader:
    a traceback and exit 1 for the study file and for --set alike. It is its text now, which the split
    refuses naming its key (tests/test_data_split.py)."""
    path = tmp_path / "s.yaml"
    path.write_text("data:\n  synthetic: {assets: 20, dates: 200, features: 4}\n  split:\n"
                    "    train: [2015-01-01, 2018-12-31]\n    valid: [2019-13-01, 2019-12-31]\n"
                    "    test: [2020-01-10, 2020-02-30]\n")
    split = C.load_config(path).data.split
    assert (split.valid, split.test) == (("2019-13-01", "2019-12-31"), ("2020-01-10", "2020-02-30"))
    cfg = C.load_config(path, ["data.split.valid=[2019-01-10, 2019-12-32]"])
    assert cfg.data.split.valid == ("2019-01-10", "2019-12-32")


@pytest.mark.parametrize("valid, shown", [("[2019-01-10]", "[2019-01-10]"), ("[]", "[]"),
                                          ("[0.1, 0.2, 0.3]", "[0.1, 0.2, 0.3]")])
def test_a_split_range_of_other_than_two_bounds_says_what_is_expected(tmp_path, valid, shown):
    """It was pydantic's union message: 'data.split.valid.float: Input should be a valid number'."""
    path = tmp_path / "s.yaml"
    path.write_text("data:\n  synthetic: {assets: 20, dates: 200, features: 4}\n")
    with pytest.raises(ConfigError) as exc:
        C.load_config(path, [f"data.split.valid={valid}"])
    assert str(exc.value) == (f"{path} with --set data.split.valid={valid}: data.split.valid: expected a "
                              f"fraction (0.2) or a [start, end] date range, got {shown}")


def test_yaml_merge_keys_take_an_anchors_keys(tmp_path):
    """``<<: *lr`` was refused as a YAML syntax error ("could not determine a constructor for the tag
    'tag:yaml.org,2002:merge'"): the loader that refuses a key given twice built the merge key itself."""
    path = tmp_path / "s.yaml"
    path.write_text("data:\n  synthetic: {assets: 20, dates: 200, features: 4}\nsearch_space:\n"
                    "  train.lr: &lr {type: float, low: 0.0001, high: 0.01, log: true}\n"
                    "  train.weight_decay:\n    <<: *lr\n    low: 0.00001\n")
    space = C.load_config(path).search_space
    assert (space["train.weight_decay"].low, space["train.weight_decay"].high) == (0.00001, 0.01)
    assert space["train.weight_decay"].log and space["train.lr"].low == 0.0001
    path.write_text(path.read_text() + "    low: 0.001\n")
    with pytest.raises(ConfigError, match="the key 'low' is given twice"):
        C.load_config(path)


def test_a_key_given_twice_in_a_set_value_is_refused(tmp_path):
    """It became the value's text, refused as 'Input should be a valid dictionary' or taken as a name."""
    path = tmp_path / "s.yaml"
    path.write_text("data:\n  synthetic: {assets: 20, dates: 200, features: 4}\n")
    with pytest.raises(ConfigError) as exc:
        C.load_config(path, ["model.name={a: 1, a: 2}"])
    assert str(exc.value) == "--set 'model.name={a: 1, a: 2}': the key 'a' is given twice (the second would replace the first)"


def test_an_explicit_tag_the_value_is_not_is_one_line_with_its_place(tmp_path):
    """``epochs: !!int two`` raised int()'s ValueError out of the loader: a traceback and exit 1."""
    path = tmp_path / "s.yaml"
    path.write_text("data:\n  synthetic: {assets: 20, dates: 200, features: 4}\ntrain:\n  epochs: !!int two\n")
    with pytest.raises(ConfigError) as exc:
        C.load_config(path)
    assert str(exc.value) == (f"{path}: line 4, column 11: YAML syntax error: int 'two': invalid literal for "
                              "int() with base 10: 'two'")
    path.write_text("data:\n  synthetic: {assets: 20, dates: 200, features: 4}\n")
    with pytest.raises(ConfigError, match=r"^--set 'train.epochs=!!int two': int 'two': invalid literal"):
        C.load_config(path, ["train.epochs=!!int two"])
    with pytest.raises(ConfigError, match=r"train.epochs: Input should be a valid integer.*\(got 'x'\)"):
        C.load_config(path, ["train.epochs=!!timestamp x"])  # no day: its text


def test_yyyymmdd_numbers_in_split_ranges(tmp_path):
    """The date column may hold YYYYMMDD integers; the same form in the split was a 'valid number' error."""
    path = tmp_path / "s.yaml"
    path.write_text("data:\n  synthetic: {assets: 20, dates: 200, features: 4}\n  split:\n"
                    "    train: [20150101, 20181231]\n    valid: [2019-01-10, 20191231]\n"
                    "    test: [20200110, 20201231]\n")
    split = C.load_config(path).data.split
    assert (split.train, split.valid, split.test) == (("20150101", "20181231"), ("2019-01-10", "20191231"),
                                                      ("20200110", "20201231"))


@pytest.mark.parametrize("roles,both", [
    ({"asset_col": "label"}, "asset_col and label both name the column 'label'"),
    ({"label": "date"}, "date_col and label both name the column 'date'"),
    ({"group_col": "asset"}, "asset_col and group_col both name the column 'asset'"),
    ({"date_col": "d", "asset_col": "d"}, "date_col and asset_col both name the column 'd'"),
])
def test_one_column_in_two_roles_is_refused(roles, both):
    """``asset_col: label`` trained on thousands of one-date 'assets' with an IC of .21, without a word."""
    assert _err({"data": {"path": "p.parquet", **roles}}) == f"s.yaml: data: {both}; one each"


def test_keys_added_by_a_newer_version_are_not_drift_at_their_defaults():
    from sweeper.config import drift, to_dict

    current = to_dict(C.validate_config({"data": {"synthetic": {"assets": 8, "dates": 50}}}, "s.yaml"))
    older = {k: dict(v) if isinstance(v, dict) else v for k, v in current.items()}
    older["train"] = {k: v for k, v in current["train"].items() if k != "max_minutes"}  # a key it did not have
    assert drift(older, current) == []
    tuned = to_dict(C.validate_config({"data": {"synthetic": {"assets": 8, "dates": 50}},
                                     "train": {"max_minutes": 5}}, "s.yaml"))
    assert drift(older, tuned) == ["train.max_minutes (None -> 5.0)"]


def test_a_search_space_param_removed_or_added_is_one_line_of_drift():
    from sweeper.config import drift, to_dict

    base = {"data": {"synthetic": {"assets": 8, "dates": 50}}, "search_space": {
        "train.lr": {"type": "float", "low": 1e-3, "high": 1e-2, "log": True},
        "train.weight_decay": {"type": "float", "low": 1e-4, "high": 0.05, "log": True}}}
    stored = to_dict(C.validate_config(base, "s.yaml"))
    fewer = to_dict(C.validate_config({**base, "search_space": {
        "train.lr": {"type": "float", "low": 1e-3, "high": 2e-2, "log": True},
        "model.dropout": {"type": "float", "low": 0.0, "high": 0.2}}}, "s.yaml"))
    assert drift(stored, fewer) == ["search_space.model.dropout (added)", "search_space.train.lr.high (0.01 -> 0.02)",
                                    "search_space.train.weight_decay (removed)"]


def test_where_the_panel_is_cached_is_not_drift():
    from sweeper.config import drift, to_dict

    base = {"data": {"synthetic": {"assets": 8, "dates": 50}}}
    stored = to_dict(C.validate_config(base, "s.yaml"))
    moved = to_dict(C.validate_config({"data": {**base["data"], "cache_dir": "/elsewhere", "cache_max_gb": 5,
                                                "device_share": 0.2}}, "s.yaml"))
    assert drift(stored, moved) == []


def test_a_study_from_before_the_validation_section_is_holdout_and_changing_it_is_drift():
    from sweeper.config import drift, to_dict

    base = {"data": {"synthetic": {"assets": 8, "dates": 50}}}
    current = to_dict(C.validate_config(base, "s.yaml"))
    older = {k: v for k, v in current.items() if k != "validation"}  # stored before the section existed
    assert drift(older, current) == []
    walk = to_dict(C.validate_config({**base, "validation": {"scheme": "walk_forward", "folds": 3}}, "s"))
    assert drift(older, walk) == ["validation.folds (4 -> 3)",
                                  "validation.scheme ('holdout' -> 'walk_forward')"]
    repeats = to_dict(C.validate_config({**base, "validation": {"repeats": 2}}, "s.yaml"))
    assert drift(current, repeats) == ["validation.repeats (1 -> 2)"]


def test_a_misspelt_builtin_model_gets_a_did_you_mean(tmp_path, monkeypatch):
    expected = ("unknown model 'transformr': expected one of transformer, lstm, gru, mlp or a dotted path "
                "'package.module:Class'; did you mean 'transformer'?")
    assert _err(_with(model={"name": "transformr"})) == f"s.yaml: model: {expected}"
    assert _err(_with(model={"name": "resnet"})).endswith("or a dotted path 'package.module:Class'")  # none close
    from click.testing import CliRunner

    from sweeper.cli import main

    monkeypatch.chdir(tmp_path)
    space = {"model.name": {"type": "categorical", "choices": ["lstm", "transformr"]}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(_with(search_space=space)))
    result = CliRunner().invoke(main, ["validate", "s.yaml"])
    assert (result.exit_code, result.output) == (2, f"Error: search_space.model.name: {expected}\n")


def _paths(cfg: C.SweeperConfig) -> tuple:
    assert cfg.study.warm_start is not None
    return (cfg.study.resolved_storage, cfg.study.resolved_artifacts, cfg.study.warm_start.storage,
            cfg.data.path, cfg.data.cache_dir)


def test_relative_paths_are_taken_from_the_study_files_folder(tmp_path, monkeypatch):
    (tmp_path / "exp").mkdir()
    (tmp_path / "elsewhere").mkdir()
    raw = {"study": {"name": "t", "storage": "sqlite:///my.db", "warm_start": {"study": "o", "storage":
                                                                              "sqlite:///w.db"}},
           "data": {"path": "d.parquet", "cache_dir": "cache"}}
    (tmp_path / "exp/s.yaml").write_text(yaml.safe_dump(raw))
    data = (f"{tmp_path}/exp/d.parquet", f"{tmp_path}/exp/cache")  # absolute: config.yaml records them
    monkeypatch.chdir(tmp_path)
    assert _paths(C.load_config("exp/s.yaml")) == ("sqlite:///exp/my.db", "exp/runs/t", "sqlite:///exp/w.db", *data)
    cfg = C.load_config("exp/s.yaml", ["study.storage=null", "data.cache_dir=/c"])  # --set: as if in the file
    assert (cfg.study.resolved_storage, cfg.data.cache_dir) == ("sqlite:///exp/runs/t/study.db", "/c")
    assert C.with_overrides(cfg, {"train.lr": 0.01}, "p").study.resolved_storage == "sqlite:///exp/runs/t/study.db"
    monkeypatch.chdir(tmp_path / "exp")
    assert _paths(C.load_config("s.yaml")) == ("sqlite:///my.db", "runs/t", "sqlite:///w.db", *data)
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert _paths(C.load_config(tmp_path / "exp/s.yaml")) == (
        f"sqlite:///{tmp_path}/exp/my.db", f"{tmp_path}/exp/runs/t", f"sqlite:///{tmp_path}/exp/w.db", *data)
    assert C.validate_config(raw, "s").study.resolved_artifacts == "runs/t"  # no study file: the current folder


def test_a_study_made_before_the_anchor_is_used_where_it_is(tmp_path, monkeypatch, capsys):
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp/s.yaml").write_text(yaml.safe_dump({"study": {"name": "t"}, "data": {"path": "d.parquet"}}))
    (tmp_path / "runs/t").mkdir(parents=True)
    (tmp_path / "runs/t/study.db").write_bytes(b"")  # where an older sweeper run from tmp_path put it
    (tmp_path / "d.parquet").write_bytes(b"")  # its data.path found in the current folder first
    monkeypatch.chdir(tmp_path)
    cfg = C.load_config("exp/s.yaml")
    assert (cfg.study.resolved_storage, cfg.data.path) == ("sqlite:///runs/t/study.db", f"{tmp_path}/d.parquet")
    assert capsys.readouterr().err == (
        "sweeper: study 't' is used where an older sweeper put it, relative to the current folder (runs/t); "
        "to keep it beside exp/s.yaml, as a new study is, move runs/t to exp/runs/t while no sweep runs\n")
    (tmp_path / "exp/runs/t").mkdir(parents=True)
    (tmp_path / "exp/runs/t/study.db").write_bytes(b"")  # one beside the study file wins, silently
    assert C.load_config("exp/s.yaml").study.resolved_storage == "sqlite:///exp/runs/t/study.db"
    assert capsys.readouterr().err == ""


def test_another_study_files_study_of_the_same_name_here_is_no_old_study(tmp_path, monkeypatch, capsys):
    """a/s.yaml and b/s.yaml, both study 't' (the default name is one for all): a's sweep, run from a/, put
    its study in a/runs/t; b's file read from a/ took it for an old study of its own (status showed a's
    trials, run refused b's config as drift, and --force added b's trials to a's study)."""
    import json

    from sweeper.store import run_folder

    for x in ("a", "b"):
        (tmp_path / x).mkdir()
        (tmp_path / x / "s.yaml").write_text(yaml.safe_dump({"study": {"name": "t"}, **BASE}))
    run = tmp_path / "a/runs/t"
    run.mkdir(parents=True)
    (run / "study.db").write_bytes(b"")
    run_folder.take(run, "t", "uuid-a", "sqlite:///runs/t/study.db", fresh=True, study_folder=str(tmp_path / "a"))
    assert json.loads((run / "owner.json").read_text())["study_folder"] == str(tmp_path / "a")
    monkeypatch.chdir(tmp_path / "a")
    assert C.load_config("../b/s.yaml").study.resolved_storage == f"sqlite:///{tmp_path}/b/runs/t/study.db"
    assert C.load_config("s.yaml").study.home == str(tmp_path / "a")
    assert capsys.readouterr().err == ""
    # b's own old study, here since before the rule, once its sweep recorded it: still found here
    run_folder.take(run, "t", "uuid-a", "sqlite:///runs/t/study.db", fresh=False, study_folder=str(tmp_path / "b"))
    assert C.load_config("../b/s.yaml").study.resolved_storage == "sqlite:///runs/t/study.db"
    assert "is used where an older sweeper put it" in capsys.readouterr().err


def test_a_fold_key_without_a_scheme_is_a_scheme_forgotten():
    """validation.folds: 5 with no scheme trained plain holdout, without a word."""
    assert _err(_with(validation={"folds": 5, "window": "rolling"})) == (
        "s.yaml: validation: folds, window: walk-forward keys, which holdout (the default scheme) ignores: set "
        "validation.scheme: walk_forward, or drop them")
    for validation in ({"scheme": "holdout", "folds": 5}, {"scheme": "walk_forward", "folds": 5}):
        C.validate_config(_with(validation=validation), "s.yaml", edge=True)  # said on purpose
    # away from the edge (a stored config, as predict reads it) the rule is not applied
    assert C.validate_config(_with(validation={"folds": 5}), "s.yaml").validation.folds == 5


@pytest.mark.parametrize("sub", ["trials", "logs"])
def test_a_run_folder_whose_trials_or_logs_cannot_be_written_is_refused_before_the_study(tmp_path, sub):
    """runs/<study>/trials made immutable (chattr +i) let the sweep start, and each trial's worker crashed
    at its folder: study.max_consecutive_failures trials burnt, the cause in the slot logs only. A file where
    the folder should be stands in for it here (root writes past permission bits)."""
    from sweeper.store import run_folder

    run = tmp_path / "runs/t"
    run.mkdir(parents=True)
    run_folder.check_writable(run)
    (run / sub).write_text("")
    with pytest.raises(ConfigError) as err:
        run_folder.check_writable(run)
    assert str(err.value) == (f"study.artifacts: the run folder {run} cannot be made or written here "
                              f"({run / sub}: Not a directory)")


@pytest.mark.parametrize("text, got", [("'007'", None), ("007", "7"), ("2024-06-03", "datetime.date(2024, 6, 3)"),
                                       ("1e3", None), ("3.5", "3.5"), ("yes", "True")])
def test_a_name_yaml_reads_as_a_number_or_date_says_to_quote_it(tmp_path, text, got):
    path = tmp_path / "s.yaml"
    path.write_text(f"study: {{name: {text}}}\n" + yaml.safe_dump(BASE))
    if got is None:  # quoted, or text to YAML 1.1 (1e3 without a dot)
        assert C.load_config(path).study.name == text.strip("'")
        return
    with pytest.raises(ConfigError) as err:
        C.load_config(path)
    assert str(err.value) == (f"{path}: study.name: Input should be a valid string (got {got}); YAML read the "
                              "value as a number, date or boolean: quote it")


@pytest.mark.parametrize("spec, message", [
    ({"type": "int", "low": 8, "high": 32, "step": 0.5}, "step (0.5) must be > 0 (an int parameter's at least 1)"),
    ({"type": "float", "low": 0.0, "high": 0.3, "step": 0}, "step (0) must be > 0 (an int parameter's at least 1)"),
    ({"type": "float", "low": 0.0, "high": 0.3, "step": -0.1},
     "step (-0.1) must be > 0 (an int parameter's at least 1)")])
def test_a_step_every_trial_would_crash_on_is_refused_at_the_edge(spec, message):
    # step 0 (and 0.5 on an int, which Optuna takes as int(0.5)) passed validate and crashed every trial
    raw = _with(search_space={"model.dropout" if spec["type"] == "float" else "model.hidden_size": spec})
    with pytest.raises(ConfigError) as err:
        C.validate_config(raw, "s.yaml", edge=True)
    assert str(err.value).endswith(message)
    # a step that does not divide the range is Optuna's warning (it moves high onto the grid): a study made
    # with one still reads, and runs
    uneven = {"type": "float", "low": 0.0, "high": 0.5, "step": 0.2}
    assert C.validate_config(_with(search_space={"model.dropout": uneven}), "s.yaml", edge=True).search_space[
        "model.dropout"].step == 0.2

def test_a_sampler_seed_numpy_refuses_is_refused_by_its_key():
    # seed -1 was Optuna's traceback from validate and run ("Seed must be between 0 and 2**32 - 1")
    with pytest.raises(ConfigError) as err:
        C.validate_config(_with(study={"sampler": {"name": "tpe", "seed": -1}}), "s.yaml")
    assert str(err.value) == "s.yaml: study.sampler.seed: Input should be greater than or equal to 0 (got -1)"


def test_a_study_file_that_is_not_text_is_refused_naming_it(tmp_path):
    """``sweeper run panel.parquet`` (the data for the study file), a Latin-1 file: a traceback in every command."""
    path = tmp_path / "panel.parquet"
    path.write_bytes(b"PAR1\x15\x04\x15\x80\x01")
    with pytest.raises(ConfigError) as err:
        C.load_config(path)
    assert str(err.value) == f"{path}: byte 7 is not UTF-8 text: a study file is YAML"


def test_a_kept_config_hides_the_storage_passwords_and_nothing_else():
    """What the study's attributes, a trial's config.yaml and checkpoints keep: the storage URLs' passwords
    hidden as SQLAlchemy reads them (a '/' in one too), every other value as it is."""
    raw = _with(study={"storage": "postgresql+psycopg://u:pa/ss@db.example:5432/sweeps",
                       "warm_start": {"study": "src", "storage": "postgresql://v:s3:cr@db2/old"}},
                data={**BASE["data"], "path": "https://w:tok@host/panel.parquet", "synthetic": None})
    cfg = C.validate_config(raw, "s.yaml")
    kept, whole = C.to_dict(cfg, kept=True), C.to_dict(cfg)
    assert kept["study"]["storage"] == "postgresql+psycopg://u:***@db.example:5432/sweeps"
    assert kept["study"]["warm_start"]["storage"] == "postgresql://v:***@db2/old"
    assert whole["study"]["storage"] == "postgresql+psycopg://u:pa/ss@db.example:5432/sweeps"  # to connect with
    assert kept["data"] == whole["data"] and kept["model"] == whole["model"]
    assert C.to_dict(C.validate_config(BASE, "s.yaml"), kept=True)["study"]["storage"] is None


def test_a_when_on_a_conditional_key_may_be_met_by_its_fixed_value():
    # in the LSTM's trials hidden_size is not drawn and keeps the file's 64, which draws train.lr
    space = {"model.name": {"type": "categorical", "choices": ["lstm", "mlp"]},
             "model.hidden_size": {"type": "categorical", "choices": [32, 128], "when": {"model.name": "mlp"}},
             "train.lr": {"type": "float", "low": 1e-3, "high": 1e-2, "when": {"model.hidden_size": 64}}}
    cfg = C.validate_config(_with(model={"name": "lstm", "hidden_size": 64}, search_space=space), "s.yaml", edge=True)
    assert list(cfg.search_space) == list(space)
    space["model.hidden_size"].pop("when")  # drawn in every trial: 64 never comes
    assert _err(_with(model={"name": "lstm", "hidden_size": 64}, search_space=space)) == (
        "s.yaml: search_space.train.lr.when: model.hidden_size never takes 64 in its search space, so train.lr "
        "is never drawn")
