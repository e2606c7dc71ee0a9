"""The tolerance of every correctness check against the float64 reference, per dtype.

A tensor passes when its max abs error is at most `atol + rtol * max|reference|`. Pure Python.
"""

from __future__ import annotations

TOLERANCE = {"float32": 2e-4, "float16": 1e-2, "bfloat16": 5e-2}
"""Absolute part of the allowed error against the float64 reference, per input dtype. The
reference runs on the inputs rounded to that dtype, so only the computation's error counts."""
RELATIVE_TOLERANCE = {"float32": 1e-5, "float16": 2.0**-9, "bfloat16": 2.0**-6}
"""Relative part, times the largest magnitude of the tensor checked: gradients such as dV sum
over the sequence and grow with it, so a fixed absolute bound would fail correct bf16 results
(one bf16 rounding step at magnitude 8 is 0.03). 2^-6 / 2^-9 are a few units of the last place
of bf16 (8-bit mantissa) / fp16 (11-bit); fp32 kernels agree to ~1e-6 at these sizes."""


def allowed_error(dtype: str, reference_max_abs: float, absolute: float | None = None) -> float:
    """Allowed max abs error for one tensor: absolute + relative x max |reference|."""
    atol = TOLERANCE[dtype] if absolute is None else absolute
    return atol + RELATIVE_TOLERANCE[dtype] * reference_max_abs
