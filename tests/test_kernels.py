"""Local kernels against the float64 reference: forward (out, LSE) and backward with a given
out/LSE, causal and full, MHA and GQA, unequal query/key lengths; mask bands (the document and
sliding-window pieces) on the einsum kernel, the CPU op and flash-attn 2 / 3's windows, and
the kernels that must refuse them."""

from __future__ import annotations

import types

import pytest
import torch

from cpbench.attention.kernels import (
    CpuSdpaKernel,
    CudaSdpaKernel,
    CudnnKernel,
    EfficientKernel,
    FlashAttn3Kernel,
    FlashAttnKernel,
    NaiveKernel,
    band_capable,
    causal_mask,
    default_scale,
    select_kernel,
)
from cpbench.attention.kernels.base import band_mask, normalize_band
from cpbench.attention.kernels.flash_attn import flash_window
from cpbench.attention.reference import reference_attention
from cpbench.errors import CpbenchError

TOL = 2e-5  # float32 kernels vs float64 on O(1) values


def _inputs(sq: int, sk: int, heads: int, kv_heads: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(2, sq, heads, 16, generator=g),
        torch.randn(2, sk, kv_heads, 16, generator=g),
        torch.randn(2, sk, kv_heads, 16, generator=g),
        torch.randn(2, sq, heads, 16, generator=g),
    ]


def _reference_lse(q, k, causal):  # type: ignore[no-untyped-def]
    kk = k.double().repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), kk) * default_scale(q.shape[-1])
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[1], k.shape[1], 0, q.device), float("-inf"))
    return torch.logsumexp(s, dim=-1)


@pytest.mark.parametrize("kernel", [CpuSdpaKernel(), NaiveKernel()], ids=lambda k: k.name)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize(("sq", "sk"), [(32, 32), (16, 32), (32, 16)])
def test_kernel_matches_reference(kernel, causal, heads, kv_heads, sq, sk) -> None:  # type: ignore[no-untyped-def]
    q, k, v, dout = _inputs(sq, sk, heads, kv_heads)
    scale = default_scale(16)
    out, lse = kernel.forward(q, k, v, causal, scale)
    ref_in = [t.double().requires_grad_(True) for t in (q, k, v)]
    ref = reference_attention(*ref_in, causal=causal)
    ref.backward(dout.double())
    assert lse.dtype == torch.float32 and lse.shape == (2, heads, sq)
    assert (out.double() - ref).abs().max() < TOL
    assert (lse.double() - _reference_lse(q, k, causal)).abs().max() < TOL
    grads = kernel.backward(dout, q, k, v, out, lse, causal, scale)
    for got, x in zip(grads, ref_in, strict=True):
        assert got.shape == x.shape
        assert (got.double() - x.grad).abs().max() < TOL


def test_backward_uses_the_given_out_and_lse() -> None:
    """Ring attention passes the FINAL out/LSE to each block's backward; the kernel must use
    them rather than recompute its own: a block backward with the global normaliser equals the
    corresponding slice of the global gradient."""
    q, k, v, dout = _inputs(16, 32, 2, 2)
    scale = default_scale(16)
    kernel = CpuSdpaKernel()
    out, lse = kernel.forward(q, k, v, False, scale)
    dq_full, dk_full, dv_full = kernel.backward(dout, q, k, v, out, lse, False, scale)
    parts = [
        kernel.backward(dout, q, k[:, s], v[:, s], out, lse, False, scale)
        for s in (slice(0, 16), slice(16, 32))
    ]
    assert (parts[0][0] + parts[1][0] - dq_full).abs().max() < TOL
    assert (torch.cat([parts[0][1], parts[1][1]], dim=1) - dk_full).abs().max() < TOL
    assert (torch.cat([parts[0][2], parts[1][2]], dim=1) - dv_full).abs().max() < TOL


def test_reference_causal_offset() -> None:
    # Bottom-right alignment for a shorter query block: offset = Sk - Sq.
    q, k, v, _ = _inputs(8, 16, 2, 2)
    out = reference_attention(q.double(), k.double(), v.double(), causal=True, causal_offset=8)
    last_rows_full = reference_attention(q.double(), k.double(), v.double(), causal=False)
    assert torch.allclose(out[:, -1], last_rows_full[:, -1])


def test_kernel_selection_and_override() -> None:
    assert select_kernel("cpu", torch.float32).name == "sdpa"
    assert select_kernel("cpu", torch.float32, "naive").name == "naive"
    assert select_kernel("cpu", torch.float64).name == "naive"
    with pytest.raises(CpbenchError, match="flash_attn"):
        select_kernel("cpu", torch.float32, "flash_attn")
    with pytest.raises(CpbenchError, match="not one of"):
        select_kernel("cpu", torch.float32, "triton")


# ------------------------------------------------------------------------------- mask bands

