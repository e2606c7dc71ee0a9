"""Which kernel runs: `select_kernel` from the device, the dtype and the requested name.

What `auto` picks where: docs/internals.md, "Local attention kernels"."""

from __future__ import annotations

import functools
import importlib

import torch

from cpbench.attention.kernels import ops
from cpbench.attention.kernels.base import LocalKernel
from cpbench.attention.kernels.cpu_sdpa import CpuSdpaKernel
from cpbench.attention.kernels.cuda_sdpa import CudaSdpaKernel
from cpbench.attention.kernels.cudnn import CudnnKernel, cudnn_unavailable
from cpbench.attention.kernels.efficient import EfficientKernel, efficient_unavailable
from cpbench.attention.kernels.flash_attn import (
    FlashAttnKernel,
    before_ampere,
    flash_attn_available,
    flash_attn_capability_refusal,
    flash_attn_version,
)
from cpbench.attention.kernels.flash_attn3 import (
    FlashAttn3Kernel,
    flash_attn3_available,
    flash_attn3_interface,
    flash_attn3_version,
    takes_window,
)
from cpbench.attention.kernels.limits import head_dim_unsupported
from cpbench.attention.kernels.naive import NaiveKernel
from cpbench.config.vocabulary import BACKENDS
from cpbench.errors import CpbenchError, KernelRefused

HALF = (torch.float16, torch.bfloat16)
HOPPER = 9
"""Compute capability major of Hopper (H100/H200: sm90), FlashAttention-3's architecture."""


@functools.cache
def _kernel_instance(cls: type) -> LocalKernel:
    return cls()


def _kernel_class(name: str, device: torch.device) -> type:
    if name == "sdpa":
        return CudaSdpaKernel if device.type == "cuda" else CpuSdpaKernel
    classes: dict[str, type] = {
        "naive": NaiveKernel,
        "flash_attn": FlashAttnKernel,
        "flash_attn3": FlashAttn3Kernel,
        "cudnn": CudnnKernel,
        "efficient": EfficientKernel,
    }
    return classes[name]


def _flash_attn_unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    if device.type == "cuda" and dtype in HALF and flash_attn_available():
        capability, version = ops.device_capability(device), flash_attn_version()
        if capability is None or version is None:
            return before_ampere(capability)
        return flash_attn_capability_refusal(version, capability)
    return (
        f"needs CUDA, fp16/bf16 and flash-attn >= 2.7 (device {device.type}, dtype {dtype}, "
        f"installed: {flash_attn_version()}); install with: pip install 'cpbench[gpu]'"
    )


def _flash_attn3_unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    if device.type != "cuda":
        return f"needs a CUDA device (got {device.type})"
    if dtype not in HALF:
        return f"needs fp16/bf16 (got {dtype})"
    capability = ops.device_capability(device)
    if capability is None or capability[0] != HOPPER:
        return f"needs a Hopper GPU (compute capability 9.x; device has {capability})"
    if not flash_attn3_available():
        return (
            "needs FlashAttention-3: module 'flash_attn_interface' (flash-attention's hopper/, "
            "the flash_attn_3 wheel) does not import"
        )
    return None


def kernel_unavailable(
    name: str, device: torch.device | str, dtype: torch.dtype, head_dim: int | None = None
) -> str | None:
    """Why kernel `name` (not `auto`) cannot run on `device` in `dtype` (and, given, at
    `head_dim`: `limits.head_dim_unsupported`); None when it can."""
    device = torch.device(device)
    reason = _unavailable(name, device, dtype)
    if reason is None and head_dim is not None:
        capability = ops.device_capability(device) if device.type == "cuda" else None
        dtype_name = str(dtype).removeprefix("torch.")
        return head_dim_unsupported(name, head_dim, device.type, dtype_name, capability)
    return reason


def _unavailable(name: str, device: torch.device, dtype: torch.dtype) -> str | None:
    if name == "naive":
        return None
    if name == "sdpa":
        if device.type == "cuda" and dtype not in HALF:
            return f"on CUDA needs fp16/bf16, got {dtype} (float32 on CUDA: kernel 'efficient')"
        return before_ampere(ops.device_capability(device)) if device.type == "cuda" else None
    if name == "flash_attn":
        return _flash_attn_unavailable(device, dtype)
    if name == "flash_attn3":
        return _flash_attn3_unavailable(device, dtype)
    if name == "cudnn":
        return cudnn_unavailable(device, dtype)
    if name == "efficient":
        return efficient_unavailable(device, dtype)
    raise CpbenchError(f"kernel {name!r} is not one of {', '.join(BACKENDS)}")


