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

PyTorch's memory-efficient op and the einsum kernel take any head dimension.
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
