"""The private flash-attn functions that ring-flash-attention and yunchang call, on the CPU.

Signatures and return values are those of flash-attn 2.7 / 2.8 (`_flash_attn_forward` returns
`(out, softmax_lse, S_dmask, rng_state)` with `softmax_lse [B, H, S]` float32;
`_flash_attn_backward` writes dq / dk / dv into the given tensors, which may be strided views,
and returns `softmax_d`). Tensors are `[B, S, H, D]`; K/V may have fewer heads (GQA), which
the stand-in expands before the CPU op (whose own GQA is wrong in torch 2.6).

Causal masks: flash-attn aligns the causal diagonal to the bottom right when the query and key
lengths differ (query i sees key j iff j <= i + Sk - Sq). The CPU op's `is_causal` is top-left,
so equal lengths (every causal call ring-flash-attention 0.1.8 and yunchang 0.6.4 make) use
`is_causal`, and unequal lengths an explicit additive bottom-right mask. Sq > Sk under a causal
mask leaves query rows without any key; the libraries never ask for it and it is refused.

Like flash-attn, the stand-in takes fp16/bf16 only (the ring code of both libraries relies on
it: for float32 `block_dq_buffer.to(torch.float32)` is the buffer itself, not a copy). Dropout,
sliding windows, softcapping and ALiBi are refused (the adapters never use them).
"""

from __future__ import annotations

import torch

_FWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_BWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _refuse_unsupported(q, dropout_p, window_left, window_right, softcap, alibi_slopes) -> None:  # type: ignore[no-untyped-def]
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise RuntimeError("FlashAttention only support fp16 and bf16 data type (stand-in)")
    if dropout_p:
        raise NotImplementedError(f"flash_attn stand-in: dropout_p={dropout_p} is not supported")
    if (window_left, window_right) != (-1, -1):
        raise NotImplementedError("flash_attn stand-in: sliding windows are not supported")
    if softcap:
        raise NotImplementedError(f"flash_attn stand-in: softcap={softcap} is not supported")
    if alibi_slopes is not None:
        raise NotImplementedError("flash_attn stand-in: alibi_slopes are not supported")


def _mask(q: torch.Tensor, k: torch.Tensor, causal: bool) -> tuple[bool, torch.Tensor | None]:
    """(is_causal for the CPU op, additive mask or None) reproducing flash-attn's causal."""
    sq, sk = q.shape[1], k.shape[1]
    if not causal or sq == sk:
        return causal, None
    if sq > sk:
        raise NotImplementedError(
            f"flash_attn stand-in: causal with more queries ({sq}) than keys ({sk})"
        )
    rows = torch.arange(sq, device=q.device).unsqueeze(1)
    cols = torch.arange(sk, device=q.device).unsqueeze(0)
    hidden = cols > rows + (sk - sq)
    return False, torch.zeros(sq, sk, dtype=q.dtype, device=q.device).masked_fill(
        hidden, float("-inf")
    )


def _heads_first(x: torch.Tensor, heads: int | None = None) -> torch.Tensor:
    """[B, S, h, D] -> [B, h, S, D]; K/V with fewer heads than `heads` (GQA) are expanded
    first: the CPU op handles GQA itself only in newer torch (2.6's gives wrong results)."""
    group = 1 if heads is None else heads // x.shape[2]
    x = x if group == 1 else x.repeat_interleave(group, dim=2)
    return x.transpose(1, 2)


def _kv_grad(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """The CPU op's [B, H, S, D] gradient of expanded K/V -> [B, S, h_kv, D], summed."""
    b, h, s, d = grad.shape
    grad = grad.transpose(1, 2)
    return grad if h == kv_heads else grad.reshape(b, s, kv_heads, h // kv_heads, d).sum(3)


def _flash_attn_forward(
    q,
    k,
    v,
    dropout_p,
    softmax_scale,
    causal,
    window_size_left=-1,
    window_size_right=-1,
    softcap=0.0,
    alibi_slopes=None,
    return_softmax=False,
):  # type: ignore[no-untyped-def]
    _refuse_unsupported(q, dropout_p, window_size_left, window_size_right, softcap, alibi_slopes)
    is_causal, mask = _mask(q, k, causal)
    heads = q.shape[2]
    out, lse = _FWD(
        _heads_first(q),
        _heads_first(k, heads),
        _heads_first(v, heads),
        0.0,
        is_causal,
        attn_mask=mask,
        scale=softmax_scale,
    )
    rng_state = torch.zeros(2, dtype=torch.int64)
    return out.transpose(1, 2), lse, None, rng_state


def _flash_attn_backward(
    dout,
    q,
    k,
    v,
    out,
    softmax_lse,
    dq,
    dk,
    dv,
    dropout_p,
    softmax_scale,
    causal,
    window_size_left=-1,
    window_size_right=-1,
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    rng_state=None,
):  # type: ignore[no-untyped-def]
    _refuse_unsupported(q, dropout_p, window_size_left, window_size_right, softcap, alibi_slopes)
    is_causal, mask = _mask(q, k, causal)
    heads = q.shape[2]
    grad_q, grad_k, grad_v = _BWD(
        _heads_first(dout),
        _heads_first(q),
        _heads_first(k, heads),
        _heads_first(v, heads),
        _heads_first(out),
        softmax_lse.contiguous(),
        0.0,
        is_causal,
        attn_mask=mask,
        scale=softmax_scale,
    )
    dq.copy_(grad_q.transpose(1, 2))
    dk.copy_(_kv_grad(grad_k, k.shape[2]))
    dv.copy_(_kv_grad(grad_v, v.shape[2]))
    # softmax_d: rowsum(dout * out), [B, H, S] float32, as flash-attn returns it.
    return (dout.float() * out.float()).sum(dim=-1).transpose(1, 2).contiguous()


def _not_in_stand_in(name: str):  # type: ignore[no-untyped-def]
    def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise NotImplementedError(
            f"flash_attn stand-in: {name} is imported by the libraries but never called by "
            f"cpbench's adapters"
        )

    refuse.__name__ = name
    return refuse


# Imported at module import time by ring-flash-attention (varlen modules) and yunchang
# (`from flash_attn import flash_attn_func`), never called by the adapters.
_flash_attn_varlen_forward = _not_in_stand_in("_flash_attn_varlen_forward")
_flash_attn_varlen_backward = _not_in_stand_in("_flash_attn_varlen_backward")
flash_attn_func = _not_in_stand_in("flash_attn_func")
