"""Local (single-device) attention kernels with one interface: `(out, lse)` forward and a
backward that takes a given `out`/`lse`.

Ring attention computes attention block by block and merges the partial results with their
log-sum-exp (LSE); its backward runs each block's backward against the FINAL output and LSE.
So a kernel here must return the LSE and must accept an externally given out/LSE in backward —
which the fused kernels of flash-attn, FlashAttention-3, cuDNN and PyTorch do, and which the
einsum kernel reproduces.

Tensors are `[B, S, H, D]` (`k`/`v` may have fewer heads: GQA); `lse` is `[B, H, S]` float32 in
natural log. `causal=True` is the top-left aligned mask (query row i sees key column j <= i),
which is what every causal ring block needs once the caller has sliced it (see `layouts.py`).

One module per kernel: `naive` (einsum), `cpu_sdpa`, `cuda_sdpa` (PyTorch's flash ops),
`efficient` (PyTorch's memory-efficient op, float32 on CUDA), `cudnn`, `flash_attn`,
`flash_attn3`; `ops` is what they ask of torch (schema-driven op calls, capability, cuDNN
version), `select` picks one.
"""

from __future__ import annotations

from cpbench.attention.kernels.base import (
    LocalKernel,
    accumulator_dtype,
    causal_mask,
    default_scale,
)
from cpbench.attention.kernels.cpu_sdpa import CpuSdpaKernel
from cpbench.attention.kernels.cuda_sdpa import CudaSdpaKernel, cuda_flash_native_gqa
from cpbench.attention.kernels.cudnn import CudnnKernel, cudnn_native_gqa, cudnn_unavailable
from cpbench.attention.kernels.efficient import EfficientKernel, efficient_unavailable
from cpbench.attention.kernels.flash_attn import (
    FLASH_ATTN_MIN_VERSION,
    FlashAttnKernel,
    flash_attn_available,
    flash_attn_version,
)
from cpbench.attention.kernels.flash_attn3 import (
    FlashAttn3Kernel,
    flash_attn3_available,
    flash_attn3_version,
)
from cpbench.attention.kernels.naive import NaiveKernel
from cpbench.attention.kernels.select import (
    auto_kernel_name,
    band_capable,
    band_refusal,
    kernel_availability,
    kernel_unavailable,
    kernel_version,
    select_kernel,
)

__all__ = [
    "FLASH_ATTN_MIN_VERSION",
    "CpuSdpaKernel",
    "CudaSdpaKernel",
    "CudnnKernel",
    "EfficientKernel",
    "FlashAttn3Kernel",
    "FlashAttnKernel",
    "LocalKernel",
    "NaiveKernel",
    "auto_kernel_name",
    "band_capable",
    "band_refusal",
    "causal_mask",
    "cuda_flash_native_gqa",
    "cudnn_native_gqa",
    "cudnn_unavailable",
    "accumulator_dtype",
    "default_scale",
    "efficient_unavailable",
    "flash_attn3_available",
    "flash_attn3_version",
    "flash_attn_available",
    "flash_attn_version",
    "kernel_availability",
    "kernel_unavailable",
    "kernel_version",
    "select_kernel",
]
