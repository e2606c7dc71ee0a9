"""Test helpers for the implementation adapters and the GPU kernels on CPU ranks:

* the test-only flash_attn stand-in on sys.path (in this process and, as a pool task, on
  every rank): `use_stand_ins`;
* `cpbench verify`'s cases on the pool's ranks with kernel `flash_attn` served by the
  flash-attn 2 rule stand-in (`tests/flash_rules.Library`, which clamps windows as
  csrc/flash_attn/flash_api.cpp does and masks as src/mask.h does): `run_cases_with_flash_rule`.
  `select_kernel` itself runs (band checks included); only its "needs CUDA" answer for
  flash_attn and the instance it hands out are replaced, on the rank, for the duration of the
  task. Variant "old-window" is the kernel as it was before the fix (one call per piece, -1
  for an unbounded side, flash-attn's bottom-right causal on non-square blocks), under the
  same library rule: the check fails with it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

STAND_INS = str(Path(__file__).resolve().parent / "stand_ins")

FLASH_RULE_VARIANTS = ("fixed", "old-window")
"""`fixed`: cpbench's FlashAttnKernel as shipped (flash_plan's calls); `old-window`: the
kernel's calls before the fix (`old_flash_window`), both over flash_rules.Library(FA2)."""


def use_stand_ins() -> bool:
    """Put tests/stand_ins first on sys.path (idempotent). A pool task, too: the persistent
    ranks then import the stand-in flash_attn; processes spawned later inherit sys.path.
    Returns whether the imported flash_attn is the stand-in."""
    if STAND_INS not in sys.path:
        sys.path.insert(0, STAND_INS)
    try:
        import flash_attn  # noqa: PLC0415
    except ImportError:
        return False
    return bool(getattr(flash_attn, "STAND_IN", False))


def old_flash_window(sq: int, sk: int, band: Any) -> tuple[int, int]:
    """The window main passed before the fix (git show e427aa3^: flash_window): left =
    (sk - sq) - lo, right = hi - (sk - sq), -1 for an unbounded side, whatever sq and sk;
    a negative window was an error."""
    from cpbench.errors import CpbenchError  # noqa: PLC0415

    if band is None:
        return -1, -1
    lo, hi = band
    left = -1 if lo is None else (sk - sq) - lo
    right = -1 if hi is None else hi - (sk - sq)
    if (lo is not None and left < 0) or (hi is not None and right < 0):
        raise CpbenchError(f"old flash_window: band ({lo}, {hi}) on {sq} x {sk} is negative")
    return left, right


def _rule_kernel(variant: str) -> Any:
    """A FlashAttnKernel over flash_rules.Library(FA2), as shipped or as before the fix."""
    from cpbench.attention.kernels.base import normalize_band  # noqa: PLC0415
    from cpbench.attention.kernels.flash_attn import FlashAttnKernel  # noqa: PLC0415
    from tests import flash_rules  # noqa: PLC0415

    class RuleFlashAttn(FlashAttnKernel):
        def __init__(self) -> None:  # the library is the rule stand-in, not an import
            self._fa = flash_rules.Library(flash_rules.FA2)  # type: ignore[assignment]

    class OldWindowFlashAttn(RuleFlashAttn):
        def forward(self, q, k, v, causal, scale, band=None):  # type: ignore[no-untyped-def]
            causal, band = normalize_band(causal, band)
            left, right = old_flash_window(q.shape[1], k.shape[1], band)
            return self._call(q, k, v, causal, scale, left, right)

        def backward(self, dout, q, k, v, out, lse, causal, scale, band=None):  # type: ignore[no-untyped-def]
            causal, band = normalize_band(causal, band)
            left, right = old_flash_window(q.shape[1], k.shape[1], band)
            return self._call_backward(dout, q, k, v, out, lse, causal, scale, left, right)

    if variant not in FLASH_RULE_VARIANTS:
        raise ValueError(f"variant {variant!r} is not one of {FLASH_RULE_VARIANTS}")
    return RuleFlashAttn() if variant == "fixed" else OldWindowFlashAttn()


@contextlib.contextmanager
def flash_attn_by_rule(variant: str = "fixed") -> Iterator[Any]:
    """In this process, `select_kernel(cpu, dtype, "flash_attn", ...)` gives the rule
    kernel of `variant` (any dtype: the float32 tolerance keeps the check sharp, and flash-attn's
    fp16/bf16 rule is not what is checked here). Yields the kernel (its `_fa.calls` lists
    every library call); restores the selection afterwards."""
    from cpbench.attention.kernels import select  # noqa: PLC0415
    from cpbench.attention.kernels.flash_attn import FlashAttnKernel  # noqa: PLC0415

    kernel = _rule_kernel(variant)
    unavailable, instance = select._flash_attn_unavailable, select._kernel_instance

    def flash_unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
        return None if device.type == "cpu" else unavailable(device, dtype)

    def kernel_instance(cls: type) -> Any:
        return kernel if cls is FlashAttnKernel else instance(cls)

    select._flash_attn_unavailable = flash_unavailable  # type: ignore[assignment]
    select._kernel_instance = kernel_instance  # type: ignore[assignment]
    try:
        yield kernel
    finally:
        select._flash_attn_unavailable = unavailable
        select._kernel_instance = instance


def run_cases_with_flash_rule(variant: str, cases: list[Any]) -> tuple[list[Any], dict[str, int]]:
    """Pool task: `cpbench verify`'s cases (`run_cases_on_rank`: rank 0 judges, one float64
    reference per problem) with the rule kernel selected for `flash_attn` (`flash_attn_by_rule`).
    Returns (the records on rank 0, None elsewhere; this rank's call counts: library calls, and
    calls with more query rows than key columns + 1, where the right window is clamped)."""
    from cpbench.bench.reference import run_cases_on_rank  # noqa: PLC0415

    with flash_attn_by_rule(variant) as kernel:
        records = run_cases_on_rank(cases)
    calls = kernel._fa.calls
    return records, {
        "calls": len(calls),
        "tall": sum(1 for sq, sk, *_ in calls if sq > sk + 1),
    }
