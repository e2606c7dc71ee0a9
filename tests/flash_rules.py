"""Stand-ins for flash-attn 2 and FlashAttention-3 that follow the libraries' source-level rules,
computed densely on the CPU (float64), each rule citing where it comes from:

* Window clamping, flash-attn 2 (csrc/flash_attn/flash_api.cpp, `mha_fwd` / `mha_bwd`): a
  window >= seqlen_k becomes -1; `is_causal` sets the right window to 0. Then
  `set_params_fprop`: `is_causal = left < 0 && right == 0`, and a -1 side becomes seqlen_k when
  the other is >= 0. FA3's 2024 betas clamp the same way.
* Window clamping, FlashAttention-3 from 2025 (hopper/flash_api.cpp): left >= seqlen_k - 1 and
  right >= seqlen_q - 1 become -1, and `set_params_fprop` turns -1 into seqlen_k - 1 /
  seqlen_q - 1.
* The mask (csrc/flash_attn/src/mask.h, hopper/mask.h): row i sees key j iff
  `j < i + 1 + sk - sq + right` and, unless causal, `j >= i + sk - sq - left`; with both
  windows -1 and not causal, every key.
* An empty row (csrc/flash_attn/src/softmax.h, `normalize_softmax_lse`: a zero sum gives
  INFINITY): out 0, LSE = +inf.
* Capability (flash_api.cpp `mha_fwd` / `mha_bwd`): "FlashAttention only supports Ampere GPUs
  or newer." Up to 2.7.2.post1 the check is `is_sm8x = major == 8 && minor >= 0; is_sm90 =
  major == 9 && minor == 0; TORCH_CHECK(is_sm90 || is_sm8x, ...)` (so sm100 / sm120 are
  refused with that message); from 2.7.3 (commit bbb21d65) it is `cc_major >= 8`.
* Dtype (flash_api.cpp `mha_fwd`): "FlashAttention only support fp16 and bf16 data type";
  applied when `half_only` (the verify run on CPU checks the mask in float32 and turns it off).
* Head dimension (flash_api.cpp `mha_fwd` of 2.7.0-2.8.3): "FlashAttention forward only
  supports head dimension at most 256", "... must have a head_size that is a multiple of 8".
"""

from __future__ import annotations

import functools
from typing import Any

import torch

FA2, FA3 = "fa2", "fa3"


def windows(rule: str, sq: int, sk: int, causal: bool, left: int, right: int) -> tuple[bool, int, int]:
    """(causal, left, right) as the kernel sees them after the library's clamping."""
    if rule == FA2:  # flash_api.cpp mha_fwd, then set_params_fprop
        left = -1 if left >= sk else left
        right = -1 if right >= sk else right
        causal = causal and sq != 1
        if causal:
            right = 0
        causal = left < 0 and right == 0
        if left < 0 and right >= 0:
            left = sk
        if left >= 0 and right < 0:
            right = sk
        return causal, left, right
    # hopper/flash_api.cpp mha_fwd, then set_params_fprop
    left = -1 if left >= sk - 1 else left
    right = -1 if right >= sq - 1 else right
    if causal:
        right = 0
    causal = left < 0 and right == 0
    local = (left >= 0 or right >= 0) and not causal
    if not (causal or local):
        return False, -1, -1
    return causal, sk - 1 if left < 0 else left, sq - 1 if right < 0 else right


