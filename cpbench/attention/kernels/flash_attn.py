"""flash-attn (>= 2.7) through its private forward/backward, which take and return the LSE."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cpbench.attention.kernels.base import Band, LocalKernel, normalize_band, visible_rows
from cpbench.attention.kernels.ops import last_dim_contiguous


@dataclass(frozen=True)
class FlashCall:
    """One flash-attn call of a band piece: query rows `rows` against key columns `cols`, with
    `window_size = (left, right)` in that sub-block's coordinates (-1: no bound)."""

    rows: slice
    cols: slice
    left: int
    right: int


def flash_calls(sq: int, sk: int, band: Band) -> tuple[FlashCall, ...]:
    """The calls whose windows make exactly the mask `lo <= j - i <= hi` of a `sq x sk` piece,
    under flash-attn's own arithmetic (csrc/flash_attn/flash_api.cpp, src/mask.h): row i sees
    keys `i + sk - sq - left <= j < i + 1 + sk - sq + right`, and a window >= sk is first
    turned into -1, which becomes sk when the other side is bounded. A right window therefore
    reaches at most key `i + 2 sk - sq`: a block with more rows than `sk + 1` cannot have an
    unbounded (or far) right edge in one call. Each call is cropped to the key columns its rows
    see (so both windows are >= 0) and, where the edge is still out of reach, the rows are
    split in two until every call is exact (one row is always exact). Rows that see no key are
    in no call. The same calls are exact under FlashAttention-3's rules (its 2024 betas clamp
    like flash-attn; later releases clamp the right window at sq - 1, which is unbounded)."""
    lo, hi = band
    first, stop = visible_rows(sq, sk, band)
    return _calls(first, stop, sk, lo, hi) if first < stop else ()


def _calls(r0: int, r1: int, sk: int, lo: int | None, hi: int | None) -> tuple[FlashCall, ...]:
    """Rows [r0, r1), each seeing at least one key."""
    rows = r1 - r0
    c0 = 0 if lo is None else max(0, r0 + lo)
    c1 = sk if hi is None else min(sk, r1 + hi)
    cols, shift = c1 - c0, (c1 - c0) - rows
    # The band in the cropped sub-block's coordinates, a bound dropped where no row meets it.
    sub_lo = None if lo is None or lo + r0 - c0 <= 1 - rows else lo + r0 - c0
    sub_hi = None if hi is None or hi + r0 - c0 >= cols - 1 else hi + r0 - c0
    left = -1 if sub_lo is None else shift - sub_lo
    right = -1 if sub_hi is None else sub_hi - shift
    if sub_hi is None:  # -1 becomes `cols` unless both sides are unbounded (full attention)
        exact = sub_lo is None or shift >= -1
    else:  # a right window >= cols would be clamped to `cols`
        exact = right < cols
    if exact or rows == 1:
        return (FlashCall(slice(r0, r1), slice(c0, c1), left, right),)
    mid = (r0 + r1) // 2
    return _calls(r0, mid, sk, lo, hi) + _calls(mid, r1, sk, lo, hi)


def flash_plan(
    sq: int, sk: int, causal: bool, band: Band | None
) -> tuple[bool, tuple[FlashCall, ...]]:
    """(the library's causal flag, its calls) for a `sq x sk` block: one whole call with no
    window for full or square causal blocks, else `flash_calls` of the band. cpbench's causal
    is top-left, flash-attn's bottom-right aligned (j <= i + sk - sq), so a non-square causal
    block goes in as the band (None, 0)."""
    causal, band = normalize_band(causal, band)
    if band is None and causal and sq != sk:
        band = (None, 0)
    if band is None:
        return causal, (FlashCall(slice(0, sq), slice(0, sk), -1, -1),)
    return False, flash_calls(sq, sk, band)


def _whole(calls: tuple[FlashCall, ...], sq: int, sk: int) -> bool:
    return len(calls) == 1 and calls[0].rows == slice(0, sq) and calls[0].cols == slice(0, sk)


