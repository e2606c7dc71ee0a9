"""The base of the typed reports application services return and `cpbench.render` reads: a
pydantic model whose `--json` is its one serializer, `model_dump(mode="json")`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ReportModel(BaseModel):
    """A report (or a part of one): documented fields, no undeclared ones; a field named
    around a Python keyword (`global_`) reads and writes the keyword (`global`); infinities
    and NaN serialise as JSON's `Infinity`/`NaN`, as `json.dumps` writes them."""

    model_config = ConfigDict(
        use_attribute_docstrings=True,
        extra="forbid",
        ser_json_inf_nan="constants",
        serialize_by_alias=True,
        validate_by_name=True,
    )


def omitted_when_none() -> Any:
    """A field that defaults to None and is left out of the JSON while None (an optional
    section: its key is present only when the report has it)."""
    return Field(default=None, exclude_if=lambda value: value is None)
