"""Single-process reference attention (einsum, float64 by default) for checking CP results."""

from __future__ import annotations

import torch

from cpbench.attention.kernels import causal_mask, default_scale
from cpbench.config.masks import MaskSpec
from cpbench.errors import CpbenchError


def dense_mask(mask: MaskSpec, seq_len: int, device: torch.device | None = None) -> torch.Tensor:
    """Boolean [L, L], True where query q may see key k: `MaskSpec.visible`, vectorised
    (causal, documents, window); `row_visibility` of every row."""
    return row_visibility(mask, torch.arange(seq_len, device=device), seq_len)


def row_visibility(mask: MaskSpec, rows: torch.Tensor, run_len: int) -> torch.Tensor:
    """Boolean [len(rows), run_len]: may query `rows[i]` see key k (`MaskSpec.visible`,
    vectorised: causal, documents, window)."""
    mask = mask.for_length(run_len)
    keys = torch.arange(run_len, device=rows.device)
    if not mask.causal:
        return torch.ones(rows.numel(), run_len, dtype=torch.bool, device=rows.device)
    q, k = rows.unsqueeze(1), keys.unsqueeze(0)
    keep = k <= q
    if mask.window is not None:
        keep &= q - k < mask.window
    if mask.has_documents:
        starts = torch.tensor(mask.starts[1:], device=rows.device)
        doc_k = torch.bucketize(keys, starts, right=True)
        doc_q = torch.bucketize(rows, starts, right=True)
        keep &= doc_q.unsqueeze(1) == doc_k.unsqueeze(0)
    return keep


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = True,
    scale: float | None = None,
    causal_offset: int = 0,
    mask: MaskSpec | None = None,
) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v over global tensors `[B, L, h, D]`, GQA included, with
    autograd. `causal_offset` shifts the diagonal: query i sees key j iff j <= i + offset
    (0 = top-left, Sk - Sq = bottom-right). `mask` (documents, window) replaces `causal` and
    needs square scores and no offset; its documents must fill L."""
    scale = default_scale(q.shape[-1], scale)
    kk = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    vv = v.repeat_interleave(q.shape[2] // v.shape[2], dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    if mask is not None:
        if q.shape[1] != k.shape[1] or causal_offset:
            raise CpbenchError(
                f"a mask ({mask.label}) needs as many queries ({q.shape[1]}) as keys "
                f"({k.shape[1]}) and causal_offset 0 (got {causal_offset})"
            )
        if mask.causal != causal and not causal:
            raise CpbenchError(f"causal=False contradicts the mask {mask.label!r}")
        keep = dense_mask(mask, q.shape[1], q.device)
        if not bool(keep.all()):
            scores = scores.masked_fill(~keep, float("-inf"))
    elif causal:
        keep = causal_mask(q.shape[1], k.shape[1], causal_offset, q.device)
        scores = scores.masked_fill(~keep, float("-inf"))
    probs = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
    return torch.einsum("bhqk,bkhd->bqhd", probs, vv)
