"""Compare a report's --json with a document captured before the report became typed: the same
keys in the same order, the same JSON types (1 is not 1.0, null is not 0) and the same values,
floats to a relative 1e-9 (fits and timings may differ in the last bits across BLAS builds)."""

from __future__ import annotations

import math
from typing import Any


def assert_same_document(got: Any, want: Any, where: str = "$") -> None:
    """AssertionError naming the first path where `got` and `want` differ."""
    assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, dict):
        assert list(got) == list(want), f"{where}: keys {list(got)} != {list(want)}"
        for key, value in want.items():
            assert_same_document(got[key], value, f"{where}.{key}")
    elif isinstance(want, list):
        assert len(got) == len(want), f"{where}: {len(got)} items != {len(want)}"
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert_same_document(a, b, f"{where}[{i}]")
    elif isinstance(want, float):
        same = math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-300) or (
            math.isnan(got) and math.isnan(want)
        )
        assert same, f"{where}: {got!r} != {want!r}"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"
