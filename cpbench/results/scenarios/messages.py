"""What a mistake in a scenario file says: the first problem of pydantic's `ValidationError`, in
the order a reader fixes them, in the words `<file>: key '<key>': <value> <rule>`. Pure Python.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from cpbench.config.file_schema import MESSAGE, RULE
from cpbench.errors import CpbenchError
from cpbench.results.scenarios.file_schema import AXIS_KEYS, TOP_LEVEL_KEYS

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
    if loc[0] != "axes":
        return 0 if kind == "extra_forbidden" else 4
    if len(loc) == 1:
        return 1
    return {"extra_forbidden": 2, "missing": 3}.get(kind, 5)


def scenario_error(exc: ValidationError, source: str) -> CpbenchError:
    """The first problem of a validation, in the words `<file>: key '<key>': <value> <rule>`."""
    error = min(exc.errors(), key=_rank)
    loc, kind, value = error["loc"], error["type"], error["input"]
    ctx: dict[str, Any] = error.get("ctx") or {}
    in_axes = len(loc) > 1 and loc[0] == "axes"
    key = str(loc[1] if in_axes else loc[0]) if loc else ""
    if kind == "model_type" and not loc:
        return CpbenchError(f"{source}: expected a TOML table, got {type(value).__name__}")
    if kind == "extra_forbidden" and in_axes:
        return CpbenchError(
            f"{source}: unknown key {key!r} in [axes]; allowed keys: {', '.join(AXIS_KEYS)}"
        )
    if kind == "extra_forbidden":
        hint = " (axis keys go in the [axes] table)" if key in AXIS_KEYS else ""
        return CpbenchError(
            f"{source}: unknown key {key!r}{hint}; allowed keys: {', '.join(TOP_LEVEL_KEYS)}"
        )
    if kind == "missing":
        if in_axes:
            return CpbenchError(f"{source}: key '{key}' is required in [axes]")
        return CpbenchError(f"{source}: missing the [axes] table (seq_len, heads, ...)")
    if kind == "model_type":
        text = f"{value!r} is not a table; write an [axes] section"
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
