"""Which kernel runs: `select_kernel` from the device, the dtype and the requested name."""

from __future__ import annotations

import functools

import torch

from cpbench.attention.kernels.base import LocalKernel
from cpbench.attention.kernels.cpu_sdpa import CpuSdpaKernel
from cpbench.attention.kernels.cuda_sdpa import CudaSdpaKernel
from cpbench.attention.kernels.flash_attn import (
    FlashAttnKernel,
    flash_attn_available,
    flash_attn_version,
)
from cpbench.attention.kernels.naive import NaiveKernel
from cpbench.config.vocabulary import BACKENDS


@functools.cache
def _kernel_instance(cls: type) -> LocalKernel:
    return cls()


def select_kernel(
    device: torch.device | str, dtype: torch.dtype, name: str = "auto"
) -> LocalKernel:
    """Pick a kernel: flash-attn on CUDA when importable, else the fused SDPA op of the device,
    else einsum. `name` overrides the choice; an impossible override is an error."""
    from cpbench.errors import CpbenchError  # noqa: PLC0415

    device = torch.device(device)
    if name not in BACKENDS:
        raise CpbenchError(f"kernel {name!r} is not one of {', '.join(BACKENDS)}")
    cuda = device.type == "cuda"
    half = dtype in (torch.float16, torch.bfloat16)
    if name == "naive":
        return _kernel_instance(NaiveKernel)
    if name == "flash_attn" or (name == "auto" and cuda and half and flash_attn_available()):
        if not (cuda and half and flash_attn_available()):
            raise CpbenchError(
                f"kernel 'flash_attn' needs CUDA, fp16/bf16 and flash-attn >= 2.7 "
                f"(device {device.type}, dtype {dtype}, installed: {flash_attn_version()}); "
                f"install with: pip install 'cpbench[gpu]'"
            )
        return _kernel_instance(FlashAttnKernel)
    if cuda:
        if half:
            return _kernel_instance(CudaSdpaKernel)
        if name == "sdpa":
            raise CpbenchError(f"kernel 'sdpa' on CUDA needs fp16/bf16, got {dtype}")
        return _kernel_instance(NaiveKernel)
    if dtype == torch.float64 and name == "auto":
        return _kernel_instance(NaiveKernel)
    return _kernel_instance(CpuSdpaKernel)
