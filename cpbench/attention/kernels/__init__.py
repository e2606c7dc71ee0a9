"""Local (single-device) attention kernels with one interface: `(out, lse)` forward and a
backward that takes a given `out`/`lse`. Why, and the modules: docs/internals.md."""

from __future__ import annotations

from cpbench.attention.kernels.base import (
    LocalKernel,
    accumulator_dtype,
    causal_mask,
    default_scale,
)
from cpbench.attention.kernels.cpu_sdpa import CpuSdpaKernel
from cpbench.attention.kernels.cuda_sdpa import CudaSdpaKernel
from cpbench.attention.kernels.cudnn import CudnnKernel, cudnn_unavailable
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
    "cudnn_unavailable",
    "accumulator_dtype",
    "default_scale",
    "efficient_unavailable",
    "flash_attn3_available",
    "flash_attn3_version",
    "flash_attn_available",
    "flash_attn_version",
    "kernel_unavailable",
    "kernel_version",
    "select_kernel",
]
