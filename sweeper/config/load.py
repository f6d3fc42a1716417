"""Reading a study file: YAML -> overrides -> one validated :class:`SweeperConfig`.

Every problem becomes one :class:`ConfigError` naming the file and the dotted key."""

import copy
import datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from sweeper.config.anchor import anchored
from sweeper.config.dotted import flatten, set_dotted
from sweeper.config.schema import EDGE, SweeperConfig
from sweeper.config.section import unknown_key
from sweeper.errors import ConfigError


def _dotted(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if not (isinstance(p, str) and ("[" in p or p.startswith("function-")))]
    return ".".join(parts)


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model class whose fields live at ``loc`` (for suggestions)."""
    cls: Any = SweeperConfig
    for part in loc:  # (a part below a field that is no model finds no field: None)
        if (field := getattr(cls, "model_fields", {}).get(part)) is None:
            return None
        ann = field.annotation
        cls = next((a for a in getattr(ann, "__args__", (ann,)) if hasattr(a, "model_fields")), None)
    return cls


def _format_error(err: ErrorDetails) -> str:
    loc = tuple(err["loc"])
    key = _dotted(loc)
    if err["type"] == "extra_forbidden":
        prefix = _dotted(loc[:-1])
        fields = getattr(_model_at(loc[:-1]), "model_fields", {})
        return unknown_key(key, str(loc[-1]), fields, prefix + "." if prefix else "")
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    shown = "" if isinstance(got, (dict, list)) or err["type"] == "missing" else f" (got {got!r})"
    if err["type"] == "string_type" and isinstance(got, (int, float, datetime.date)):  # `name: 007` is 7
        shown += "; YAML read the value as a number, date or boolean: quote it"
    return f"{msg}{shown}" if not key or msg.startswith("unknown key") else f"{key}: {msg}{shown}"


def validate_config(raw: dict[str, Any], source: str, edge: bool = False) -> SweeperConfig:
    """Validate a raw mapping; any problem becomes one ConfigError naming ``source``. ``edge``: a study
    file (and its --set), judged by the rules a stored config is not (schema.EDGE)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of sections (study, data, model, ...), "
                          f"got {type(raw).__name__}")
    try:
        return SweeperConfig.model_validate(raw, context=EDGE if edge else None)
    except ValidationError as exc:
        errors = exc.errors()
        more = f" (and {extra} more problem{'s' if extra > 1 else ''})" if (extra := len(errors) - 1) else ""
        raise ConfigError(f"{source}: {_format_error(errors[0])}{more}") from None


class _UniqueKeys(yaml.SafeLoader):
    """YAML's loaders let a repeated key replace the first (a second ``train:`` section drops every key of
    the first without a word); YAML 1.2 says keys are unique, and this loader holds to that."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`: the parent's merge takes it
                continue
            if (key := self.construct_object(key_node, deep=deep)) in seen:
                why = f"the key {key!r} is given twice (the second would replace the first)"
                raise yaml.constructor.ConstructorError(None, None, why, key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, AttributeError) as exc:  # an explicit tag's own: `!!int two`
            what = f"{node.tag.rsplit(':', 1)[-1]} {node.value!r}: {exc}"
            raise yaml.constructor.ConstructorError(None, None, what, node.start_mark) from None

    def construct_yaml_timestamp(self, node: yaml.ScalarNode) -> Any:
        try:  # 2012-13-01 looks like a day to YAML and is none: its text, refused with its key's name
            return super().construct_yaml_timestamp(node)
        except (ValueError, AttributeError):  # `!!timestamp x` as well
            return self.construct_scalar(node)


_UniqueKeys.add_constructor("tag:yaml.org,2002:timestamp", _UniqueKeys.construct_yaml_timestamp)


def read_yaml(path: str | Path) -> dict[str, Any]:
    if not (path := Path(path)).is_file():
        raise ConfigError(f"{path}: study file not found")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeys)  # a SafeLoader
    except UnicodeDecodeError as exc:  # a Parquet file given for the study file, a Latin-1 one
        raise ConfigError(f"{path}: byte {exc.start} is not UTF-8 text: a study file is YAML") from None
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
            out[key.strip()] = yaml.load(value, Loader=_UniqueKeys) if value.strip() else None
        except yaml.constructor.ConstructorError as exc:  # a key twice, `!!int two`: no text to take as is
            raise ConfigError(f"--set {item!r}: {exc.problem}") from None
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


def with_overrides(cfg: SweeperConfig, overrides: dict[str, Any], source: str) -> SweeperConfig:
    """A new validated config with dotted ``overrides`` applied (``--set`` and trial params)."""
    raw = copy.deepcopy({**cfg.model_dump(mode="python", exclude_unset=False), "model": cfg.model.section()})
    for key, value in overrides.items():
        set_dotted(raw, key, value)
    out = validate_config(raw, source)
    # the same study file's folders
    return out.model_copy(update={"study": out.study.located(cfg.study._root, cfg.study.home)})


def load_config(path: str | Path, sets: list[str] | tuple[str, ...] = ()) -> SweeperConfig:
    """Read, override and validate a study file, its relative paths taken from its folder
    (:mod:`sweeper.config.anchor`). Raises ConfigError only."""
    if isinstance(raw := read_yaml(path), dict):  # anything else is validate_config's error
        for key, value in parse_sets(sets).items():  # a mapping sets its keys (train={lr: 0.01} reset all),
            # but another model, sampler or pruner, a search-space param's spec, options and {} are whole
            whole = not isinstance(value, dict) or not value or key.startswith("search_space") or (
                key.endswith("options") or (key in ("model", "study.sampler", "study.pruner")
                                            and "name" in value))
            for k, v in ({key: value} if whole else flatten(value, f"{key}.")).items():
                set_dotted(raw, k, v)
    source = f"{path}{' with --set ' + ' '.join(sets) if sets else ''}"
    return anchored(validate_config(raw, source, edge=True), path)
