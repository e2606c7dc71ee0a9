"""How an attention kernel's throughput changes with the head dimension, the piece shape and
the pass, beside the efficiency curve over the sequence length (`EfficiencyCurve`). Pure math.

The shipped GPU curves are read at head dim 128 with a causal mask (docs/design.md §2, the
profiles' sources). FlashAttention-2's throughput at other head dims is taken relative to 128
from one published table, `apache/tvm` `tl_doc/flash_perf.md` @bd6f95705749439fea3600bf078bccc26b780cd9
("The flash-attention performance on RTX-4090 GPU", SEQ_LEN 2k, fp16, TFLOP/s, column
Flash_attn):

| pass, mask | d 32 | d 64 | d 128 | d 256 |
|---|---|---|---|---|
| forward, full | 159.79 | 168.91 | 169.28 | 156.15 |
| forward, causal | 126.78 | 142.23 | 151.19 | 144.12 |
| backward, full | 115.12 | 124.81 | 124.57 | - |
| backward, causal | 86.48 | 96.53 | 99.23 | - |

The factor at head dim d is the row's value at d over its value at 128, interpolated linearly
in log2(d) and constant outside the measured dims (the backward's 256 takes its 128). The table
is of an RTX 4090 (Ada); on other GPUs it is applied as the kernel's shape, not measured there
(`HEAD_DIM_SOURCE` says so in every curve note). It applies to the FlashAttention-2 code
(`flash_attn`, PyTorch's CUDA `cuda_sdpa`) on CUDA profiles; other kernels and CPU profiles keep
factor 1 (no published table by head dim was read for them).

**Piece shape.** The curves are of causal pieces; a full (unmasked) piece runs faster per
FLOP, since a causal kernel spends the diagonal blocks' masking and its tail of short rows.
The factor full / causal by kernel sequence length is read off FlashAttention-2's published
A100 benchmark, `Dao-AILab/flash-attention` `assets/flash2_a100_fwd_bwd_benchmark.png`
@4f285b354796fb17df8636485b9a04df3ebbb7dc (README "Performance", A100 80GB SXM4, forward +
backward, batch x seqlen = 16k tokens, head dim 128, FlashAttention-2 bars, TFLOP/s):

| seqlen | 1k | 2k | 4k | 8k | 16k |
|---|---|---|---|---|---|
| (b) without causal mask | 173 | 187 | 196 | 201 | 203 |
| (d) with causal mask | 133 | 155 | 173 | 182 | 189 |

(the 512 bar of (b) is hidden by the legend: below 1k the 1k ratio holds, above 16k the 16k
one), interpolated linearly in log2(length). It applies to the FlashAttention-2 code on CUDA
profiles, both passes (the figure times them together), at the length the efficiency curve
is read at. Which steps of a ring compute full pieces is `work.step_piece_causal`. Band
pieces (sliding windows) and packed documents keep the problem's mask flag: no published
table of banded FlashAttention throughput was read.
"""

from __future__ import annotations

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
"""TFLOP/s by (pass, causal) and head dim (the module docstring's table)."""


PIECE_SHAPE_SOURCE = (
    "full / causal piece factor of FlashAttention-2 from Dao-AILab/flash-attention "
    "assets/flash2_a100_fwd_bwd_benchmark.png @4f285b3 (A100, fwd+bwd, head dim 128), applied "
    "as the kernel's shape"
)
_FULL_CAUSAL_TFLOPS: dict[int, tuple[float, float]] = {
    1024: (173.0, 133.0),
    2048: (187.0, 155.0),
    4096: (196.0, 173.0),
    8192: (201.0, 182.0),
    16384: (203.0, 189.0),
}
"""(without causal mask, with causal mask) TFLOP/s by seqlen (the module docstring's table)."""


def full_over_causal(seq_len: float) -> float:
    """Throughput of a full piece over a causal one at a kernel sequence length."""
    lengths = sorted(_FULL_CAUSAL_TFLOPS)
    ratios = [_FULL_CAUSAL_TFLOPS[n][0] / _FULL_CAUSAL_TFLOPS[n][1] for n in lengths]
    if seq_len <= lengths[0]:
        return ratios[0]
    if seq_len >= lengths[-1]:
        return ratios[-1]
    x = math.log2(seq_len)
    for i in range(1, len(lengths)):
        if seq_len <= lengths[i]:
            x0, x1 = math.log2(lengths[i - 1]), math.log2(lengths[i])
            return ratios[i - 1] + (ratios[i] - ratios[i - 1]) * (x - x0) / (x1 - x0)
    return ratios[-1]  # unreachable: seq_len < lengths[-1] was handled


def head_dim_factor(head_dim: int, causal: bool, phase: Pass) -> float:
    """Throughput at `head_dim` over that at 128 for one pass and mask (1.0 at 128)."""
    table = _TFLOPS[(phase, causal)]
    dims = sorted(table)
    reference = table[REFERENCE_HEAD_DIM]
    if head_dim <= dims[0]:
        return table[dims[0]] / reference
    if head_dim >= dims[-1]:
        return table[dims[-1]] / reference
    x = math.log2(head_dim)
    for low, high in zip(dims, dims[1:], strict=False):
        if head_dim <= high:
            x0, x1 = math.log2(low), math.log2(high)
            value = table[low] + (table[high] - table[low]) * (x - x0) / (x1 - x0)
            return value / reference
    return table[dims[-1]] / reference  # unreachable: head_dim < dims[-1] was handled


def kernel_factor(kernel: str, device: str, head_dim: int, causal: bool, phase: Pass) -> float:
    """The head-dim factor for a kernel family on a device kind (1.0 where no table applies)."""
    if device != "cuda" or kernel not in HEAD_DIM_KERNELS:
        return 1.0
    return head_dim_factor(head_dim, causal, phase)


def piece_factor(
    kernel: str, device: str, head_dim: int, causal_piece: bool, phase: Pass, seq_len: float
) -> float:
    """The kernel's throughput on one piece shape relative to the curve (causal, head dim
    128): the head-dim factor of the piece's mask, times `full_over_causal` for a full piece
    (1.0 where no table applies: other kernels, CPU profiles)."""
    factor = kernel_factor(kernel, device, head_dim, causal_piece, phase)
    if causal_piece or device != "cuda" or kernel not in HEAD_DIM_KERNELS:
        return factor
    return factor * full_over_causal(seq_len)
