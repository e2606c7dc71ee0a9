"""The head-dimension limits of the fused kernels, as their sources state them (pure: no CUDA
query, so a sweep's parent process can apply them before any rank exists).

* flash-attn 2, 2.7.0-2.8.3 (csrc/flash_attn/flash_api.cpp, `mha_fwd` and `mha_bwd`):
  "FlashAttention forward only supports head dimension at most 256" and "... must have a
  head_size that is a multiple of 8". The private `_flash_attn_forward/_backward` cpbench calls
  do not pad; only the autograd wrappers of flash_attn_interface.py do.
* FlashAttention-3 (hopper/flash_api.cpp): `head_size <= max_headdim` (256 in a default build,
  `get_max_headdim`) and "head_size should be a multiple of 8" for fp16/bf16.
* PyTorch's CUDA flash op, called directly (aten/src/ATen/native/transformers/cuda/flash_attn/
  flash_api.cpp `mha_fwd`): "head_size must be a multiple of 8, this is ensured by padding!"
  (the padding is in `scaled_dot_product_attention`, which cpbench does not go through) and at
  most 256.
* cuDNN attention (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp,
  `check_cudnn_tensor_shapes`, `check_cudnn_d256_bprop_head_dim`): a multiple of 8 and at most
  128; more only on sm90 / sm10x with a recent cuDNN *and* a cudnn-frontend PyTorch does not
  report at run time, and then for the backward only at exactly 256 (or 192 with a V of 128).
  cpbench keeps to the bound every supported torch and GPU meets: 128.

* PyTorch's memory-efficient op (sdp_utils.cpp `check_head_dim_size_mem_efficient`,
  `minimum_gemm_alignment`): a head dimension that is a multiple of the GEMM alignment, 4 on
  sm80+ (8 for fp16/bf16, whose tensor cores take 128 bits), 8 for fp16/bf16 on sm70-75, any
  below ("cutlassF: no kernel found to launch!" otherwise). Without a capability (a sweep's
  parent) the sm80+ rule applies.

The einsum kernel takes any head dimension.
"""

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
