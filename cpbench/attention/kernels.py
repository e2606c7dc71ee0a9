"""Local (single-device) attention kernels with one interface: `(out, lse)` forward and a
backward that takes a given `out`/`lse`.

Ring attention computes attention block by block and merges the partial results with their
log-sum-exp (LSE); its backward runs each block's backward against the FINAL output and LSE.
So a kernel here must return the LSE and must accept an externally given out/LSE in backward —
which the fused kernels of flash-attn and PyTorch do, and which the einsum kernel reproduces.

Tensors are `[B, S, H, D]` (`k`/`v` may have fewer heads: GQA); `lse` is `[B, H, S]` float32 in
natural log. `causal=True` is the top-left aligned mask (query row i sees key column j <= i),
which is what every causal ring block needs once the caller has sliced it (see `layouts.py`).
"""

from __future__ import annotations

import functools
import math
from typing import Protocol

import torch

from cpbench.config.vocabulary import BACKENDS

_FlashAux = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
"""(cum_seq_q, cum_seq_k, philox seed, philox offset) of the CUDA flash forward."""


class LocalKernel(Protocol):
    name: str

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

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
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


def _expand_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, S, h_kv, D] -> [B, S, heads, D] by repeating each KV head over its query group."""
    group = heads // x.shape[2]
    return x if group == 1 else x.repeat_interleave(group, dim=2)


def _reduce_kv_grad(dx: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """Sum the gradients of the repeated KV heads back onto the h_kv heads."""
    b, s, h, d = dx.shape
    group = h // kv_heads
    return dx if group == 1 else dx.view(b, s, kv_heads, group, d).sum(dim=3)


def causal_mask(sq: int, sk: int, offset: int, device: torch.device) -> torch.Tensor:
    """Boolean [sq, sk], True where query row i may see key column j: j <= i + offset."""
    rows = torch.arange(sq, device=device).unsqueeze(1)
    cols = torch.arange(sk, device=device).unsqueeze(0)
    return cols <= rows + offset


class NaiveKernel:
    """Plain einsum attention in float32 (or float64 for float64 inputs).

    The last resort on any device and the kernel of the test reference. Materialises the
    [S_q, S_k] score matrix, so it is only for small blocks.
    """

    name = "naive"

    @staticmethod
    def _compute_dtype(x: torch.Tensor) -> torch.dtype:
        return torch.float64 if x.dtype == torch.float64 else torch.float32

    def _probs(
        self, q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float, lse: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ct = self._compute_dtype(q)
        kk = _expand_kv(k, q.shape[2]).to(ct)
        scores = torch.einsum("bqhd,bkhd->bhqk", q.to(ct), kk) * scale
        if causal:
            mask = causal_mask(q.shape[1], k.shape[1], 0, q.device)
            scores = scores.masked_fill(~mask, float("-inf"))
        if lse is None:
            lse = torch.logsumexp(scores, dim=-1)
        probs = torch.exp(scores - lse.to(ct).unsqueeze(-1))
        # Rows that see no key at all have lse = -inf; their probabilities are zero, not NaN.
        probs = torch.nan_to_num(probs, nan=0.0)
        return probs, lse

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ct = self._compute_dtype(q)
        probs, lse = self._probs(q, k, causal, scale, None)
        vv = _expand_kv(v, q.shape[2]).to(ct)
        out = torch.einsum("bhqk,bkhd->bqhd", probs, vv)
        lse_out = lse if ct == torch.float64 else lse.float()
        return out.to(q.dtype), lse_out

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
        ct = self._compute_dtype(q)
        probs, _ = self._probs(q, k, causal, scale, lse)
        vv = _expand_kv(v, q.shape[2]).to(ct)
        kk = _expand_kv(k, q.shape[2]).to(ct)
        do = dout.to(ct)
        dv = torch.einsum("bhqk,bqhd->bkhd", probs, do)
        dp = torch.einsum("bqhd,bkhd->bhqk", do, vv)
        delta = (do * out.to(ct)).sum(dim=-1).transpose(1, 2).unsqueeze(-1)  # [B, H, Sq, 1]
        ds = probs * (dp - delta) * scale
        dq = torch.einsum("bhqk,bkhd->bqhd", ds, kk)
        dk = torch.einsum("bhqk,bqhd->bkhd", ds, q.to(ct))
        kv_heads = k.shape[2]
        return (
            dq.to(q.dtype),
            _reduce_kv_grad(dk, kv_heads).to(k.dtype),
            _reduce_kv_grad(dv, kv_heads).to(v.dtype),
        )


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


class CudaSdpaKernel:
    """PyTorch's CUDA flash-attention op (fp16/bf16), which returns the LSE and whose backward
    takes out/LSE. GQA: K/V are expanded locally (no communication is affected) and their
    gradients summed back. The backward op also wants the forward's auxiliary outputs
    (cumulative sequence lengths, RNG state): with no varlen and no dropout they do not depend
    on the block, so the ones of the last forward are reused, as PyTorch's own ring does."""

    name = "sdpa"

    def __init__(self) -> None:
        self._aux: _FlashAux | None = None

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h = q.shape[2]
        res = torch.ops.aten._scaled_dot_product_flash_attention(
            q.transpose(1, 2),
            _expand_kv(k, h).transpose(1, 2),
            _expand_kv(v, h).transpose(1, 2),
            0.0,
            causal,
            False,
            scale=scale,
        )
        self._aux = (res[2], res[3], res[6], res[7])
        return res[0].transpose(1, 2), res[1].float()

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
        h = q.shape[2]
        if self._aux is None:  # a backward before any forward in this process
            self.forward(q[:, :1], k[:, :1], v[:, :1], False, scale)
        if self._aux is None:  # unreachable: forward sets it
            raise RuntimeError("CudaSdpaKernel.forward did not record its auxiliary outputs")
        cum_q, cum_k, seed, offset = self._aux
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
            dout.transpose(1, 2),
            q.transpose(1, 2),
            _expand_kv(k, h).transpose(1, 2),
            _expand_kv(v, h).transpose(1, 2),
            out.transpose(1, 2),
            lse.contiguous(),
            cum_q,
            cum_k,
            q.shape[1],
            k.shape[1],
            0.0,
            causal,
            seed,
            offset,
            scale=scale,
        )
        kv_heads = k.shape[2]
        return (
            dq.transpose(1, 2),
            _reduce_kv_grad(dk.transpose(1, 2), kv_heads),
            _reduce_kv_grad(dv.transpose(1, 2), kv_heads),
        )