BANDS = [(-3, 0), (-5, 2), (1, 6), (None, -1), (-2, None), (0, 0)]
"""(lo, hi): row i sees column j iff lo <= j - i <= hi (window pieces, offset causal pieces)."""


def _band_reference(q, k, v, dout, band):  # type: ignore[no-untyped-def]
    """float64 softmax attention under the dense band mask (rows without a key: zero)."""
    ref_in = [t.double().requires_grad_(True) for t in (q, k, v)]
    kk = ref_in[1].repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    vv = ref_in[2].repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", ref_in[0], kk) * default_scale(q.shape[-1])
    keep = band_mask(q.shape[1], k.shape[1], band, q.device)
    s = s.masked_fill(~keep, float("-inf"))
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), vv)
    out.backward(dout.double())
    return out.detach(), torch.logsumexp(s.detach(), dim=-1), [x.grad for x in ref_in]


def _band_inputs(sq: int, sk: int, band, heads: int, kv_heads: int):  # type: ignore[no-untyped-def]
    """Inputs whose every query row sees at least one key of the band."""
    keep = band_mask(sq, sk, band, torch.device("cpu"))
    assert bool(keep.any(dim=1).all()), (sq, sk, band)
    return _inputs(sq, sk, heads, kv_heads, seed=3)


@pytest.mark.parametrize("kernel", [CpuSdpaKernel(), NaiveKernel()], ids=lambda k: k.name)
@pytest.mark.parametrize("band", BANDS)
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 1)])
@pytest.mark.parametrize(("sq", "sk"), [(16, 16), (12, 20)])
def test_kernel_band_matches_reference(kernel, band, heads, kv_heads, sq, sk) -> None:  # type: ignore[no-untyped-def]
    """A band piece (the CPU op through a float additive mask, the einsum kernel through a
    boolean one): out, LSE and the backward with the given out/LSE, to TOL (2e-5)."""
    if not band_mask(sq, sk, band, torch.device("cpu")).any(dim=1).all():
        pytest.skip("a row sees no key: the ring never makes such a piece")
    q, k, v, dout = _band_inputs(sq, sk, band, heads, kv_heads)
    scale = default_scale(16)
    out, lse = kernel.forward(q, k, v, False, scale, band=band)
    ref, ref_lse, ref_grads = _band_reference(q, k, v, dout, band)
    assert (out.double() - ref).abs().max() < TOL
    assert (lse.double() - ref_lse).abs().max() < TOL
    grads = kernel.backward(dout, q, k, v, out, lse, False, scale, band=band)
    for got, want in zip(grads, ref_grads, strict=True):
        assert got.shape == want.shape
        assert (got.double() - want).abs().max() < TOL


def test_bands_that_are_full_or_causal_use_the_flags() -> None:
    assert normalize_band(True, (None, None)) == (False, None)
    assert normalize_band(False, (None, 0)) == (True, None)
    assert normalize_band(False, (-3, 0)) == (False, (-3, 0))
    with pytest.raises(CpbenchError, match=r"lo \(2\) > hi \(1\)"):
        normalize_band(False, (2, 1))


@pytest.mark.parametrize("cls", [CudaSdpaKernel, CudnnKernel, EfficientKernel])
def test_kernels_without_a_mask_refuse_a_band(cls) -> None:  # type: ignore[no-untyped-def]
    """Never a mask silently dropped: the error names the band and the kernel (raised before
    any op is called, so it runs on a CPU)."""
    q, k, v, dout = _inputs(8, 8, 2, 2)
    kernel = cls()
    with pytest.raises(CpbenchError, match=r"cannot apply the mask band lo \(-3\)"):
        kernel.forward(q, k, v, False, 0.25, band=(-3, 0))
    with pytest.raises(CpbenchError, match=kernel.name):
        kernel.backward(dout, q, k, v, q, torch.zeros(2, 2, 8), False, 0.25, band=(-3, 0))
    assert not kernel.supports_band


def test_select_kernel_with_bands() -> None:
    assert select_kernel("cpu", torch.float32, band=True).name == "sdpa"
    assert band_capable("sdpa", "cpu") and not band_capable("sdpa", "cuda")
    assert not band_capable("cudnn", "cuda") and band_capable("flash_attn", "cuda")
    # On CUDA float32 (auto = efficient) without flash-attn no kernel but einsum applies one.
    with pytest.raises(CpbenchError, match="cannot apply the band pieces.*can on cuda.*naive"):
        select_kernel("cuda", torch.float32, "efficient", band=True)


