"""The head-dimension limits of the fused kernels, as their sources state them (no CUDA query).

The limits and their sources: docs/internals.md, "Head-dimension limits of the fused kernels"."""

from __future__ import annotations

HEAD_DIM_MULTIPLE = 8
"""Every fused flash / cuDNN kernel's head-dimension alignment (16-bit inputs)."""
FLASH_MAX_HEAD_DIM = 256
"""flash-attn 2, FlashAttention-3 and PyTorch's CUDA flash op."""
CUDNN_MAX_HEAD_DIM = 128
"""cuDNN attention forward and backward on every GPU and cuDNN release torch admits."""

_LIMITS: dict[str, tuple[int, str]] = {
    "flash_attn": (FLASH_MAX_HEAD_DIM, "flash-attn 2's mha_fwd / mha_bwd (flash_api.cpp)"),
    "flash_attn3": (FLASH_MAX_HEAD_DIM, "FlashAttention-3's mha_fwd (hopper/flash_api.cpp)"),
    "sdpa": (FLASH_MAX_HEAD_DIM, "PyTorch's CUDA flash op (mha_fwd in aten's flash_api.cpp)"),
    "cudnn": (CUDNN_MAX_HEAD_DIM, "cuDNN attention (torch's check_cudnn_tensor_shapes)"),
}


def head_dim_unsupported(name: str, head_dim: int, device: str = "cuda") -> str | None:
    """Why kernel `name` cannot run `head_dim` on `device` ("cpu" / "cuda"), with the rule;
    None when it can (every kernel on the CPU, the memory-efficient and einsum kernels)."""
    if device != "cuda" or name not in _LIMITS:
        return None
    most, source = _LIMITS[name]
    if head_dim > most or head_dim % HEAD_DIM_MULTIPLE:
        return (
            f"cannot run head_dim {head_dim}: {source} needs a head dimension <= {most} that "
            f"is a multiple of {HEAD_DIM_MULTIPLE} ({head_dim} % {HEAD_DIM_MULTIPLE} = "
            f"{head_dim % HEAD_DIM_MULTIPLE}); kernel 'efficient' runs any head dimension"
        )
    return None
