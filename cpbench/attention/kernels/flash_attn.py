"""flash-attn (>= 2.7) through its private forward/backward, which take and return the LSE."""

from __future__ import annotations

import torch

from cpbench.attention.kernels.base import Band, normalize_band
from cpbench.attention.kernels.ops import last_dim_contiguous
from cpbench.errors import CpbenchError


def flash_window(sq: int, sk: int, band: Band | None) -> tuple[int, int]:
    """flash-attn's `window_size=(left, right)` for a band: query i sees key j iff
    i + (sk - sq) - left <= j <= i + (sk - sq) + right (relative to the bottom-right diagonal;
    -1 unbounded), so left = (sk - sq) - lo and right = hi - (sk - sq). No band: (-1, -1)."""
    if band is None:
        return -1, -1
    lo, hi = band
    left = -1 if lo is None else (sk - sq) - lo
    right = -1 if hi is None else hi - (sk - sq)
    if (lo is not None and left < 0) or (hi is not None and right < 0):
        raise CpbenchError(
            f"mask band lo ({lo}) <= j - i <= hi ({hi}) on a {sq} x {sk} block gives the "
            f"window (left {left}, right {right}) = ((sk - sq) - lo, hi - (sk - sq)), which "
            f"flash-attn cannot express (negative): crop the block to its band first"
        )
    return left, right


class FlashAttnKernel:
    """The flash-attn package (Dao-AILab) on CUDA: native GQA, [B, S, H, D] layout, LSE out,
    backward with given out/LSE. Its private functions changed signature across releases; the
    calls below are those of 2.7 and 2.8 (older versions are not selected).

    Inputs are handed over as they come when their last dimension is contiguous: flash-attn
    reads any batch/sequence/head strides and copies only a tensor whose `stride(-1) != 1`
    (`maybe_contiguous` in flash_attn_interface.py), so K and V, strided views of the ring's
    packed `[B, S, 2, H, D]` buffer, and row slices of a ring block cost no copy. Only a tensor
    the library would copy anyway is made contiguous here (`last_dim_contiguous`). The LSE
    stays `.contiguous()`: the CUDA kernel indexes it as a dense [B, H, S] array (a slice of
    the ring's LSE is not), and it is S floats per head, not S x D.

    A band (document or sliding-window piece) goes in as `window_size_left/right`
    (`flash_window`, flash-attn >= 2.3) with `causal=False`."""

    name = "flash_attn"
    supports_band = True
    """Whether a mask band (document / sliding-window piece) can be applied."""

    def __init__(self) -> None:
        from flash_attn import flash_attn_interface  # noqa: PLC0415 - optional dependency

        self._fa = flash_attn_interface

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool,
        scale: float,
        band: Band | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        causal, band = normalize_band(causal, band)
        left, right = flash_window(q.shape[1], k.shape[1], band)
        res = self._fa._flash_attn_forward(
            last_dim_contiguous(q),
            last_dim_contiguous(k),
            last_dim_contiguous(v),
            dropout_p=0.0,
            softmax_scale=scale,
            causal=causal,
            window_size_left=left,
            window_size_right=right,
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
        band: Band | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        causal, band = normalize_band(causal, band)
        left, right = flash_window(q.shape[1], k.shape[1], band)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self._fa._flash_attn_backward(
            last_dim_contiguous(dout),
            last_dim_contiguous(q),
            last_dim_contiguous(k),
            last_dim_contiguous(v),
            last_dim_contiguous(out),
            lse.contiguous(),
            dq,
            dk,
            dv,
            dropout_p=0.0,
            softmax_scale=scale,
            causal=causal,
            window_size_left=left,
            window_size_right=right,
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
