"""The einsum kernel: float64-capable, any mask (causal, full or a band), GQA by expanding K/V."""

from __future__ import annotations

import torch

from cpbench.attention.kernels.base import Band, LocalKernel, accumulator_dtype, band_mask


class NaiveKernel(LocalKernel):
    """Plain einsum attention in `accumulator_dtype`: the last resort on any device.
    Materialises the [S_q, S_k] scores, so it is only for small blocks."""

    name = "naive"
    supports_band = True

    def native_gqa(self) -> bool:
        return False

    def _probs(
        self, q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float,
        lse: torch.Tensor | None, band: Band | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        ct = accumulator_dtype(q.dtype)
        scores = torch.einsum("bqhd,bkhd->bhqk", q.to(ct), k.to(ct)) * scale
        if band is None and causal:
            band = (None, 0)  # top-left causal: j - i <= 0
        if band is not None:
            mask = band_mask(q.shape[1], k.shape[1], band, q.device)
            scores = scores.masked_fill(~mask, float("-inf"))
        if lse is None:
            lse = torch.logsumexp(scores, dim=-1)
        probs = torch.exp(scores - lse.to(ct).unsqueeze(-1))
        # Rows that see no key at all have lse = -inf; their probabilities are zero, not NaN.
        probs = torch.nan_to_num(probs, nan=0.0)
        return probs, lse

    def _forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
        band: Band | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        probs, lse = self._probs(q, k, causal, scale, None, band)
        return torch.einsum("bhqk,bkhd->bqhd", probs, v.to(accumulator_dtype(q.dtype))), lse

    def _backward(
        self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        out: torch.Tensor, lse: torch.Tensor, causal: bool, scale: float, band: Band | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        ct = accumulator_dtype(q.dtype)
        probs, _ = self._probs(q, k, causal, scale, lse, band)
        do = dout.to(ct)
        dv = torch.einsum("bhqk,bqhd->bkhd", probs, do)
        dp = torch.einsum("bqhd,bkhd->bhqk", do, v.to(ct))
        delta = (do * out.to(ct)).sum(dim=-1).transpose(1, 2).unsqueeze(-1)  # [B, H, Sq, 1]
        ds = probs * (dp - delta) * scale
        dq = torch.einsum("bhqk,bkhd->bqhd", ds, k.to(ct))
        dk = torch.einsum("bhqk,bqhd->bkhd", ds, q.to(ct))
        return dq, dk, dv
