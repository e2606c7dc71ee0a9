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


def efficient_alignment(dtype: str, capability: tuple[int, int] | None = None) -> int:
    """The head-dimension multiple PyTorch's memory-efficient op needs for `dtype` ("float32",
    "float16", "bfloat16") on a GPU of `capability` (None: the sm80+ rule)."""
    half = dtype in ("float16", "bfloat16")
    major = 8 if capability is None else capability[0]
    if major >= 8:
        return 8 if half else 4
    return 8 if half and major >= 7 else 1


def head_dim_unsupported(
    name: str,
    head_dim: int,
    device: str = "cuda",
    dtype: str = "float32",
    capability: tuple[int, int] | None = None,
) -> str | None:
    """Why kernel `name` cannot run `head_dim` on `device` ("cpu" / "cuda") in `dtype` (a
    GPU of `capability`, None: the strictest rule), with the rule; None when it can (every
    kernel on the CPU, the einsum kernel)."""
    if device != "cuda":
        return None
    if name == "efficient":
        multiple = efficient_alignment(dtype, capability)
        if head_dim % multiple == 0:
            return None
        return (
            f"cannot run head_dim {head_dim}: PyTorch's memory-efficient op needs a head "
            f"dimension that is a multiple of {multiple} in {dtype} on this GPU "
            f"(minimum_gemm_alignment in aten's sdp_utils.cpp; {head_dim} % {multiple} = "
            f"{head_dim % multiple}); kernel 'naive' runs any head dimension"
        )
    if name not in _LIMITS:
        return None
    most, source = _LIMITS[name]
    if head_dim > most or head_dim % HEAD_DIM_MULTIPLE:
        return (
            f"cannot run head_dim {head_dim}: {source} needs a head dimension <= {most} that "
            f"is a multiple of {HEAD_DIM_MULTIPLE} ({head_dim} % {HEAD_DIM_MULTIPLE} = "
            f"{head_dim % HEAD_DIM_MULTIPLE}); kernel 'efficient' runs multiples of 4 (float32) or 8"
        )
    return None
