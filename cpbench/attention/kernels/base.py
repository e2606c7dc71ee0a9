"""The kernel interface (`LocalKernel`) and the helpers every kernel shares."""

from __future__ import annotations

import math
from typing import Protocol

import torch

from cpbench.errors import CpbenchError

Band = tuple[int | None, int | None]
"""A piece's mask as (lo, hi): row i sees column j iff lo <= j - i <= hi (None unbounded);
`(None, None)` is full attention, `(None, 0)` top-left causal (`cpbench.config.geometry.Piece`)."""


class LocalKernel(Protocol):
    """`band`, when given, is the whole mask of the call (`causal` is then ignored): the
    pieces of a packed-document or sliding-window ring block that are neither full nor
    top-left causal. A kernel that cannot apply a band raises CpbenchError naming it."""

    name: str
    supports_band: bool

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool,
        scale: float,
        band: Band | None = None,
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
        band: Band | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """What outputs and LSEs are merged in: float64 for float64 inputs (so a float64 check is
    float64-accurate), float32 for every other dtype."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def default_scale(head_dim: int, scale: float | None = None) -> float:
    """The softmax scale: `scale` when one is given, else 1/sqrt(head_dim). A given scale must be
    finite and positive: torch's fused CPU kernel masks before it scales, so at 0 every masked
    score becomes NaN (-inf x 0), and a negative one turns them into +inf."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if not (math.isfinite(scale) and scale > 0):
        raise CpbenchError(f"scale ({scale}) must be a finite number > 0 (None: 1/sqrt(head_dim))")
    return scale


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


def normalize_band(causal: bool, band: Band | None) -> tuple[bool, Band | None]:
    """(causal, band) with the two bands every kernel has a flag for folded back: `(None,
    None)` -> full, `(None, 0)` -> top-left causal; any other band stays (causal False)."""
    if band is None:
        return causal, None
    if band == (None, None):
        return False, None
    if band == (None, 0):
        return True, None
    lo, hi = band
    if lo is not None and hi is not None and lo > hi:
        raise CpbenchError(f"mask band lo ({lo}) > hi ({hi}): no key is visible")
    return False, band


def band_mask(sq: int, sk: int, band: Band, device: torch.device) -> torch.Tensor:
    """Boolean [sq, sk], True where lo <= j - i <= hi."""
    lo, hi = band
    diff = torch.arange(sk, device=device).unsqueeze(0) - torch.arange(
        sq, device=device
    ).unsqueeze(1)
    keep = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if lo is not None:
        keep &= diff >= lo
    if hi is not None:
        keep &= diff <= hi
    return keep


def refuse_band(kernel: str, band: Band | None) -> None:
    """A kernel without a mask argument: a band is an error naming both, never dropped."""
    if band is not None:
        lo, hi = band
        raise CpbenchError(
            f"kernel {kernel!r} cannot apply the mask band lo ({lo}) <= j - i <= hi ({hi}) of "
            f"a document or sliding-window piece (it has only a causal flag); use kernel "
            f"'flash_attn', 'flash_attn3', 'sdpa' on CPU, or 'naive'"
        )


class ForwardRngState:
    """For kernels whose backward op takes the forward's philox (seed, offset) — fixed when
    dropout is 0, but the op still wants the tensors. The forward stores them in `_rng`."""

    _rng: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool,
        scale: float,
        band: Band | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _rng_for_backward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored (seed, offset); a backward before any forward in this process runs a
        forward of one query on (up to) two keys first to get them (cuDNN refuses one key)."""
        if self._rng is None:
            self.forward(q[:, :1], k[:, :2], v[:, :2], False, scale)
        if self._rng is None:
            raise RuntimeError(f"{type(self).__name__}.forward did not record its RNG state")
        return self._rng
