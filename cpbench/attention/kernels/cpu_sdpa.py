"""PyTorch's fused flash attention for CPU (returns the LSE; its backward takes out/LSE)."""

from __future__ import annotations

import torch


class CpuSdpaKernel:
    """PyTorch's fused flash attention for CPU, which returns the LSE and whose backward takes
    out/LSE: `aten._scaled_dot_product_flash_attention_for_cpu(_backward)`. Handles GQA itself.
    The op takes [B, H, S, D]; our [B, S, H, D] tensors transpose into it for free and its
    output comes back in [B, S, H, D] memory order. In fp32 the op runs as fast on those
    strided views; in bf16/fp16 its backward is ~1.4x slower on them, so low-precision inputs
    are made contiguous first (a copy linear in S, against attention's S^2)."""

    name = "sdpa"

    @staticmethod
    def _bhsd(x: torch.Tensor) -> torch.Tensor:
        x = x.transpose(1, 2)
        return x if x.dtype == torch.float32 else x.contiguous()

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            self._bhsd(q), self._bhsd(k), self._bhsd(v), 0.0, causal, scale=scale
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
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            self._bhsd(dout),
            self._bhsd(q),
            self._bhsd(k),
            self._bhsd(v),
            self._bhsd(out),
            lse.contiguous(),
            0.0,
            causal,
            scale=scale,
        )
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)
