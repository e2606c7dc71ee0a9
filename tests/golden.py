"""Compare a report's --json with a document captured before the report became typed: the same
keys in the same order, the same JSON types (1 is not 1.0, null is not 0) and the same values,
floats to a relative 1e-3 (or 1e-9 absolute, for values that are 0 up to rounding): the joint
fit stops at its solver's tolerance (FIT_TOLERANCE, 1e-4 in log parameters, chosen for speed), and
another CPU's BLAS kernels move the point it stops at. Seen on a fresh machine with the same
library versions: a fitted parameter 1.8e-6 apart, a holdout Spearman 3e-4 (a near-tie that
flipped), an imbalance of 2e-13 s for 0. A changed field, unit or formula moves far more.
Rank statistics (`RANK_STATISTICS`) move by whole flips of near-tied candidates: compared to an
absolute tolerance."""

from __future__ import annotations

import math
from typing import Any

RANK_STATISTICS = {"spearman": 0.05}
"""Keys whose value is a rank correlation, and how far apart (absolute) two runs may put it: a
swap of two adjacent candidates among n moves Spearman by 12 / (n (n^2 - 1)), 0.057 at n = 6 and
0.024 at n = 8 (seen: -0.222 for -0.243 in `validate tests/fixtures/sweep.jsonl --calibrate`)."""


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
    elif isinstance(want, float) and where.rsplit(".", 1)[-1] in RANK_STATISTICS:
        tolerance = RANK_STATISTICS[where.rsplit(".", 1)[-1]]
        assert abs(got - want) <= tolerance, f"{where}: {got!r} != {want!r} (+-{tolerance})"
    elif isinstance(want, float):
        same = math.isclose(got, want, rel_tol=1e-3, abs_tol=1e-9) or (
            math.isnan(got) and math.isnan(want)
        )
        assert same, f"{where}: {got!r} != {want!r}"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"
