"""PyTorch's fused flash attention for CUDA (returns the LSE; its backward takes out/LSE)."""

from __future__ import annotations

import torch

from cpbench.attention.kernels.base import _expand_kv, _FlashAux, _reduce_kv_grad


class CudaSdpaKernel:
    """PyTorch's CUDA flash-attention op (fp16/bf16), which returns the LSE and whose backward
    takes out/LSE. GQA: K/V are expanded locally (no communication is affected) and their
    gradients summed back. The backward op also wants the forward's auxiliary outputs
    (cumulative sequence lengths, RNG state): with no varlen and no dropout they do not depend
    on the block, so the ones of the last forward are reused, as PyTorch's own ring does."""

    name = "sdpa"

    def __init__(self) -> None:
        self._aux: _FlashAux | None = None

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h = q.shape[2]
        res = torch.ops.aten._scaled_dot_product_flash_attention(
            q.transpose(1, 2),
            _expand_kv(k, h).transpose(1, 2),
            _expand_kv(v, h).transpose(1, 2),
            0.0,
            causal,
            False,
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
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = q.shape[2]
        if self._aux is None:  # a backward before any forward in this process
            self.forward(q[:, :1], k[:, :1], v[:, :1], False, scale)
        if self._aux is None:  # unreachable: forward sets it
            raise RuntimeError("CudaSdpaKernel.forward did not record its auxiliary outputs")
        cum_q, cum_k, seed, offset = self._aux
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
            dout.transpose(1, 2),
            q.transpose(1, 2),
            _expand_kv(k, h).transpose(1, 2),
            _expand_kv(v, h).transpose(1, 2),
            out.transpose(1, 2),
            lse.contiguous(),
            cum_q,
            cum_k,
            q.shape[1],
            k.shape[1],
            0.0,
            causal,
            seed,
            offset,
            scale=scale,
        )
        kv_heads = k.shape[2]
        return (
            dq.transpose(1, 2),
            _reduce_kv_grad(dk.transpose(1, 2), kv_heads),
            _reduce_kv_grad(dv.transpose(1, 2), kv_heads),
        )
