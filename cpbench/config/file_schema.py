"""Shared pieces of the pydantic models that describe cpbench's TOML files (scenarios, profiles).

Strictness and the rule texts: docs/internals.md, "The TOML files' models". Pure Python."""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any, Union, get_args, get_origin

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


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model of a field's type, also inside `Model | None`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType):
        for arg in get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def table_at(root: type[BaseModel], loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The model of the table at `loc` under `root` (`()` is `root`), None when `loc` is not a
    table of the schema."""
    model = root
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        inner = _model_in(field.annotation) if field is not None else None
        if inner is None:
            return None
        model = inner
    return model
