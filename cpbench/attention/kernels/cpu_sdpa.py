"""PyTorch's fused flash attention for CPU (returns the LSE; its backward takes out/LSE)."""

from __future__ import annotations

import torch

from cpbench.attention.kernels.base import Band, LocalKernel, band_mask
from cpbench.compat import cpu_flash_supports_gqa


class CpuSdpaKernel(LocalKernel):
    """PyTorch's fused flash attention for CPU, which returns the LSE and whose backward takes
    out/LSE: `aten._scaled_dot_product_flash_attention_for_cpu(_backward)`.

    GQA (fewer K/V heads than query heads): passed to the op as is where it handles GQA itself
    (torch 2.9+, `cpbench.compat.cpu_flash_supports_gqa`); on older torch, whose op silently
    reads and writes past the K/V heads, K/V are expanded to the query's heads before the op
    and the gradient copies of each K/V head summed back after its backward.
    The op takes [B, H, S, D]; our [B, S, H, D] tensors transpose into it for free and its
    output comes back in [B, S, H, D] memory order. In fp32 the op runs as fast on those
    strided views; in bf16/fp16 its backward is ~1.4x slower on them, so low-precision inputs
    are made contiguous first (a copy linear in S, against attention's S^2).

    A band (a document or sliding-window piece that is neither full nor top-left causal) goes
    in as the op's `attn_mask`, a float additive mask (0 visible, -inf hidden) of the query
    dtype: the op rejects a bool mask, and the float one is right forward and backward on
    torch 2.5.1 and 2.13 (tests/test_kernels.py). It is built only for band pieces."""

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
        keep = band_mask(q.shape[2], k.shape[2], band, q.device)
        return torch.zeros(keep.shape, dtype=q.dtype, device=q.device).masked_fill(
            ~keep, float("-inf")
        )

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
