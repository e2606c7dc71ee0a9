"""PyTorch's fused flash attention for CUDA (returns the LSE; its backward takes out/LSE)."""

from __future__ import annotations

import torch

from cpbench import compat
from cpbench.attention.kernels import ops
from cpbench.attention.kernels.base import (
    Band,
    _expand_kv,
    _reduce_kv_grad,
    normalize_band,
    refuse_band,
)


def cuda_flash_native_gqa(version: str | None = None) -> bool:
    """Whether this torch's CUDA flash op takes K/V with fewer heads than Q
    (`cpbench.compat.cuda_flash_supports_gqa`)."""
    return compat.cuda_flash_supports_gqa(version)


class CudaSdpaKernel:
    """PyTorch's CUDA flash-attention op (fp16/bf16), which returns the LSE and whose backward
    takes out/LSE. Our [B, S, H, D] tensors go in as [B, H, S, D] views (no copy). GQA: K/V go
    in with their own heads where the op accepts it (`cuda_flash_native_gqa`), else they are
    expanded locally (no communication is affected) and their gradients summed back. The
    backward op also wants the forward's auxiliary outputs (cumulative sequence lengths, RNG
    state): with no varlen and no dropout they do not depend on the block, so the ones of the
    last forward are reused, as PyTorch's own ring does."""

    name = "sdpa"
    supports_band = False
    """Whether a mask band (document / sliding-window piece) can be applied."""

    def __init__(self) -> None:
        self._aux: tuple[torch.Tensor, ...] | None = None

    @staticmethod
    def _kv(x: torch.Tensor, heads: int) -> torch.Tensor:
        return (x if cuda_flash_native_gqa() else _expand_kv(x, heads)).transpose(1, 2)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool,
        scale: float,
        band: Band | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        causal, band = normalize_band(causal, band)
        refuse_band("sdpa (CUDA)", band)
        h = q.shape[2]
        res = ops.call_op(
            "_scaled_dot_product_flash_attention",
            query=q.transpose(1, 2),
            key=self._kv(k, h),
            value=self._kv(v, h),
            dropout_p=0.0,
            is_causal=causal,
            return_debug_mask=False,
            scale=scale,
        )
        self._aux = (res[2], res[3], res[6], res[7])
        return res[0].transpose(1, 2), res[1].float()

    def backward(
        self,
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        causal: bool,
        scale: float,
        band: Band | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        causal, band = normalize_band(causal, band)
        refuse_band("sdpa (CUDA)", band)
        h = q.shape[2]
        if self._aux is None:  # a backward before any forward in this process
            self.forward(q[:, :1], k[:, :1], v[:, :1], False, scale)
        if self._aux is None:  # unreachable: forward sets it
            raise RuntimeError("CudaSdpaKernel.forward did not record its auxiliary outputs")
        cum_q, cum_k, seed, offset = self._aux
        dq, dk, dv = ops.call_op(
            "_scaled_dot_product_flash_attention_backward",
            grad_out=dout.transpose(1, 2),
            query=q.transpose(1, 2),
            key=self._kv(k, h),
            value=self._kv(v, h),
            out=out.transpose(1, 2),
            logsumexp=lse.contiguous(),
            cum_seq_q=cum_q,
            cum_seq_k=cum_k,
            max_q=q.shape[1],
            max_k=k.shape[1],
            dropout_p=0.0,
            is_causal=causal,
            philox_seed=seed,
            philox_offset=offset,
            scale=scale,
        )
        kv_heads = k.shape[2]
        return (
            dq.transpose(1, 2),
            _reduce_kv_grad(dk.transpose(1, 2), kv_heads),
            _reduce_kv_grad(dv.transpose(1, 2), kv_heads),
        )
