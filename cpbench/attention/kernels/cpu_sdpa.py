"""PyTorch's fused flash attention for CPU (returns the LSE; its backward takes out/LSE)."""

from __future__ import annotations

import torch

from cpbench.attention.kernels.base import (
    Band,
    _expand_kv,
    _reduce_kv_grad,
    band_mask,
    normalize_band,
)
from cpbench.compat import cpu_flash_supports_gqa


class CpuSdpaKernel:
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
    """Whether a mask band (document / sliding-window piece) can be applied."""

    @staticmethod
    def _bhsd(x: torch.Tensor) -> torch.Tensor:
        x = x.transpose(1, 2)
        return x if x.dtype == torch.float32 else x.contiguous()

    @staticmethod
    def _kv(x: torch.Tensor, heads: int) -> torch.Tensor:
        """K or V as this torch's op can take them: expanded to `heads` where it has no GQA."""
        if x.shape[2] == heads or cpu_flash_supports_gqa():
            return x
        return _expand_kv(x, heads)

    @staticmethod
    def _additive(q: torch.Tensor, k: torch.Tensor, band: Band | None) -> torch.Tensor | None:
        if band is None:
            return None
        keep = band_mask(q.shape[1], k.shape[1], band, q.device)
        return torch.zeros(keep.shape, dtype=q.dtype, device=q.device).masked_fill(
            ~keep, float("-inf")
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool,
        scale: float,
        band: Band | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        heads = q.shape[2]
        causal, band = normalize_band(causal, band)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            self._bhsd(q),
            self._bhsd(self._kv(k, heads)),
            self._bhsd(self._kv(v, heads)),
            0.0,
            causal,
            attn_mask=self._additive(q, k, band),
            scale=scale,
        )
        return out.transpose(1, 2), lse

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
        heads, kv_heads = q.shape[2], k.shape[2]
        causal, band = normalize_band(causal, band)
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            self._bhsd(dout),
            self._bhsd(q),
            self._bhsd(self._kv(k, heads)),
            self._bhsd(self._kv(v, heads)),
            self._bhsd(out),
            lse.contiguous(),
            0.0,
            causal,
            attn_mask=self._additive(q, k, band),
            scale=scale,
        )
        # Where K/V were expanded, dk/dv have one copy per query head: sum each group back
        # (a no-op where the op handled GQA itself and returned H_kv heads).
        return (
            dq.transpose(1, 2),
            _reduce_kv_grad(dk.transpose(1, 2), kv_heads),
            _reduce_kv_grad(dv.transpose(1, 2), kv_heads),
        )