def limits(rule: str, sq: int, sk: int, causal: bool, left: int, right: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row i, the keys [first_i, stop_i) it sees under `rule`: mask.h's
    `col_idx_limit_left = max(0, i + sk - sq - left)` (not for causal) and
    `col_idx_limit_right = min(sk, i + 1 + sk - sq + right)`; every key when neither
    causal nor local."""
    causal, left, right = windows(rule, sq, sk, causal, left, right)
    i = torch.arange(sq)
    if (left, right) == (-1, -1) and not causal:
        return torch.zeros(sq, dtype=torch.long), torch.full((sq,), sk)
    first = torch.zeros(sq, dtype=torch.long) if causal else (i + sk - sq - left).clamp(min=0)
    return first, (i + 1 + sk - sq + right).clamp(max=sk)


def visible(rule: str, sq: int, sk: int, causal: bool, left: int, right: int) -> torch.Tensor:
    """Boolean [sq, sk]: the keys each row sees under `rule` (`limits`)."""
    first, stop = limits(rule, sq, sk, causal, left, right)
    j = torch.arange(sk).unsqueeze(0)
    return (j >= first.unsqueeze(1)) & (j < stop.unsqueeze(1))


@functools.lru_cache(maxsize=4096)
def _hidden(rule: str, sq: int, sk: int, causal: bool, left: int, right: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the keys each row does not see, [sq, sk]; the rows that see none, [sq]) under `rule`:
    `visible` negated, once per call signature (a ring runs the same few piece shapes many
    times; the tensors are only read)."""
    mask = visible(rule, sq, sk, causal, left, right)
    return ~mask, ~mask.any(dim=1)


def _scores(q: torch.Tensor, k: torch.Tensor, hidden: torch.Tensor, scale: float) -> torch.Tensor:
    """[B, S, H, D] queries, [B, S, Hk, D] keys -> float64 masked scores [B, Hk, G, Sq, Sk]:
    the G = H / Hk query heads of a KV head grouped next to it (GQA without copying K)."""
    b, sq, h, d = q.shape
    group = h // k.shape[2]
    qd = q.double().permute(0, 2, 1, 3).reshape(b, k.shape[2], group, sq, d)
    kd = k.double().permute(0, 2, 3, 1).unsqueeze(2)  # [B, Hk, 1, D, Sk]
    return (qd @ kd * scale).masked_fill(hidden, float("-inf"))


def _grouped(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """[B, S, H, D] -> float64 [B, Hk, G, S, D] (the layout of `_scores`)."""
    b, s, h, d = x.shape
    return x.double().permute(0, 2, 1, 3).reshape(b, kv_heads, h // kv_heads, s, d)


def _ungrouped(x: torch.Tensor) -> torch.Tensor:
    """[B, Hk, G, S, D] -> [B, S, H, D]."""
    b, hk, g, s, d = x.shape
    return x.reshape(b, hk * g, s, d).transpose(1, 2)


class Library:
    """`_flash_attn_forward` / `_flash_attn_backward` of flash-attn 2.7 (`rule` FA2) computed
    densely with the library's mask; `calls` records (sq, sk, causal, left, right)."""

    def __init__(
        self,
        rule: str = FA2,
        capability: tuple[int, int] = (9, 0),
        version: tuple[int, int, int] = (2, 8, 3),
        half_only: bool = False,
    ) -> None:
        self.rule, self.capability, self.version = rule, capability, version
        self.half_only = half_only
        self.calls: list[tuple[int, int, bool, int, int]] = []

    def _check(self, q: torch.Tensor) -> None:
        major, minor = self.capability
        if self.version < (2, 7, 3):  # flash_api.cpp 2.6.3 - 2.7.2.post1: is_sm8x || is_sm90
            admitted = major == 8 or (major == 9 and minor == 0)
        else:  # 2.7.3 on: is_sm8x_min = cc_major >= 8
            admitted = major >= 8
        if not admitted:
            raise RuntimeError("FlashAttention only supports Ampere GPUs or newer.")
        if self.half_only and q.dtype not in (torch.float16, torch.bfloat16):
            raise RuntimeError("FlashAttention only support fp16 and bf16 data type")
        head_size = q.shape[-1]
        if head_size > 256:
            raise RuntimeError("FlashAttention forward only supports head dimension at most 256")
        if head_size % 8:
            raise RuntimeError(
                "query, key, value, and out_ must have a head_size that is a multiple of 8"
            )

    def attend(self, q, k, v, scale, causal, left, right):  # type: ignore[no-untyped-def]
        self._check(q)
        sq, sk, kv_heads = q.shape[1], k.shape[1], k.shape[2]
        self.calls.append((sq, sk, causal, left, right))
        hidden, empty = _hidden(self.rule, sq, sk, causal, left, right)
        s = _scores(q, k, hidden, scale)
        lse = torch.logsumexp(s, dim=-1, keepdim=True)
        p = torch.exp(s - lse).nan_to_num_(0.0)
        out = _ungrouped(p @ _grouped(v, kv_heads)).to(q.dtype)
        lse = lse.reshape(q.shape[0], q.shape[2], sq)
        lse = lse.masked_fill(empty, float("inf"))  # softmax.h: empty row -> +inf
        return out, lse.float()

    def grads(self, dout, q, k, v, out, lse, scale, causal, left, right):  # type: ignore[no-untyped-def]
        self._check(q)
        b, sq, h, _ = q.shape
        sk, kv_heads = k.shape[1], k.shape[2]
        hidden, _ = _hidden(self.rule, sq, sk, causal, left, right)
        s = _scores(q, k, hidden, scale)
        p = torch.exp(s - lse.double().reshape(b, kv_heads, h // kv_heads, sq, 1)).nan_to_num_(0.0)
        do, o = _grouped(dout, kv_heads), _grouped(out, kv_heads)
        qd, kd, vd = _grouped(q, kv_heads), _grouped(k, kv_heads), _grouped(v, kv_heads)
        dp = do @ vd.transpose(-1, -2)
        ds = p * (dp - (do * o).sum(-1, keepdim=True))
        dq = ds @ kd * scale
        # dK, dV: a sum over the group's query heads (the KV head's G copies in flash-attn)
        dk = (ds.transpose(-1, -2) @ qd).sum(2) * scale
        dv = (p.transpose(-1, -2) @ do).sum(2)
        return _ungrouped(dq), dk.transpose(1, 2), dv.transpose(1, 2)

    # flash-attn 2.7 / 2.8's private API (flash_attn/flash_attn_interface.py)
    def _flash_attn_forward(self, q, k, v, dropout_p, softmax_scale, causal, window_size_left,  # type: ignore[no-untyped-def]
                            window_size_right, softcap, alibi_slopes, return_softmax):  # fmt: skip
        out, lse = self.attend(q, k, v, softmax_scale, causal, window_size_left, window_size_right)
        return out, lse, None, None

    def _flash_attn_backward(self, dout, q, k, v, out, lse, dq, dk, dv, dropout_p,  # type: ignore[no-untyped-def]
                             softmax_scale, causal, window_size_left, window_size_right,
                             softcap, alibi_slopes, deterministic, rng_state):  # fmt: skip
        grads = self.grads(dout, q, k, v, out, lse, softmax_scale, causal, window_size_left,
                           window_size_right)  # fmt: skip
        for buffer, grad in zip((dq, dk, dv), grads, strict=True):
            buffer.copy_(grad)


def fa3_module(release: str, library: Library) -> Any:
    """FA3's `flash_attn_interface` of one release over `library`'s rules: "2024-07" (before
    the window, 2024-08-29), "2024-beta" (`window_size` tuple, FA2's clamping, 7-tuple out) and
    "2026" (`window_size_left/right`, FA3's clamping)."""
    import types  # noqa: PLC0415

    def write(grads: tuple[torch.Tensor, ...], *buffers: torch.Tensor) -> None:
        for buffer, grad in zip(buffers, grads, strict=True):
            buffer.copy_(grad)

    if release == "2024-07":
        def fwd(q, k, v, softmax_scale, causal):  # type: ignore[no-untyped-def]
            out, lse = library.attend(q, k, v, softmax_scale, causal, -1, -1)
            return out, q, k, v, out, lse, None

        def bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, softmax_scale, causal):  # type: ignore[no-untyped-def]
            write(library.grads(dout, q, k, v, out, softmax_lse, softmax_scale, causal, -1, -1),
                  dq, dk, dv)  # fmt: skip
    elif release == "2024-beta":
        def fwd(q, k, v, softmax_scale, causal, window_size):  # type: ignore[no-untyped-def]
            out, lse = library.attend(q, k, v, softmax_scale, causal, *window_size)
            return out, q, k, v, out, lse, None

        def bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, softmax_scale, causal, window_size):  # type: ignore[no-untyped-def]
            write(library.grads(dout, q, k, v, out, softmax_lse, softmax_scale, causal,
                                *window_size), dq, dk, dv)  # fmt: skip
    else:
        def fwd(q, k, v, k_new=None, out_=None, softmax_scale=None, causal=False,  # type: ignore[no-untyped-def]
                window_size_left=-1, window_size_right=-1):  # fmt: skip
            out, lse = library.attend(q, k, v, softmax_scale, causal, window_size_left,
                                      window_size_right)  # fmt: skip
            return out, lse, None, None

        def bwd(dout, q, k, v, out, softmax_lse, dq=None, dk=None, dv=None, softmax_scale=None,  # type: ignore[no-untyped-def]
                is_causal=False, window_size_left=-1, window_size_right=-1):  # fmt: skip
            write(library.grads(dout, q, k, v, out, softmax_lse, softmax_scale, is_causal,
                                window_size_left, window_size_right), dq, dk, dv)  # fmt: skip

    return types.SimpleNamespace(_flash_attn_forward=fwd, _flash_attn_backward=bwd)
