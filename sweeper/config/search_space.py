"""The ``search_space`` section: one parameter's spec, and the checks that each key names a tunable field
and that each bound, choice and draw is a value that field takes (at the edge, :data:`schema.EDGE`). ``cfg``
is a :class:`~sweeper.config.schema.SweeperConfig` (typed ``Any``: the schema imports this module)."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, model_validator

from sweeper.config.section import Section, unknown_key


class ParamSpec(Section):
    type: Literal["float", "int", "categorical"]
    low: float | None = Field(None, allow_inf_nan=False)
    high: float | None = Field(None, allow_inf_nan=False)
    step: float | None = Field(None, allow_inf_nan=False)
    log: bool = False
    choices: list[Any] | None = None
    when: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> ParamSpec:
        edge = bool(info.context)  # the step rule: a study stored before it still reads
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
        # what every trial crashed on (Optuna: step > 0; an int's step is int(step)); a study stored with one
        # ran no trial. A step that does not divide the range is Optuna's warning: it moves high onto the grid
        if edge and self.step is not None and (self.step <= 0 or (self.type == "int" and self.step < 1)):
            raise ValueError(f"step ({self.step:g}) must be > 0 (an int parameter's at least 1)")
        return self

    def allows(self, key: str, value: Any) -> bool:
        """Whether ``when`` lets ``key``'s ``value`` draw this parameter (a list there: any of its values)."""
        return value in (expected if isinstance(expected := (self.when or {})[key], list) else [expected])


_TUNABLE = ("model", "train", "data")


def space_highs(spec: ParamSpec | None) -> list[int]:
    """The largest value a search-space entry can take, as a one-element list (none: empty)."""
    values = [] if spec is None else (spec.choices or []) if spec.type == "categorical" else [spec.high]
    numbers = [int(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return [max(numbers)] if numbers else []


def check_space_values(cfg: Any, key: str, spec: ParamSpec, context: dict[str, Any]) -> None:
    """A bound, choice or draw its field refuses (``train.epochs`` from 0 or as a float, a misspelt
    ``train.loss``): each trial drawing it would be pruned as a config the model refuses. Rules across
    fields are left to the trials; so are a custom model's own keywords (not a built-in model field)."""
    check_condition(cfg, key, spec)
    section, _, field = key.partition(".")
    if field not in type(sec := getattr(cfg, section)).model_fields:
        return  # a nested key, or a custom model's keyword
    named = [("low", low := spec.low or 0.0), ("high", high := spec.high or 0.0)]
    if spec.type == "float":  # and a draw inside, which no integer bounds make whole
        named.append(("draw", round(low + (high - low) * 0.381966, 6)))
    for what, value in [("choice", v) for v in spec.choices or []] if spec.type == "categorical" else named:
        value = int(value) if spec.type == "int" else value
        try:
            type(sec).model_validate({**sec.model_dump(), field: value}, context=context)
        except ValidationError as e:
            if own := [err["msg"] for err in e.errors() if err["loc"][:1] == (field,)]:
                raise ValueError(f"search_space.{key}: {what} {value!r} is not a value {key} takes: "
                                 f"{own[0].removeprefix('Value error, ')}") from None


def check_condition(cfg: Any, key: str, spec: ParamSpec) -> None:
    """A ``when`` that no value its key takes meets (the study's fixed one; a searched key's choices or the
    numbers asked within its bounds, and its fixed one where it is conditional): ``key`` is never drawn."""
    for cond, wanted in (spec.when or {}).items():
        section, _, field = cond.partition(".")  # (a key no field names: check_space_key's to refuse)
        other, fixed = cfg.search_space.get(cond), getattr(getattr(cfg, section, None), field, None)
        takes = [fixed] if other is None or other.when else []
        if other is not None:
            takes += other.choices or [v for v in (wanted if isinstance(wanted, list) else [wanted])
                                       if isinstance(v, (int, float)) and other.low <= v <= other.high]
        if (other is not None or fixed is not None) and not any(spec.allows(cond, v) for v in takes):
            how = (f"never takes {wanted!r} in its search space" if other is not None
                   else f"is {fixed!r} in this study and not searched")
            raise ValueError(f"search_space.{key}.when: {cond} {how}, so {key} is never drawn")


def check_space_key(cfg: Any, key: str, where: str) -> None:
    section, _, field = key.partition(".")
    if section not in _TUNABLE or not field:
        raise ValueError(f"{where}: key {key!r} must be a dotted path such as model.d_model or train.lr")
    if section == "model" and cfg.model.is_custom:
        return
    if (head := field.split(".")[0]) not in (fields := type(getattr(cfg, section)).model_fields):
        raise ValueError(f"{where}: " + unknown_key(key, head, fields, prefix=f"{section}."))
