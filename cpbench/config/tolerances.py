"""The tolerance of every correctness check against the float64 reference: an error model of a
kernel that computes in the case's dtype with float32 accumulation. Pure Python.

The reference runs on the inputs rounded to the dtype, so input rounding adds nothing: only the
computation's own error counts. An fp32-accumulating scheme rounds to the dtype (unit roundoff
u: 2^-8 bfloat16, 2^-11 float16, 2^-24 float32; one rounding has a relative error in [-u, u],
standard deviation u/sqrt(3) when it is uniform there) at a few places only:

- inside the local kernel: the probabilities P (and dS in the backward) before their second
  GEMM, and the stored result: `KERNEL_ROUNDINGS` = 2 per tensor;
- each partial result the scheme combines in fp32: a ring step's (or a gathered chunk's) output
  and dQ, merged over the R ring ranks; dK/dV once per query head of a KV head's group (g = h /
  kv) and per ring rank: R partials for out and dQ, g x R for dK and dV.

Independent roundings add in quadrature, each at most the tensor's largest magnitude M (the
float64 reference's max |x|): sigma_round = u / sqrt(3) x sqrt(k) x M with k = 2 + R (out, dQ) or
2 + g R (dK, dV). The fp32 accumulator itself adds a random walk over the L terms of each sum:
sigma_acc = 2^-24 / sqrt(3) x sqrt(L) x M. The bound is `SIGMAS` = 5 of these sigmas, plus an
absolute floor for a tensor whose reference cancels to 0 (dQ and dK under a window of 1 are 0 in
exact arithmetic): `ABSOLUTE_FLOOR` = 2^-16, the fp32 rounding (2^-24) of terms up to 2^8 in
magnitude, which the unit-normal inputs of the checks do not exceed.

    bound = 5 x (u sqrt(k) + 2^-24 sqrt(L)) / sqrt(3) x M + 2^-16

Measured on `cpbench verify --world-size 2` (455 cases per dtype, L 64, h 8, d 16, CPU), the
largest error is 0.38 / 0.39 / 0.10 of its bound (bfloat16 / float16 / float32) on torch 2.13
and 0.37 / 0.36 / 0.10 on torch 2.5.1, i.e. under 2 sigma: a margin above 2.5. A bfloat16 accumulator instead rounds the running sum at each of the L additions,
an error growing as sqrt(L) u x M: at L = 1024 (causal, V of mean 1) it is 21.6 u x M where
this bound is 5.0 u x M and the fp32 accumulator's error 1.0 u x M (tests/test_judge.py). The
old bound, 5e-2 + 2^-6 x M for bfloat16, was 9 to 17 u x M for M from 2.5 down to 1.
"""

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
    """k of the module docstring: roundings to the dtype behind one element of `tensor` (out,
    dq, dk or dv) for a ring (or all-gather) degree `ring` and `group` query heads per KV head."""
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
    """Allowed max abs error for one tensor (the module docstring's bound): `terms` roundings to
    `dtype` (`rounded_terms`), sums over `length` tokens in fp32, the reference's largest
    magnitude; `absolute` replaces the floor (an impl's known issue)."""
    u, acc = UNIT_ROUNDOFF[dtype], UNIT_ROUNDOFF[ACCUMULATOR]
    sigma = (u * math.sqrt(terms) + acc * math.sqrt(length)) / math.sqrt(3) * reference_max_abs
    return SIGMAS * sigma + (ABSOLUTE_FLOOR if absolute is None else absolute)
