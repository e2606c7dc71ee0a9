"""PyTorch's memory-efficient attention for CUDA (`aten._scaled_dot_product_efficient_attention`
and its `_backward`): the fused path for float32 on a GPU, with the LSE out and in, and the
fused kernel that applies a mask band where flash-attn is not installed (an additive bias)."""

from __future__ import annotations

import torch

from cpbench.attention.kernels import ops
from cpbench.attention.kernels.base import Band, LocalKernel, additive_band, visible_rows

EFFICIENT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
"""What the memory-efficient (cutlass) kernels compute in; float64 stays with einsum."""
LSE_ALIGN = 32
"""On CUDA the op pads the LSE's sequence dimension to a multiple of 32 (`kAlignLSE`, see
`meta__scaled_dot_product_efficient_attention` in torch/_meta_registrations.py); on ROCm it
does not."""


BIAS_ALIGN = 16
"""The bias's rows start at multiples of 16 elements: the op wants its row stride a multiple of
the kernel's alignment (`bias_strideM % kAlignmentQ`, 8 in bf16, 4 in float32), and torch's own
`scaled_dot_product_attention` pads a mask for this op to 16 (`pad_bias`, aten
transformers/attention.cpp) and slices it back, as `_bias` does."""


def efficient_unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the memory-efficient kernel cannot run on `device` in `dtype`, None when it can."""
    if device.type != "cuda":
        return f"needs a CUDA device (got {device.type})"
    if dtype not in EFFICIENT_DTYPES:
        return f"needs float32/fp16/bf16 (got {dtype})"
    capability = ops.device_capability(device)
    if dtype == torch.bfloat16 and capability is not None and capability < (8, 0):
        return (  # `less_than_sm80_mem_efficient_dtypes` in aten's cuda/sdp_utils.cpp
            f"computes bf16 only from compute capability 8.0 (this GPU has "
            f"{capability[0]}.{capability[1]}): use fp16 or float32"
        )
    return None


class EfficientKernel(LocalKernel):
    """PyTorch's memory-efficient attention (float32, fp16, bf16 on CUDA): O(S) memory, so
    float32 on a GPU never falls back to the einsum kernel's S^2 scores. The LSE comes back
    padded (`LSE_ALIGN`); the backward gets it padded the same way. A band goes in as the op's
    `attn_bias`, broadcast over batch and heads (strides 0, which the op takes); rows that see
    no key get out 0 and LSE -inf, as the merge expects, and the backward reads such an LSE
    as 0, so their probabilities are exp(-inf) = 0, not NaN."""

    name = "efficient"
    bhsd = True
    keeps_rng = True
    supports_band = True

    def __init__(self) -> None:
        self._lse_align = 1 if torch.version.hip else LSE_ALIGN  # until a forward shows it

    def native_gqa(self) -> bool:
        """In no release read: its kernel wants equal head counts, and
        `scaled_dot_product_attention(enable_gqa=True)` never routes GQA to it."""
        return False

    def _forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
        band: Band | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        sq = q.shape[2]
        res = ops.call_op(
            "_scaled_dot_product_efficient_attention",
            query=q,
            key=k,
            value=v,
            attn_bias=self._bias(q, k, band),
            compute_log_sumexp=True,
            dropout_p=0.0,
            is_causal=causal,
            scale=scale,
        )
        out, lse = res[0], res[1]
        self._rng = (res[2], res[3])
        if lse.shape[-1] != sq or sq % LSE_ALIGN:  # an S that tells whether it pads
            self._lse_align = LSE_ALIGN if lse.shape[-1] != sq else 1
        if band is not None:
            first, stop = visible_rows(sq, k.shape[2], band)
            if first > 0 or stop < sq:
                out, lse = out.clone(), lse.clone()
                for rows in (slice(0, first), slice(stop, sq)):
                    out[:, :, rows] = 0
                    lse[:, :, rows] = float("-inf")
        return out, lse  # `forward` keeps the first S entries

    @staticmethod
    def _bias(q: torch.Tensor, k: torch.Tensor, band: Band | None) -> torch.Tensor | None:
        """The band as the op's additive bias (`BIAS_ALIGN`), None without one."""
        if band is None:
            return None
        (b, h, sq, _), sk = q.shape, k.shape[2]
        return additive_band(sq, sk, band, q.dtype, q.device, BIAS_ALIGN).expand(b, h, sq, sk)

    def _padded_lse(self, lse: torch.Tensor) -> torch.Tensor:
        """The dense [B, H, S] LSE as the op's backward reads it: padded like the forward's."""
        sq = lse.shape[-1]
        padded = -(-sq // self._lse_align) * self._lse_align
        if padded == sq:
            return lse
        buffer = lse.new_zeros((*lse.shape[:-1], padded))
        buffer[..., :sq] = lse
        return buffer

    def _backward(
        self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        out: torch.Tensor, lse: torch.Tensor, causal: bool, scale: float, band: Band | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        seed, offset = self._recorded()
        if band is not None:  # a row that saw no key: exp(score - 0) of -inf scores is 0
            lse = lse.masked_fill(lse == float("-inf"), 0.0)
        dq, dk, dv = ops.call_op(
            "_scaled_dot_product_efficient_attention_backward",
            grad_out_=dout,
            query=q,
            key=k,
            value=v,
            attn_bias=self._bias(q, k, band),
            out=out,
            logsumexp=self._padded_lse(lse),
            philox_seed=seed,
            philox_offset=offset,
            dropout_p=0.0,
            grad_input_mask=[True, True, True, False],
            is_causal=causal,
            scale=scale,
        )[:3]
        return dq, dk, dv
