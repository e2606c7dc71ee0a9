"""Shared pieces of the pydantic models that describe cpbench's TOML files (scenarios, profiles).

Strictness and the rule texts: docs/internals.md, "The TOML files' models". Pure Python."""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic_core import PydanticCustomError

RULE = "cpbench_rule"
"""Error type of a failure relabelled by `rule`; its ctx["rule"] is the rule text."""
MESSAGE = "cpbench_message"
"""Error type raised by `problem`; ctx["message"] is the text, ctx["key"] the key it names."""


class FileModel(BaseModel):
    """Base of the file models: strict types, no unknown keys, immutable, and each field's
    docstring as its description."""

    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, use_attribute_docstrings=True
    )


def rule(text: str) -> WrapValidator:
    """An `Annotated` marker: any failure of the type before it (wrong type, out of range, not
    one of the literals) becomes one `RULE` error stating `text`, e.g. "must be a positive
    number"."""

    def relabel(value: object, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError(RULE, "{rule}", {"rule": text}) from None

    return WrapValidator(relabel)


def problem(message: str, key: str | None = None) -> PydanticCustomError:
    """The error a validator raises for a rule of its own. `key` names the key the message is
    about when the error's location does not (a check across keys); "" = the message names its
    keys itself."""
    return PydanticCustomError(MESSAGE, "{message}", {"message": message, "key": key})
