"""Single-process reference attention (einsum, float64 by default) for checking CP results."""

from __future__ import annotations

import torch

from cpbench.attention.kernels import NaiveKernel, causal_mask, default_scale


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = True,
    scale: float | None = None,
    causal_offset: int = 0,
) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v over global tensors `[B, L, h, D]`, GQA included, with
    autograd. `causal_offset` shifts the diagonal: query i sees key j iff j <= i + offset
    (0 = top-left, Sk - Sq = bottom-right)."""
    scale = scale or default_scale(q.shape[-1])
    kk = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    vv = v.repeat_interleave(q.shape[2] // v.shape[2], dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    if causal:
        mask = causal_mask(q.shape[1], k.shape[1], causal_offset, q.device)
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
    return torch.einsum("bhqk,bkhd->bqhd", probs, vv)


__all__ = ["NaiveKernel", "reference_attention"]
