"""PyTorch's fused flash attention for CUDA (returns the LSE; its backward takes out/LSE)."""

from __future__ import annotations

import torch

from cpbench import compat
from cpbench.attention.kernels import ops
from cpbench.attention.kernels.base import Band, LocalKernel


class CudaSdpaKernel(LocalKernel):
    """PyTorch's CUDA flash-attention op (fp16/bf16) on [B, H, S, D] views. Its backward also
    wants the forward's cumulative lengths and RNG state: with no varlen and no dropout they do
    not depend on the block, so the last forward's are reused, as PyTorch's own ring does."""

    name = "sdpa"
    label = "sdpa (CUDA)"
    bhsd = True
    keeps_rng = True

    def native_gqa(self) -> bool:
        return compat.cuda_flash_supports_gqa()

    def _forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
        band: Band | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        res = ops.call_op(
            "_scaled_dot_product_flash_attention",
            query=q,
            key=k,
            value=v,
            dropout_p=0.0,
            is_causal=causal,
            return_debug_mask=False,
            scale=scale,
        )
        self._rng = (res[2], res[3], res[6], res[7])
        return res[0], res[1]

    def _backward(
        self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        out: torch.Tensor, lse: torch.Tensor, causal: bool, scale: float, band: Band | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        cum_q, cum_k, seed, offset = self._recorded()
        return ops.call_op(
            "_scaled_dot_product_flash_attention_backward",
            grad_out=dout,
            query=q,
            key=k,
            value=v,
            out=out,
            logsumexp=lse,
            cum_seq_q=cum_q,
            cum_seq_k=cum_k,
            max_q=q.shape[2],
            max_k=k.shape[2],
            dropout_p=0.0,
            is_causal=causal,
            philox_seed=seed,
            philox_offset=offset,
            scale=scale,
        )
