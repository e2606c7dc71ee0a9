"""How an attention kernel's throughput changes with head dim, piece shape and pass. Pure math.

The head-dim table (FlashAttention-2 on an RTX 4090) and its use: docs/cost-model.md section 5."""

from __future__ import annotations

import itertools
import math

from cpbench.config.vocabulary import Pass

HEAD_DIM_SOURCE = (
    "head-dim factor of FlashAttention-2 relative to d=128 from apache/tvm tl_doc/flash_perf.md "
    "@bd6f957 (RTX 4090, L=2k, fp16), applied as the kernel's shape"
)
HEAD_DIM_KERNELS = ("flash_attn", "cuda_sdpa")
"""Kernel families the table describes (FlashAttention-2 code)."""
REFERENCE_HEAD_DIM = 128
"""Head dim the shipped curves are read at."""

_TFLOPS: dict[tuple[str, bool], dict[int, float]] = {
    ("forward", False): {32: 159.79, 64: 168.91, 128: 169.28, 256: 156.15},
    ("forward", True): {32: 126.78, 64: 142.23, 128: 151.19, 256: 144.12},
    ("backward", False): {32: 115.12, 64: 124.81, 128: 124.57},
    ("backward", True): {32: 86.48, 64: 96.53, 128: 99.23},
}
"""TFLOP/s by (pass, causal) and head dim (docs/cost-model.md section 5)."""


def head_dim_factor(head_dim: int, causal: bool, phase: Pass) -> float:
    """Throughput at `head_dim` over that at 128 for one pass and mask (1.0 at 128)."""
    table = _TFLOPS[(phase, causal)]
    dims = sorted(table)
    reference = table[REFERENCE_HEAD_DIM]
    if head_dim <= dims[0] or head_dim >= dims[-1]:  # constant outside the table
        return table[dims[0] if head_dim <= dims[0] else dims[-1]] / reference
    low, high = next((low, high) for low, high in itertools.pairwise(dims) if head_dim <= high)
    x, x0, x1 = math.log2(head_dim), math.log2(low), math.log2(high)
    return (table[low] + (table[high] - table[low]) * (x - x0) / (x1 - x0)) / reference


def kernel_factor(kernel: str, device: str, head_dim: int, causal: bool, phase: Pass) -> float:
    """The head-dim factor for a kernel family on a device kind (1.0 where no table applies)."""
    if device != "cuda" or kernel not in HEAD_DIM_KERNELS:
        return 1.0
    return head_dim_factor(head_dim, causal, phase)
