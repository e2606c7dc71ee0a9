"""The kernel interface (`LocalKernel`) and the helpers every kernel shares."""

from __future__ import annotations

import math

import torch

from cpbench.errors import CpbenchError, KernelRefused

Band = tuple[int | None, int | None]
"""A piece's mask as (lo, hi): row i sees column j iff lo <= j - i <= hi (None unbounded);
`(None, None)` is full attention, `(None, 0)` top-left causal (`cpbench.config.geometry.Piece`)."""


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
    return band_mask(sq, sk, (None, offset), device)


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
    rows = torch.arange(sq, device=device).unsqueeze(1)
    diff = torch.arange(sk, device=device).unsqueeze(0) - rows
    keep = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if lo is not None:
        keep &= diff >= lo
    if hi is not None:
        keep &= diff <= hi
    return keep


def additive_band(
    sq: int, sk: int, band: Band, dtype: torch.dtype, device: torch.device, align: int = 1
) -> torch.Tensor:
    """The band as an additive [sq, sk] mask of `dtype` (0 visible, -inf hidden), its rows
    starting at multiples of `align` elements (a view into a wider buffer)."""
    padded = -(-sk // align) * align
    bias = torch.zeros(sq, padded, dtype=dtype, device=device)[:, :sk]
    return bias.masked_fill_(~band_mask(sq, sk, band, device), float("-inf"))


def visible_rows(sq: int, sk: int, band: Band) -> tuple[int, int]:
    """(first, stop): rows outside [first, stop) see no key of the piece. Row i sees columns
    max(0, i + lo) .. min(sk - 1, i + hi), so the rows that see none are a prefix (i + hi < 0)
    and a suffix (i + lo > sk - 1): from the band's numbers, no device sync."""
    lo, hi = band
    first = 0 if hi is None else min(sq, max(0, -hi))
    stop = sq if lo is None else max(first, min(sq, sk - lo))
    return first, stop


def refuse_band(kernel: str, band: Band | None) -> None:
    """A kernel without a mask argument: a band is an error naming both, never dropped."""
    if band is not None:
        lo, hi = band
        raise KernelRefused(
            f"kernel {kernel!r} cannot apply the mask band lo ({lo}) <= j - i <= hi ({hi}) of "
            f"a document or sliding-window piece (it has only a causal flag); use kernel "
            f"'flash_attn', 'flash_attn3', 'efficient' (CUDA), 'sdpa' on CPU, or 'naive'"
        )


class LocalKernel:
    """What every kernel is: the public `forward` / `backward` (GQA, layout, mask checks and
    the LSE's shape and dtype done here, once) around the hooks a kernel fills, `_forward` and
    `_backward`, which get the prepared tensors. `band`, when given, is the whole mask of the
    call (`causal` is then ignored): the pieces of a packed-document or sliding-window ring
    block that are neither full nor top-left causal. A kernel that cannot apply a band
    (`supports_band` False) raises CpbenchError naming it."""

    name: str
    label = ""
    """How errors name the kernel, where not by `name`."""
    supports_band = False
    """Whether a mask band (document / sliding-window piece) can be applied."""
    bhsd = False
    """Whether the op takes [B, H, S, D]: our [B, S, H, D] tensors go in as transposed views
    (`_layout`), its results come back transposed, and the LSE goes in dense."""
    keeps_rng = False
    """Whether the backward op takes what the forward recorded in `_rng` (the philox seed and
    offset, fixed at dropout 0, but the op still wants them)."""
    _rng: tuple[torch.Tensor, ...] | None = None

    def native_gqa(self) -> bool:
        """Whether the op takes K/V with fewer heads than Q; else they are expanded to the
        query's heads before it and their gradient copies summed back after its backward."""
        return True

    def _delegate(self, k: torch.Tensor) -> LocalKernel | None:
        """Another kernel that runs this call whole (a piece this op refuses), or None."""
        return None

    def _mask(self, causal: bool, band: Band | None) -> tuple[bool, Band | None]:
        causal, band = normalize_band(causal, band)
        if not self.supports_band:
            refuse_band(self.label or self.name, band)
        return causal, band

    def _layout(self, x: torch.Tensor) -> torch.Tensor:
        """A [B, S, H, D] input as the op takes it."""
        return x.transpose(1, 2) if self.bhsd else x

    def _kv(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        native = x.shape[2] == heads or self.native_gqa()
        return self._layout(x if native else _expand_kv(x, heads))

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool,
        scale: float,
        band: Band | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(out [B, S, H, D] in q's dtype, LSE [B, H, S] in `accumulator_dtype`)."""
        causal, band = self._mask(causal, band)
        other = self._delegate(k)
        if other is not None:
            return other.forward(q, k, v, causal, scale, band)
        h = q.shape[2]
        out, lse = self._forward(
            self._layout(q), self._kv(k, h), self._kv(v, h), causal, scale, band
        )
        out = out.transpose(1, 2) if self.bhsd else out
        return out.to(q.dtype), lse[..., : q.shape[1]].to(accumulator_dtype(q.dtype))

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
        """(dq, dk, dv) of this block under the given (global) `out` and `lse`."""
        causal, band = self._mask(causal, band)
        other = self._delegate(k)
        if other is not None:
            return other.backward(dout, q, k, v, out, lse, causal, scale, band)
        if self.keeps_rng and self._rng is None:
            # A backward before any forward in this process: a forward of one query on (up
            # to) two keys records the state (cuDNN refuses one key).
            self.forward(q[:, :1], k[:, :2], v[:, :2], False, scale)
        h, layout = q.shape[2], self._layout
        dq, dk, dv = self._backward(
            layout(dout), layout(q), self._kv(k, h), self._kv(v, h), layout(out),
            lse.contiguous() if self.bhsd else lse, causal, scale, band,
        )  # fmt: skip
        if self.bhsd:
            dq, dk, dv = dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)
        kv_heads = k.shape[2]
        return (
            dq.to(q.dtype),
            _reduce_kv_grad(dk, kv_heads).to(k.dtype),
            _reduce_kv_grad(dv, kv_heads).to(v.dtype),
        )

    def _recorded(self) -> tuple[torch.Tensor, ...]:
        """What the last forward recorded for the backward (`keeps_rng`)."""
        if self._rng is None:  # unreachable: `backward` runs a forward first
            raise RuntimeError(f"{type(self).__name__}.forward did not record its RNG state")
        return self._rng

    def _forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
        band: Band | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """The op's (out, LSE) on the prepared tensors (`_layout`, K/V expanded where the op
        has no GQA); an LSE padded past S_q is cut by `forward`."""
        raise NotImplementedError

    def _backward(
        self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        out: torch.Tensor, lse: torch.Tensor, causal: bool, scale: float, band: Band | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        """The op's (dq, dk, dv) on the prepared tensors, dk/dv with K/V's prepared heads."""
        raise NotImplementedError