class FlashKernel(LocalKernel):
    """A flash kernel (flash-attn 2 or 3): native GQA, [B, S, H, D] layout, any mask as
    `flash_plan` splits it into library calls (`_call`, `_call_backward`), a band as the
    library's window. Split calls write their rows in place (rows no key reaches: out 0, LSE
    -inf, as cpbench's other kernels) and sum their dk / dv columns (they share key columns)."""

    supports_band = True

    def _mask(self, causal: bool, band: Band | None) -> tuple[bool, Band | None]:
        """No refusal here: a release without a window refuses a band in
        `call_with_signature`, which names the parameter it lacks."""
        return normalize_band(causal, band)

    def _forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
        band: Band | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        sq, sk = q.shape[1], k.shape[1]
        causal, calls = flash_plan(sq, sk, causal, band)
        if _whole(calls, sq, sk):
            return self._call(q, k, v, causal, scale, calls[0].left, calls[0].right)
        b, _, h, _ = q.shape
        out = q.new_zeros((b, sq, h, v.shape[3]))
        lse = torch.full((b, h, sq), float("-inf"), dtype=torch.float32, device=q.device)
        for c in calls:
            o, l_ = self._call(q[:, c.rows], k[:, c.cols], v[:, c.cols], False, scale, c.left,
                               c.right)  # fmt: skip
            out[:, c.rows] = o
            lse[:, :, c.rows] = l_
        return out, lse

    def _backward(
        self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        out: torch.Tensor, lse: torch.Tensor, causal: bool, scale: float, band: Band | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        sq, sk = q.shape[1], k.shape[1]
        causal, calls = flash_plan(sq, sk, causal, band)
        if _whole(calls, sq, sk):
            left, right = calls[0].left, calls[0].right
            return self._call_backward(dout, q, k, v, out, lse, causal, scale, left, right)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for c in calls:
            dqc, dkc, dvc = self._call_backward(
                dout[:, c.rows], q[:, c.rows], k[:, c.cols], v[:, c.cols], out[:, c.rows],
                lse[:, :, c.rows], False, scale, c.left, c.right,
            )  # fmt: skip
            dq[:, c.rows] = dqc
            dk[:, c.cols] += dkc
            dv[:, c.cols] += dvc
        return dq, dk, dv

    def _call(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
        left: int, right: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """One library forward with window (left, right): (out, LSE [B, H, S] float32)."""
        raise NotImplementedError

    def _call_backward(
        self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        out: torch.Tensor, lse: torch.Tensor, causal: bool, scale: float, left: int, right: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        """One library backward with window (left, right): (dq, dk, dv)."""
        raise NotImplementedError


class FlashAttnKernel(FlashKernel):
    """The flash-attn package (Dao-AILab) on CUDA, through the private functions of 2.7 and
    2.8 (their signatures changed across releases; older versions are not selected).

    Inputs whose last dimension is contiguous go in as they come: flash-attn reads any other
    strides and copies only a tensor whose `stride(-1) != 1` (`maybe_contiguous`), so K and V,
    views of the ring's packed `[B, S, 2, H, D]` buffer, and row slices cost no copy. The LSE
    goes in `.contiguous()`: the CUDA kernel indexes it as a dense [B, H, S] array."""

    name = "flash_attn"

    def __init__(self) -> None:
        from flash_attn import flash_attn_interface  # noqa: PLC0415 - optional dependency

        self._fa = flash_attn_interface

    @staticmethod
    def _settings(causal: bool, scale: float, left: int, right: int) -> dict[str, Any]:
        """The arguments forward and backward share: no dropout, softcap or ALiBi."""
        return {
            "dropout_p": 0.0,
            "softmax_scale": scale,
            "causal": causal,
            "window_size_left": left,
            "window_size_right": right,
            "softcap": 0.0,
            "alibi_slopes": None,
        }

    def _call(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
        left: int, right: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        res = self._fa._flash_attn_forward(
            *map(last_dim_contiguous, (q, k, v)),
            **self._settings(causal, scale, left, right),
            return_softmax=False,
        )
        return res[0], res[1].float()

    def _call_backward(
        self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        out: torch.Tensor, lse: torch.Tensor, causal: bool, scale: float, left: int, right: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self._fa._flash_attn_backward(
            *map(last_dim_contiguous, (dout, q, k, v, out)),
            lse.contiguous(),
            dq,
            dk,
            dv,
            **self._settings(causal, scale, left, right),
            deterministic=False,
            rng_state=None,
        )
        return dq, dk, dv


FLASH_ATTN_MIN_VERSION = (2, 7)
"""The private `_flash_attn_forward/_backward` took `window_size_left/right` and returned
(out, lse, ...) from 2.7 on; 2.4-2.6 had a `window_size` tuple and 8 return values."""


FLASH_ATTN_ANY_NEWER_GPU = (2, 7, 3)
"""The first flash-attn that runs on every GPU of compute capability >= 8.0. Before it,
`mha_fwd` / `mha_bwd` (csrc/flash_attn/flash_api.cpp, 2.6.3 to 2.7.2.post1) admit 8.x and 9.0
only: `is_sm8x = major == 8 && minor >= 0; is_sm90 = major == 9 && minor == 0;
TORCH_CHECK(is_sm90 || is_sm8x, "FlashAttention only supports Ampere GPUs or newer.")`
(v2.7.2 flash_api.cpp:368-370 in mha_fwd, :813 in mha_bwd), so an sm100 / sm120 GPU is refused
with that message. 2.7.3 (commit bbb21d65, "Generalize arch checks for A100 and above", #1427)
checks `cc_major >= 8` (`is_sm8x_min`, v2.7.3 flash_api.cpp:367-368, :796; v2.8.3 :369-370)."""


AMPERE = (8, 0)
"""The least compute capability of flash-attn 2 (`mha_fwd`'s "FlashAttention only supports
Ampere GPUs or newer", csrc/flash_attn/flash_api.cpp) and of PyTorch's CUDA flash op
(`check_sm_version` in aten/src/ATen/native/transformers/cuda/sdp_utils.cpp)."""


def before_ampere(capability: tuple[int, int] | None) -> str | None:
    """Why a flash kernel cannot run on a GPU of `capability` (below 8.0), else None."""
    if capability is None or capability >= AMPERE:
        return None
    return (
        f"needs an Ampere or newer GPU (compute capability >= 8.0; this one has "
        f"{capability[0]}.{capability[1]}): kernel 'efficient' runs here"
    )


def flash_attn_capability_refusal(
    version: tuple[int, ...], capability: tuple[int, int]
) -> str | None:
    """Why flash-attn `version` refuses a GPU of `capability`, by `mha_fwd`'s check of that
    release (`FLASH_ATTN_ANY_NEWER_GPU`); None when it runs there."""
    major, minor = capability
    shown = ".".join(map(str, version))
    if major < 8:
        return before_ampere(capability)
    if version < FLASH_ATTN_ANY_NEWER_GPU and not (major == 8 or (major, minor) == (9, 0)):
        return (
            f"flash-attn {shown} runs on compute capability 8.x and 9.0 only (its mha_fwd "
            f"checks major == 8 or 9.0; this GPU has {major}.{minor}): flash-attn >= 2.7.3 "
            f"runs on every GPU from 8.0"
        )
    return None


def flash_attn_version() -> tuple[int, ...] | None:
    """The installed flash-attn version (major, minor, patch), or None when it does not
    import."""
    try:
        import flash_attn  # noqa: PLC0415 - optional dependency
    except ImportError:
        return None
    parts = []
    for piece in str(getattr(flash_attn, "__version__", "0")).split(".")[:3]:
        digits = "".join(ch for ch in piece.split("+")[0] if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def flash_attn_available() -> bool:
    """flash-attn is installed in a version whose private API FlashAttnKernel speaks."""
    version = flash_attn_version()
    return version is not None and version >= FLASH_ATTN_MIN_VERSION