class _WindowFlash:
    """flash-attn 2.7's private functions with its documented window semantics, computed
    densely (the stand-in in tests/stand_ins refuses windows): query i sees key j iff
    i + (sk - sq) - left <= j <= i + (sk - sq) + right (-1 unbounded); causal = right 0."""

    def __init__(self) -> None:
        self.windows: list[tuple[int, int, bool]] = []

    @staticmethod
    def _band(sq: int, sk: int, causal: bool, left: int, right: int):  # type: ignore[no-untyped-def]
        if causal:
            right = 0
        shift = sk - sq
        return (None if left < 0 else shift - left, None if right < 0 else shift + right)

    def _flash_attn_forward(self, q, k, v, dropout_p, softmax_scale, causal, window_size_left,  # type: ignore[no-untyped-def]
                            window_size_right, softcap, alibi_slopes, return_softmax):  # fmt: skip
        self.windows.append((window_size_left, window_size_right, causal))
        band = self._band(q.shape[1], k.shape[1], causal, window_size_left, window_size_right)
        out, lse = NaiveKernel().forward(q, k, v, False, softmax_scale, band=band)
        return out, lse, None, None

    def _flash_attn_backward(self, dout, q, k, v, out, lse, dq, dk, dv, dropout_p,  # type: ignore[no-untyped-def]
                             softmax_scale, causal, window_size_left, window_size_right,
                             softcap, alibi_slopes, deterministic, rng_state):  # fmt: skip
        band = self._band(q.shape[1], k.shape[1], causal, window_size_left, window_size_right)
        grads = NaiveKernel().backward(dout, q, k, v, out, lse, False, softmax_scale, band=band)
        for buffer, grad in zip((dq, dk, dv), grads, strict=True):
            buffer.copy_(grad)


@pytest.mark.parametrize("band", BANDS)
@pytest.mark.parametrize(("sq", "sk"), [(16, 16), (12, 20)])
def test_flash_attn_band_goes_in_as_the_window(band, sq, sk) -> None:  # type: ignore[no-untyped-def]
    """FlashAttnKernel turns (lo, hi) into (left, right) = ((sk - sq) - lo, hi - (sk - sq))
    with causal off; a fake with flash-attn's window semantics then gives the reference."""
    if not band_mask(sq, sk, band, torch.device("cpu")).any(dim=1).all():
        pytest.skip("a row sees no key: the ring never makes such a piece")
    lo, hi = band
    if (lo is not None and lo > sk - sq) or (hi is not None and hi < sk - sq):
        with pytest.raises(CpbenchError, match="flash-attn cannot express"):
            flash_window(sq, sk, band)
        return
    kernel = FlashAttnKernel.__new__(FlashAttnKernel)
    fake = _WindowFlash()
    kernel._fa = fake  # type: ignore[assignment]
    q, k, v, dout = _band_inputs(sq, sk, band, 4, 2)
    out, lse = kernel.forward(q, k, v, False, default_scale(16), band=band)
    left, right = fake.windows[-1][:2]
    assert left == (-1 if lo is None else (sk - sq) - lo)
    assert right == (-1 if hi is None else hi - (sk - sq))
    assert fake.windows[-1][2] is False
    ref, _, ref_grads = _band_reference(q, k, v, dout, band)
    assert (out.double() - ref).abs().max() < TOL
    grads = kernel.backward(dout, q, k, v, out, lse, False, default_scale(16), band=band)
    for got, want in zip(grads, ref_grads, strict=True):
        assert (got.double() - want).abs().max() < TOL
    # Without a band the window stays unbounded.
    kernel.forward(q, k, v, True, default_scale(16))
    assert fake.windows[-1] == (-1, -1, True)


def test_flash_attn3_band_goes_in_as_the_window() -> None:
    captured: dict[str, object] = {}

    def forward(q, k, v, softmax_scale=None, causal=False, window_size_left=-1,  # type: ignore[no-untyped-def]
                window_size_right=-1):  # fmt: skip
        captured.update(left=window_size_left, right=window_size_right, causal=causal)
        band = _WindowFlash._band(q.shape[1], k.shape[1], causal, window_size_left,
                                  window_size_right)  # fmt: skip
        o, lse = NaiveKernel().forward(q, k, v, False, softmax_scale, band=band)
        return o, lse, None, None

    def backward(dout, q, k, v, out, softmax_lse, dq=None, dk=None, dv=None,  # type: ignore[no-untyped-def]
                 softmax_scale=None, is_causal=False, window_size_left=-1,
                 window_size_right=-1):  # fmt: skip
        captured.update(bwd=(window_size_left, window_size_right))

    fa3 = types.SimpleNamespace(_flash_attn_forward=forward, _flash_attn_backward=backward)
    kernel = FlashAttn3Kernel(fa3)  # type: ignore[arg-type]
    q, k, v, dout = _inputs(16, 16, 4, 4)
    out, lse = kernel.forward(q, k, v, False, default_scale(16), band=(-5, 2))
    assert captured == {"left": 5, "right": 2, "causal": False}
    ref, _, _ = _band_reference(q, k, v, dout, (-5, 2))
    assert (out.double() - ref).abs().max() < TOL
    kernel.backward(dout, q, k, v, out, lse, False, default_scale(16), band=(-5, 2))
    assert captured["bwd"] == (5, 2)