class FlashAttnKernel:
    """The flash-attn package (Dao-AILab) on CUDA: native GQA, [B, S, H, D] layout, LSE out,
    backward with given out/LSE. Its private functions changed signature across releases; the
    calls below are those of 2.7 and 2.8 (older versions are not selected)."""

    name = "flash_attn"

    def __init__(self) -> None:
        from flash_attn import flash_attn_interface  # noqa: PLC0415 - optional dependency

        self._fa = flash_attn_interface

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        res = self._fa._flash_attn_forward(
            q.contiguous(),
            k.contiguous(),
            v.contiguous(),
            dropout_p=0.0,
            softmax_scale=scale,
            causal=causal,
            window_size_left=-1,
            window_size_right=-1,
            softcap=0.0,
            alibi_slopes=None,
            return_softmax=False,
        )
        return res[0], res[1].float()

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
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self._fa._flash_attn_backward(
            dout.contiguous(),
            q.contiguous(),
            k.contiguous(),
            v.contiguous(),
            out.contiguous(),
            lse.contiguous(),
            dq,
            dk,
            dv,
            dropout_p=0.0,
            softmax_scale=scale,
            causal=causal,
            window_size_left=-1,
            window_size_right=-1,
            softcap=0.0,
            alibi_slopes=None,
            deterministic=False,
            rng_state=None,
        )
        return dq, dk, dv


FLASH_ATTN_MIN_VERSION = (2, 7)
"""The private `_flash_attn_forward/_backward` took `window_size_left/right` and returned
(out, lse, ...) from 2.7 on; 2.4-2.6 had a `window_size` tuple and 8 return values."""


def flash_attn_version() -> tuple[int, ...] | None:
    """The installed flash-attn version, or None when it does not import."""
    try:
        import flash_attn  # noqa: PLC0415 - optional dependency
    except ImportError:
        return None
    parts = []
    for piece in str(getattr(flash_attn, "__version__", "0")).split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def flash_attn_available() -> bool:
    """flash-attn is installed in a version whose private API FlashAttnKernel speaks."""
    version = flash_attn_version()
    return version is not None and version >= FLASH_ATTN_MIN_VERSION


@functools.cache
def _kernel_instance(cls: type) -> LocalKernel:
    return cls()


def select_kernel(
    device: torch.device | str, dtype: torch.dtype, name: str = "auto"
) -> LocalKernel:
    """Pick a kernel: flash-attn on CUDA when importable, else the fused SDPA op of the device,
    else einsum. `name` overrides the choice; an impossible override is an error."""
    from cpbench.errors import CpbenchError  # noqa: PLC0415

    device = torch.device(device)
    if name not in BACKENDS:
        raise CpbenchError(f"kernel {name!r} is not one of {', '.join(BACKENDS)}")
    cuda = device.type == "cuda"
    half = dtype in (torch.float16, torch.bfloat16)
    if name == "naive":
        return _kernel_instance(NaiveKernel)
    if name == "flash_attn" or (name == "auto" and cuda and half and flash_attn_available()):
        if not (cuda and half and flash_attn_available()):
            raise CpbenchError(
                f"kernel 'flash_attn' needs CUDA, fp16/bf16 and flash-attn >= 2.7 "
                f"(device {device.type}, dtype {dtype}, installed: {flash_attn_version()}); "
                f"install with: pip install 'cpbench[gpu]'"
            )
        return _kernel_instance(FlashAttnKernel)
    if cuda:
        if half:
            return _kernel_instance(CudaSdpaKernel)
        if name == "sdpa":
            raise CpbenchError(f"kernel 'sdpa' on CUDA needs fp16/bf16, got {dtype}")
        return _kernel_instance(NaiveKernel)
    if dtype == torch.float64 and name == "auto":
        return _kernel_instance(NaiveKernel)
    return _kernel_instance(CpuSdpaKernel)
