"""Reading a user's text file whatever it holds (a folder, random bytes, a byte-order mark,
JSON or TOML nested 100,000 deep, a 5,000-digit number): its text, or one CpbenchError."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cpbench.errors import CpbenchError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects a file may have (a results record has 5 levels)."""


def read_bytes(path: str | Path, what: str, kind: str = "file") -> bytes:
    """The bytes of a file; CpbenchError naming `what` (e.g. "results file") and `path` when it
    is missing, a folder (not a `kind`) or unreadable."""
    path = Path(path)
    if not path.exists():
        raise CpbenchError(f"{what} {path} does not exist")
    if path.is_dir():
        raise CpbenchError(f"{what} {path} is a directory, not a {kind}")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CpbenchError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def read_text(path: str | Path, what: str) -> str:
    """The text of a UTF-8 file (a leading byte-order mark dropped); CpbenchError as
    `read_bytes`, and when it is not UTF-8."""
    data = read_bytes(path, what)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CpbenchError(
            f"{what} {path} is not UTF-8 text (byte {exc.start}): a text file expected"
        ) from None


def _too_deep(data: Any) -> bool:
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def _refusal(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return f"nested deeper than {MAX_DEPTH} levels"
    digits = sys.get_int_max_str_digits()
    if "integer string conversion" in str(exc):
        return f"a number of more than {digits} digits"
    return str(exc)


def _parsed(
    parse: Callable[[str], Any], syntax_error: type[Exception], text: str, where: str
) -> Any:
    """`parse(text)`, whose `syntax_error` passes through; nesting deeper than MAX_DEPTH or a
    number too long to read is a CpbenchError `where: the rule`."""
    try:
        data = parse(text)
    except syntax_error:
        raise
    except (RecursionError, ValueError) as exc:
        raise CpbenchError(f"{where}: {_refusal(exc)}") from None
    if isinstance(data, (dict, list)) and _too_deep(data):
        raise CpbenchError(f"{where}: {_refusal(RecursionError())}")
    return data


def loads_json(text: str, where: str) -> Any:
    """`json.loads` as `_parsed` checks it (syntax errors: `json.JSONDecodeError`)."""
    return _parsed(json.loads, json.JSONDecodeError, text, where)


def loads_toml(text: str, where: str) -> dict[str, Any]:
    """`tomllib.loads` as `_parsed` checks it (syntax errors: `tomllib.TOMLDecodeError`)."""
    return _parsed(tomllib.loads, tomllib.TOMLDecodeError, text, where)