def band_capable(name: str, device: torch.device | str) -> bool:
    """Whether kernel `name` applies a mask band (pieces neither full nor top-left causal):
    all but PyTorch's CUDA flash and cuDNN ops (a causal flag only) and an FA3 older than its
    window (2024-08-29)."""
    device = torch.device(device)
    if name == "sdpa":
        return device.type != "cuda"
    if name == "efficient":
        return True  # it runs on CUDA alone, where it takes the band as its bias
    if name == "flash_attn3":
        fa3 = flash_attn3_interface() if flash_attn3_available() else None
        return fa3 is None or takes_window(fa3)  # one that does not import is refused for that
    return name in ("naive", "flash_attn")


def auto_kernel_name(
    device: torch.device | str,
    dtype: torch.dtype,
    band: bool = False,
    head_dim: int | None = None,
) -> str:
    """The kernel `auto` runs on `device` in `dtype` (docs/internals.md), among those that can
    run `head_dim` when given; with `band`, the first that can apply one of: the usual choice,
    FlashAttention-3, flash-attn 2, the memory-efficient op (else the usual one, which refuses)."""
    name = _auto_kernel_name(torch.device(device), dtype, head_dim)
    if not band or band_capable(name, device):
        return name
    for alternative in ("flash_attn3", "flash_attn", "efficient"):
        if kernel_unavailable(alternative, device, dtype, head_dim) is None and band_capable(
            alternative, device
        ):
            return alternative
    return name


def _auto_kernel_name(device: torch.device, dtype: torch.dtype, head_dim: int | None) -> str:
    if device.type != "cuda":
        return "naive" if dtype == torch.float64 else "sdpa"
    if dtype == torch.float32:
        return _efficient_or_einsum(device, dtype, head_dim)
    if dtype not in HALF:
        return "naive"
    for name in ("flash_attn3", "flash_attn"):
        if kernel_unavailable(name, device, dtype, head_dim) is None:
            return name
    capability = ops.device_capability(device)
    if (
        capability is not None
        and capability[0] >= HOPPER
        and kernel_unavailable("cudnn", device, dtype, head_dim) is None
    ):
        return "cudnn"
    if kernel_unavailable("sdpa", device, dtype, head_dim) is None:
        return "sdpa"
    return _efficient_or_einsum(device, dtype, head_dim)


def _efficient_or_einsum(device: torch.device, dtype: torch.dtype, head_dim: int | None) -> str:
    """The last fused choice, the memory-efficient op; the einsum kernel where only the op's
    head-dimension alignment refuses (a GPU or dtype it cannot run at all stays refused, with
    its reason, rather than falling to the slow einsum)."""
    if kernel_unavailable("efficient", device, dtype) is None and (
        kernel_unavailable("efficient", device, dtype, head_dim) is not None
    ):
        return "naive"
    return "efficient"


def kernel_version(name: str) -> str | None:
    """The version of what runs kernel `name`: the library (flash-attn, FA3), cuDNN's number,
    or torch for PyTorch's own ops; None when that library is not installed."""
    if name == "flash_attn":
        try:
            return str(importlib.import_module("flash_attn").__version__)
        except (ImportError, AttributeError):
            return None
    if name == "flash_attn3":
        return flash_attn3_version()
    if name == "cudnn":
        version = ops.cudnn_version()
        return None if version is None else str(version)
    return str(torch.__version__)


def select_kernel(
    device: torch.device | str,
    dtype: torch.dtype,
    name: str = "auto",
    band: bool = False,
    head_dim: int | None = None,
) -> LocalKernel:
    """Pick a kernel: `auto` as `auto_kernel_name` says, else the named one. A choice that
    cannot run here, apply the mask's band pieces (`band`) or run `head_dim`
    (`limits.head_dim_unsupported`) is a `CpbenchError` saying why."""
    device = torch.device(device)
    if name not in BACKENDS:
        raise CpbenchError(f"kernel {name!r} is not one of {', '.join(BACKENDS)}")
    chosen = auto_kernel_name(device, dtype, band, head_dim) if name == "auto" else name
    reason = kernel_unavailable(chosen, device, dtype, head_dim)
    if reason is not None:
        raise KernelRefused(f"kernel {chosen!r} {reason}")
    if band and not band_capable(chosen, device):
        raise KernelRefused(band_refusal(chosen, device, dtype))
    return _kernel_instance(_kernel_class(chosen, device))


def band_refusal(name: str, device: torch.device | str, dtype: torch.dtype) -> str:
    """The error of a kernel that cannot apply a mask's band pieces, naming those that can."""
    capable = [
        n
        for n in BACKENDS
        if n != "auto" and band_capable(n, device) and kernel_unavailable(n, device, dtype) is None
    ]
    return (
        f"kernel {name!r} cannot apply the band pieces of this mask (packed documents or a "
        f"sliding window need masks that are neither full nor top-left causal); kernels that "
        f"can on {torch.device(device).type} in {dtype}: {', '.join(capable) or 'none'}"
    )
