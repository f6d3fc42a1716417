"""The base of every study-file section: an unknown key is refused, and true or false is never read as a
number (pydantic's lax mode reads ``epochs: yes`` or ``--set train.lr=true`` as 1)."""

import difflib
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidatorFunctionWrapHandler, field_validator


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="wrap")
    @classmethod
    def _no_bool_as_number(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        read = handler(value)
        if isinstance(value, bool) and not isinstance(read, bool):
            raise ValueError("expected a number")
        return read


def unknown_key(dotted: str, key: str, fields: Iterable[str], prefix: str = "") -> str:
    """What an unknown key ``dotted`` (whose last part, ``key``, is not one of ``fields``) is told."""
    close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.5)
    return f"unknown key '{dotted}'" + (f"; did you mean '{prefix}{close[0]}'?" if close else "")
