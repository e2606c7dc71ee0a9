"""The base of the typed reports application services return and `cpbench.render` reads: a
pydantic model whose `--json` is its one serializer, `model_dump(mode="json")`."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

_ReportT = TypeVar("_ReportT", bound="ReportModel")


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
    omitted_when_none: ClassVar[tuple[str, ...]] = ()
    """Optional fields (a section only some reports have) whose key the JSON leaves out while
    they are None."""

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if not self.omitted_when_none:
            return data
        return {k: v for k, v in data.items() if v is not None or k not in self.omitted_when_none}

    @classmethod
    def of(cls: type[_ReportT], source: object, **values: Any) -> _ReportT:
        """The model of `values` and, for each other field, `source`'s attribute of that name
        (the field's type converts it: a tuple to a list, a Fraction to a float)."""
        names = (name for name in cls.model_fields if name not in values)
        return cls.model_validate({name: getattr(source, name) for name in names} | values)


class Versioned(ReportModel):
    """A whole report: its first key is the version of its JSON shape."""

    schema_version: Literal[1] = 1
    """Version of this report's JSON shape: it changes (a report then overrides this field
    with its next number) when a key is renamed or removed or changes meaning, not when one is
    added."""
