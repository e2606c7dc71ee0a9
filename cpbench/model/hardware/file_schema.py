"""Reading and writing a hardware profile's TOML file: `HardwareProfile` is its layout.

The layout, its errors and old files: docs/design.md section 2, "The hardware profile"."""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, get_args

import tomli_w
from pydantic import TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from cpbench.config.file_schema import MESSAGE, RULE
from cpbench.config.vocabulary import DTYPES
from cpbench.errors import CpbenchError
from cpbench.files import write_atomically
from cpbench.model.hardware.profile import HardwareProfile, migrated_family
from cpbench.reading import loads_toml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PROFILE_FILE = TypeAdapter(HardwareProfile)
"""Validates a profile file's tables (context {"file": True}) and dumps a profile as them."""
FILE = {"file": True}


def file_keys(table: type) -> dict[str, FieldInfo]:
    """The keys of a table (a profile dataclass) as a file spells them, with their fields."""
    fields: dict[str, FieldInfo] = getattr(table, "__pydantic_fields__", {})
    return {f.alias or name: f for name, f in fields.items() if not f.exclude}


def profile_table_at(loc: Sequence[str | int]) -> type | None:
    """The dataclass of the table at `loc` of a profile file, None when `loc` is no table."""
    table: type | None = HardwareProfile
    for part in loc:
        field = file_keys(table).get(str(part)) if table is not None else None
        if field is None:
            return None
        types = (field.annotation, *get_args(field.annotation))
        found = [t for t in types if hasattr(t, "__pydantic_fields__")]
        table = found[0] if found else None
    return table


def _profile_error(exc: ValidationError, origin: str, legacy: str | None = None) -> CpbenchError:
    """The first problem (unknown keys first), as `hardware profile <file>: <key> <rule>`;
    `legacy` is the family a single-curve file's `[kernel_efficiency]` was migrated to (its
    keys are named as the file spells them)."""
    errors = exc.errors()
    unknown_types = ("extra_forbidden", "unexpected_keyword_argument")
    extras = [e for e in errors if e["type"] in unknown_types]
    error = extras[0] if extras else errors[0]
    loc, kind, value = error["loc"], error["type"], error["input"]
    ctx: dict[str, Any] = error.get("ctx") or {}
    key = ".".join(part for part in loc if isinstance(part, str)) or "(top level)"
    if kind in unknown_types and loc[:-1] == ("peak_tflops",):
        text = f"is not a dtype; use {', '.join(DTYPES)} (and source)"
    elif kind in unknown_types:
        parent = loc[:-1]
        table = profile_table_at(parent)
        allowed = sorted(file_keys(table)) if table is not None else []
        unknown = sorted(str(e["loc"][-1]) for e in extras if e["loc"][:-1] == parent)
        key = f"[{'.'.join(str(part) for part in parent)}]" if parent else "(top level)"
        text = f"has unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}"
    elif kind == MESSAGE:
        text = ctx["message"]
    elif kind == RULE:
        text = f"{ctx['rule']}, got {value!r}"
    elif kind in ("model_type", "dataclass_type") or (kind == "missing" and profile_table_at(loc)):
        text = "must be a table"
    elif kind == "missing":
        text = "is required"
    elif kind == "string_type":
        text = f"must be a string, got {value!r}"
    elif kind in ("list_type", "tuple_type"):
        text = f"must be a list, got {value!r}"
    elif kind == "too_short":
        text = "must not be empty"
    else:
        text = f"{error['msg']}, got {value!r}"
    if legacy is not None:
        key = re.sub(rf"^(\[?)efficiency\.{legacy}\b", r"\1kernel_efficiency", key)
    return CpbenchError(f"hardware profile {origin}: {key} {text}")


def profile_from_toml(
    content: str, origin: str = "<string>", name: str | None = None
) -> HardwareProfile:
    """Parse and validate a profile from TOML text; errors call it `name` (default `origin`)."""
    where = f"hardware profile {name or origin} is not valid TOML"
    try:
        data = loads_toml(content, where)
    except tomllib.TOMLDecodeError as exc:
        raise CpbenchError(f"{where}: {exc}") from None
    return profile_from_dict(data, origin)


def profile_from_dict(data: Mapping[str, Any], origin: str = "<dict>") -> HardwareProfile:
    """Validate a parsed profile; CpbenchError naming the key and the rule on any problem."""
    legacy = None
    if isinstance(data, Mapping) and "kernel_efficiency" in data and "efficiency" not in data:
        legacy = migrated_family(data)
    try:
        profile = PROFILE_FILE.validate_python(data, context=FILE, by_alias=True, by_name=False)
    except ValidationError as exc:
        raise _profile_error(exc, origin, legacy) from None
    return dataclasses.replace(profile, origin=origin)


def _round(value: Any) -> Any:
    """Six significant digits of every number (what a written profile keeps of a fitted one)."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, Mapping):
        return {k: _round(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_round(v) for v in value]
    return value


def profile_document(profile: HardwareProfile) -> dict[str, Any]:
    """The profile as the TOML document `profile_from_dict` reads (numbers rounded to 6
    digits; keys absent where the profile has nothing)."""
    dumped = PROFILE_FILE.dump_python(profile, by_alias=True, exclude_none=True, context=FILE)
    document: dict[str, Any] = _round(dumped)
    return document


def profile_to_toml(profile: HardwareProfile, header: str = "") -> str:
    """The profile as TOML that `load_profile` reads back (numbers rounded to 6 digits), after
    `header` as comment lines."""
    comments = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comments + tomli_w.dumps(profile_document(profile))


def save_profile(
    profile: HardwareProfile, path: str | Path, header: str = "", inputs: Sequence[str | Path] = ()
) -> Path:
    """Write the profile as TOML (never over one of `inputs`, what it was fitted to);
    CpbenchError when the file cannot be written."""
    return write_atomically(path, profile_to_toml(profile, header), "hardware profile", inputs)
