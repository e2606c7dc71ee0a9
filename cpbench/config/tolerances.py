"""The tolerance of every correctness check against the float64 reference. Pure Python.

The error model and its measured margin: docs/design.md section 7, "The tolerance of a check"."""

from __future__ import annotations

import math

UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
"""u of each dtype: half the distance from 1 to the next number (8, 11, 24 significant bits)."""
ACCUMULATOR = "float32"
"""The accumulation the bound is for: a lower-precision accumulator fails it."""
KERNEL_ROUNDINGS = 2
"""Roundings to the dtype inside the local kernel per checked tensor (P or dS before the second
GEMM, the stored result)."""
SIGMAS = 5.0
"""Standard deviations of the modelled error the bound allows (the measured worst is 2.0)."""
ABSOLUTE_FLOOR = 2.0**-16
"""Absolute part of every bound: fp32 rounding of terms up to 2^8 (a reference that is 0)."""
TOLERANCE = {"float32": 2e-4, "float16": 1e-2, "bfloat16": 5e-2}
"""A coarse absolute allowance per dtype, not the check's bound: what an external library's known
issue allows on a tensor it rounds to a lower precision than its inputs' (ring-flash-attn's dQ
in bf16), and the tests' loose upper limit on an error."""

CHECKED_TENSORS = ("out", "dq", "dk", "dv")
"""The tensors every check compares."""


def rounded_terms(tensor: str, ring: int, group: int) -> int:
    """k of the error model (docs/design.md section 7): roundings to the dtype behind one element
    of `tensor` (out, dq, dk or dv) for a ring (or all-gather) degree `ring` and `group` query
    heads per KV head."""
    if tensor not in CHECKED_TENSORS:
        raise ValueError(f"tensor must be one of {', '.join(CHECKED_TENSORS)}, got {tensor!r}")
    partials = group * ring if tensor in ("dk", "dv") else ring
    return KERNEL_ROUNDINGS + partials


def allowed_error(
    dtype: str,
    reference_max_abs: float,
    terms: int,
    length: int,
    absolute: float | None = None,
) -> float:
    """Allowed max abs error for one tensor (the bound of docs/design.md section 7): `terms`
    roundings to `dtype` (`rounded_terms`), sums over `length` tokens in fp32, the reference's
    largest magnitude; `absolute` replaces the floor (an impl's known issue)."""
    u, acc = UNIT_ROUNDOFF[dtype], UNIT_ROUNDOFF[ACCUMULATOR]
    sigma = (u * math.sqrt(terms) + acc * math.sqrt(length)) / math.sqrt(3) * reference_max_abs
    return SIGMAS * sigma + (ABSOLUTE_FLOOR if absolute is None else absolute)
