"""What a mistake in a scenario file says: the first problem of pydantic's `ValidationError`, in
the order a reader fixes them, in the words `<file>: key '<key>': <value> <rule>`. Pure Python.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from cpbench.config.file_schema import MESSAGE, RULE
from cpbench.errors import CpbenchError
from cpbench.results.scenarios.file_schema import AXIS_KEYS, DYNAMIC_KEYS, TOP_LEVEL_KEYS

TABLE_KEYS = {"axes": AXIS_KEYS, "dynamic": DYNAMIC_KEYS}
"""The keys of the tables whose errors name their own key (`[axes]`, `[dynamic]`)."""

_TYPE_RULES: dict[str, str] = {
    "int_type": "is not an integer",
    "string_type": "is not a string",
    "bool_type": "is not true or false",
}


def _rank(error: ErrorDetails) -> int:
    """Which problem to report first, in the order a reader fixes them: unknown top-level keys,
    the [axes] table itself, unknown and missing axes, then the values top to bottom."""
    loc, kind = error["loc"], error["type"]
    if not loc:
        return 0 if kind == "model_type" else 6
    if loc[0] not in TABLE_KEYS:
        return 0 if kind == "extra_forbidden" else 4
    if len(loc) == 1:
        return 1
    return {"extra_forbidden": 2, "missing": 3}.get(kind, 5)


def scenario_error(exc: ValidationError, source: str) -> CpbenchError:
    """The first problem of a validation, in the words `<file>: key '<key>': <value> <rule>`."""
    error = min(exc.errors(), key=_rank)
    loc, kind, value = error["loc"], error["type"], error["input"]
    ctx: dict[str, Any] = error.get("ctx") or {}
    table = str(loc[0]) if len(loc) > 1 and loc[0] in TABLE_KEYS else None
    in_axes = table is not None
    key = str(loc[1] if in_axes else loc[0]) if loc else ""
    if kind == "model_type" and not loc:
        return CpbenchError(f"{source}: expected a TOML table, got {type(value).__name__}")
    if kind == "extra_forbidden" and in_axes:
        return CpbenchError(
            f"{source}: unknown key {key!r} in [{table}]; allowed keys: "
            f"{', '.join(TABLE_KEYS[str(table)])}"
        )
    if kind == "extra_forbidden":
        hint = " (axis keys go in the [axes] table)" if key in AXIS_KEYS else ""
        return CpbenchError(
            f"{source}: unknown key {key!r}{hint}; allowed keys: {', '.join(TOP_LEVEL_KEYS)}"
        )
    if kind == "missing":
        if in_axes:
            return CpbenchError(f"{source}: key '{key}' is required in [{table}]")
        return CpbenchError(f"{source}: missing the [axes] table (seq_len, heads, ...)")
    if kind == "model_type":
        text = f"{value!r} is not a table; write an [{key}] section"
    elif kind == MESSAGE:
        key = key if ctx.get("key") is None else ctx["key"]
        text = ctx["message"]
    elif kind == "too_short":
        text = "the list is empty; give at least one value"
    elif kind == "greater_than":  # PositiveInt
        text = f"{value!r} must be " + ("positive" if ctx["gt"] == 0 else f"> {ctx['gt']}")
    elif kind == "greater_than_equal":  # NonNegativeInt
        text = f"{value!r} must be >= {ctx['ge']}"
    else:
        text = f"{value!r} {ctx['rule'] if kind == RULE else _TYPE_RULES.get(kind, error['msg'])}"
    return CpbenchError(f"{source}: key '{key}': {text}" if key else f"{source}: {text}")
