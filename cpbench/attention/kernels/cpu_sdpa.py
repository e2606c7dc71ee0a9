"""PyTorch's fused flash attention for CPU (returns the LSE; its backward takes out/LSE)."""

from __future__ import annotations

import torch

from cpbench.attention.kernels.base import Band, LocalKernel, additive_band
from cpbench.compat import cpu_flash_supports_gqa


class CpuSdpaKernel(LocalKernel):
    """`aten._scaled_dot_product_flash_attention_for_cpu(_backward)`: LSE out, out/LSE in.

    GQA native from torch 2.9 (`cpbench.compat.cpu_flash_supports_gqa`); older ops silently
    read and write past the K/V heads, so K/V are expanded there. Inputs go in as [B, H, S, D]
    views, except bf16/fp16 ones, made contiguous first: the op's backward is ~1.4x slower on
    the strided views (a copy linear in S, against attention's S^2). A band goes in as the
    op's `attn_mask`, a float additive mask of the query dtype (the op rejects a bool one; the
    float one is right forward and backward on torch 2.5.1 and 2.13, tests/test_kernels.py)."""

    name = "sdpa"
    supports_band = True
    bhsd = True

    def native_gqa(self) -> bool:
        return cpu_flash_supports_gqa()

    def _layout(self, x: torch.Tensor) -> torch.Tensor:
        x = x.transpose(1, 2)
        return x if x.dtype == torch.float32 else x.contiguous()

    @staticmethod
    def _additive(q: torch.Tensor, k: torch.Tensor, band: Band | None) -> torch.Tensor | None:
        if band is None:
            return None
        return additive_band(q.shape[2], k.shape[2], band, q.dtype, q.device)

    def _forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
        band: Band | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=self._additive(q, k, band), scale=scale
        )

    def _backward(
        self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        out: torch.Tensor, lse: torch.Tensor, causal: bool, scale: float, band: Band | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        mask = self._additive(q, k, band)
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, k, v, out, lse, 0.0, causal, attn_mask=mask, scale=scale
        )
