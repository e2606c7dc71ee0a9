"""Local kernels against the float64 reference: forward (out, LSE) and backward with a given
out/LSE, causal and full, MHA and GQA, unequal query/key lengths; mask bands (the document and
sliding-window pieces) on the einsum kernel, the CPU op and flash-attn 2 / 3's windows, and
the kernels that must refuse them."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from cpbench.attention.kernels import (
    CpuSdpaKernel,
    CudaSdpaKernel,
    CudnnKernel,
    FlashAttn3Kernel,
    FlashAttnKernel,
    NaiveKernel,
    band_capable,
    causal_mask,
    default_scale,
    select_kernel,
)
from cpbench.attention.kernels.base import band_mask, normalize_band
from cpbench.attention.kernels.flash_attn import flash_plan
from cpbench.attention.kernels.ops import call_with_signature
from cpbench.attention.reference import reference_attention
from cpbench.config.geometry import pack, ring_schedule
from cpbench.config.masks import MaskSpec
from cpbench.config.vocabulary import LAYOUTS
from cpbench.errors import CpbenchError, KernelRefused
from tests import flash_rules

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


@pytest.mark.parametrize("offset", [0, 3, 8, -2])
def test_reference_causal_offset(offset: int) -> None:
    """`causal_offset` against attention written row by row from its definition (query i sees
    key j iff j <= i + offset; 8 = Sk - Sq is flash-attn's bottom-right alignment, -2 leaves
    rows 0 and 1 without a key: zero), every row of every head (GQA 4:2), to 1e-12 in float64.
    The check tells offsets apart: the reference at offset +-1 differs from the definition by
    more than 1e-3, so a reference that ignored or shifted the offset fails here."""
    import math  # noqa: PLC0415
    from collections.abc import Callable  # noqa: PLC0415

    def brute_force(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: Callable[[int, int], bool]
    ) -> torch.Tensor:
        """Per (batch, head, query row): the scaled dot products with the keys `visible`
        allows, a softmax in Python floats (max subtracted), the weighted sum of those values;
        a row without a key is zero. GQA: query head h reads KV head h // (H / H_kv)."""
        batch, sq, heads, dim = q.shape
        sk, group = k.shape[1], heads // k.shape[2]
        out = torch.zeros(batch, sq, heads, dim, dtype=torch.float64)
        for b, h, i in itertools.product(range(batch), range(heads), range(sq)):
            keys = [j for j in range(sk) if visible(i, j)]
            scores = [float(q[b, i, h] @ k[b, j, h // group]) / math.sqrt(dim) for j in keys]
            if not scores:
                continue
            weights = [math.exp(s - max(scores)) for s in scores]
            for j, w in zip(keys, weights, strict=True):
                out[b, i, h] += w / sum(weights) * v[b, j, h // group]
        return out

    q, k, v = (t.double() for t in _inputs(8, 16, 4, 2)[:3])
    want = brute_force(q, k, v, lambda i, j: j <= i + offset)
    got = reference_attention(q, k, v, causal=True, causal_offset=offset)
    assert got.shape == want.shape
    assert (got - want).abs().max() < 1e-12
    for wrong in (offset - 1, offset + 1):
        shifted = reference_attention(q, k, v, causal=True, causal_offset=wrong)
        assert (shifted - want).abs().max() > 1e-3, wrong


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


BAND_PIECES = [
    (sq, sk, band)
    for sq, sk in [(16, 16), (12, 20)]
    for band in BANDS
    if band_mask(sq, sk, band, torch.device("cpu")).any(dim=1).all()
]
"""The band pieces in which every row sees a key (the ring never makes another: a piece
with an empty row is cropped away), so no case is parametrised only to be skipped."""


@pytest.mark.parametrize("kernel", [CpuSdpaKernel(), NaiveKernel()], ids=lambda k: k.name)
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 1)])
@pytest.mark.parametrize(("sq", "sk", "band"), BAND_PIECES)
def test_kernel_band_matches_reference(kernel, band, heads, kv_heads, sq, sk) -> None:  # type: ignore[no-untyped-def]
    """A band piece (the CPU op through a float additive mask, the einsum kernel through a
    boolean one): out, LSE and the backward with the given out/LSE, to TOL (2e-5)."""
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


@pytest.mark.parametrize("cls", [CudaSdpaKernel, CudnnKernel])
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
    # On CUDA without flash-attn the memory-efficient op applies one (as its bias), and a
    # kernel with a causal flag only is refused, naming it and einsum.
    assert band_capable("efficient", "cuda")
    assert select_kernel("cuda", torch.float32, "efficient", band=True).name == "efficient"
    with pytest.raises(KernelRefused, match="cannot apply the band pieces.*naive, efficient"):
        select_kernel("cuda", torch.bfloat16, "sdpa", band=True)


# --------------------------------------------- flash-attn 2 / FA3 windows, by the libraries' rules


def test_rule_fa2_clamps_an_unbounded_right_window_to_seqlen_k() -> None:
    """flash_api.cpp: right -1 (or >= sk) with left 0 becomes right = sk: on 5 x 2, row i sees
    i - 3 <= j < i (hand-computed), so row 0 sees nothing although the band (-3, None) does."""
    want = torch.tensor([[0, 0], [1, 0], [1, 1], [1, 1], [0, 1]], dtype=torch.bool)
    assert torch.equal(flash_rules.visible(flash_rules.FA2, 5, 2, False, 0, -1), want)
    assert torch.equal(flash_rules.visible(flash_rules.FA2, 5, 2, False, 0, 7), want)
    assert not torch.equal(want, band_mask(5, 2, (-3, None), torch.device("cpu")))


def test_rule_fa3_clamps_at_seqlen_q_minus_one() -> None:
    """hopper/flash_api.cpp: -1 becomes sq - 1 on the right: on 5 x 2 with left 0, row i sees
    i - 3 <= j (hand-computed); that is the band (-3, None)."""
    want = torch.tensor([[1, 1], [1, 1], [1, 1], [1, 1], [0, 1]], dtype=torch.bool)
    assert torch.equal(flash_rules.visible(flash_rules.FA3, 5, 2, False, 0, -1), want)
    assert torch.equal(want, band_mask(5, 2, (-3, None), torch.device("cpu")))


def test_rule_causal_is_bottom_right_and_empty_rows_have_lse_plus_inf() -> None:
    """mask.h: causal row i sees j <= i + sk - sq (2 x 4: rows see 3 and 4 keys); softmax.h:
    a row without a key gets out 0 and LSE +inf (row 0 of the 5 x 2 case above)."""
    want = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(flash_rules.visible(flash_rules.FA2, 2, 4, True, -1, -1), want)
    q, k, v, _ = _inputs(5, 2, 2, 2)
    out, lse = flash_rules.Library().attend(q, k, v, 0.25, False, 0, -1)
    assert torch.isinf(lse[:, :, 0]).all() and (lse[:, :, 0] > 0).all()
    assert out[:, 0].abs().max() == 0 and torch.isfinite(lse[:, :, 1:]).all()


def test_rule_flash_attn_needs_ampere() -> None:
    q, k, v, _ = _inputs(4, 4, 2, 2)
    with pytest.raises(RuntimeError, match="Ampere GPUs or newer"):
        flash_rules.Library(capability=(7, 5)).attend(q, k, v, 0.25, False, -1, -1)


@pytest.mark.parametrize(
    ("version", "capability", "admitted"),
    [
        ((2, 7, 2), (10, 0), False),  # mha_fwd 2.6.3-2.7.2: is_sm8x || is_sm90 only
        ((2, 6, 3), (12, 0), False),
        ((2, 7, 2), (9, 0), True),
        ((2, 7, 2), (8, 9), True),
        ((2, 7, 3), (10, 0), True),  # 2.7.3 on: cc_major >= 8
        ((2, 8, 3), (12, 0), True),
        ((2, 8, 3), (7, 5), False),
    ],
)
def test_rule_flash_attn_capability_per_release(version, capability, admitted) -> None:  # type: ignore[no-untyped-def]
    """The stand-in refuses exactly the GPUs flash_api.cpp's check of that release refuses
    (with the library's own message), and cpbench's selection rule says the same."""
    from cpbench.attention.kernels.flash_attn import flash_attn_capability_refusal  # noqa: PLC0415

    q, k, v, _ = _inputs(4, 4, 2, 2)
    library = flash_rules.Library(capability=capability, version=version)
    if admitted:
        library.attend(q, k, v, 0.25, False, -1, -1)
    else:
        with pytest.raises(RuntimeError, match="Ampere GPUs or newer"):
            library.attend(q, k, v, 0.25, False, -1, -1)
    assert (flash_attn_capability_refusal(version, capability) is None) is admitted


def test_rule_flash_attn_dtype_and_head_dim() -> None:
    """flash_api.cpp mha_fwd: fp16/bf16 only; head_size <= 256 and a multiple of 8 (2.7+: the
    private API does not pad)."""
    g = torch.Generator().manual_seed(0)
    library = flash_rules.Library(half_only=True)
    for d, message in ((12, "multiple of 8"), (264, "at most 256")):
        x = torch.randn(1, 4, 2, d, generator=g, dtype=torch.float16)
        with pytest.raises(RuntimeError, match=message):
            library.attend(x, x, x, 0.25, False, -1, -1)
    x = torch.randn(1, 4, 2, 256, generator=g)
    with pytest.raises(RuntimeError, match="only support fp16 and bf16"):
        library.attend(x, x, x, 0.25, False, -1, -1)
    out, _ = library.attend(x.half(), x.half(), x.half(), 0.25, False, -1, -1)
    assert out.shape == x.shape and out.dtype == torch.float16


def _flash_kernel(rule: str = flash_rules.FA2) -> tuple[FlashAttnKernel, flash_rules.Library]:
    kernel = FlashAttnKernel.__new__(FlashAttnKernel)
    library = flash_rules.Library(rule)
    kernel._fa = library  # type: ignore[assignment]
    return kernel, library


FLASH_CASES = [
    *[(sq, sk, band) for band in BANDS for sq, sk in ((16, 16), (12, 20))],
    (23, 16, (-7, None)),  # U1xR2 zigzag, window 24 (cpbench verify): 6 rows were wrong
    (40, 12, (-30, None)),  # sq > 2 sk + 1: rows without a key, LSE +inf, NaN in the merge
    (40, 12, (-30, 5)),  # a finite right window >= sk: clamped as well
    (30, 8, (-25, 2)),
    (9, 4, (None, 0)),  # top-left causal on a non-square block (flash-attn's is bottom-right)
    (4, 9, (None, 0)),
]


def _expressible(sq: int, sk: int, band) -> bool:  # type: ignore[no-untyped-def]
    return bool(band_mask(sq, sk, band, torch.device("cpu")).any(dim=1).all())


@pytest.mark.parametrize("rule", [flash_rules.FA2, flash_rules.FA3])
@pytest.mark.parametrize(("sq", "sk", "band"), [c for c in FLASH_CASES if _expressible(*c)])
def test_flash_band_matches_reference_under_the_library_rule(rule, sq, sk, band) -> None:  # type: ignore[no-untyped-def]
    """flash-attn 2 (and FA3 of each release) on a band piece, run by a stand-in that applies
    the library's own clamping and mask: out, LSE and gradients equal the float64 reference
    to TOL (2e-5). On main, under flash-attn 2's rule, (23, 16, (-7, None)), the 40 x 12 and
    30 x 8 cases gave wrong rows (LSE +inf for some), the non-square causal ones were aligned
    bottom-right, and bands that need cropped keys (12 x 20: (-5, 2), (None, -1), (0, 0))
    were refused."""
    q, k, v, dout = _inputs(sq, sk, 4, 2, seed=3)
    kernel, library = _flash_kernel(rule)
    scale = default_scale(16)
    lo, hi = band
    causal = band == (None, 0)
    out, lse = kernel.forward(q, k, v, causal, scale, band=None if causal else band)
    ref, ref_lse, ref_grads = _band_reference(q, k, v, dout, band)
    assert torch.isfinite(lse).all()
    assert (out.double() - ref).abs().max() < TOL
    assert (lse.double() - ref_lse).abs().max() < TOL
    grads = kernel.backward(dout, q, k, v, out, lse, causal, scale, band=None if causal else band)
    for got, want in zip(grads, ref_grads, strict=True):
        assert (got.double() - want).abs().max() < TOL
    assert all(c[2] is False or c[0] == c[1] for c in library.calls)


@pytest.mark.parametrize("release", ["2024-beta", "2026"])
def test_flash_attn3_band_under_each_release_rule(release: str) -> None:
    rule = flash_rules.FA2 if release == "2024-beta" else flash_rules.FA3
    library = flash_rules.Library(rule)
    kernel = FlashAttn3Kernel(flash_rules.fa3_module(release, library))
    assert kernel.supports_band
    q, k, v, dout = _inputs(23, 16, 4, 2, seed=3)
    out, lse = kernel.forward(q, k, v, False, default_scale(16), band=(-7, None))
    ref, _, ref_grads = _band_reference(q, k, v, dout, (-7, None))
    assert (out.double() - ref).abs().max() < TOL
    grads = kernel.backward(dout, q, k, v, out, lse, False, default_scale(16), band=(-7, None))
    for got, want in zip(grads, ref_grads, strict=True):
        assert (got.double() - want).abs().max() < TOL


def test_flash_attn3_without_a_window_refuses_a_band() -> None:
    """FA3 before 2024-08-29 has no window: a band is an error (main ran it as full
    attention), it is not band-capable, and a plain causal call still runs."""
    library = flash_rules.Library()
    kernel = FlashAttn3Kernel(flash_rules.fa3_module("2024-07", library))
    assert not kernel.supports_band
    q, k, v, _ = _inputs(16, 16, 2, 2)
    with pytest.raises(CpbenchError, match="window_size / window_size_left"):
        kernel.forward(q, k, v, False, default_scale(16), band=(-5, 0))
    assert library.calls == []
    out, _ = kernel.forward(q, k, v, True, default_scale(16))
    assert library.calls == [(16, 16, True, -1, -1)] and out.shape == q.shape


def test_call_with_signature_refuses_to_drop_a_required_argument() -> None:
    def fn(q, softmax_scale):  # type: ignore[no-untyped-def]
        return q

    assert call_with_signature(fn, {"softmax_scale": 1.0, "window_size": (1, 1)}, 3) == 3
    with pytest.raises(CpbenchError, match="takes no window_size"):
        call_with_signature(fn, {"window_size": (1, 1)}, 3, required=(("window_size",),))


def _library_rows(rule: str, rows: int, cols: int, causal: bool, band):  # type: ignore[no-untyped-def]
    """Per row, the keys [first, stop) the flash kernels apply to a piece: `flash_plan`'s
    calls, each by the library's rule (`flash_rules.limits`) in its sub-block; a row in two
    calls is an error (the forward writes each call's rows), a row in none sees no key."""
    flag, calls = flash_plan(rows, cols, causal, band)
    first = torch.zeros(rows, dtype=torch.long)
    stop = torch.zeros(rows, dtype=torch.long)
    covered = torch.zeros(rows, dtype=torch.bool)
    for c in calls:
        sub_rows, sub_cols = c.rows.stop - c.rows.start, c.cols.stop - c.cols.start
        assert not covered[c.rows].any() and sub_rows > 0 and sub_cols > 0
        covered[c.rows] = True
        a, b = flash_rules.limits(rule, sub_rows, sub_cols, flag, c.left, c.right)
        first[c.rows], stop[c.rows] = a + c.cols.start, b + c.cols.start
    return first, stop


def test_flash_masks_equal_the_schedule_bands() -> None:
    """Property over cpbench's own schedule: random documents, windows, layouts and U x R
    meshes (world 2-8), every ring piece of every rank and step; the mask flash-attn 2's and
    FA3's rules make of the kernel's calls equals the piece's band exactly, for >= 10,000
    distinct pieces (seeded; shape, flag and band). On main one call per piece with right -1 fails it (e.g. 23 x 16, lo -7)."""
    rng = random.Random(23)
    checked, split = 0, 0
    seen: set[tuple[int, int, bool, object]] = set()
    while len(seen) < 10_000:
        ulysses, ring = rng.choice([(u, r) for u in (1, 2, 4) for r in (2, 4, 8) if u * r <= 8])
        layout = rng.choice(LAYOUTS)
        seq_len = 2 * ring * ulysses * rng.randint(2, 256)
        docs: tuple[int, ...] | None = None
        if rng.random() < 0.6:
            cuts = sorted(rng.sample(range(1, seq_len), rng.randint(1, min(32, seq_len - 1))))
            docs = tuple(b - a for a, b in zip([0, *cuts], [*cuts, seq_len], strict=True))
        window = rng.choice([None, rng.randint(1, seq_len)])
        try:
            packing = pack(MaskSpec(True, docs, window), seq_len, ulysses, ring, layout)
        except CpbenchError:
            continue
        for per_rank in ring_schedule(packing).pieces:
            for pieces in per_rank:
                for p in pieces:
                    checked += 1
                    causal, band = p.is_causal, None if p.is_full or p.is_causal else (p.lo, p.hi)
                    key = (p.rows, p.cols, causal, band)
                    if key in seen:
                        continue
                    seen.add(key)
                    i = torch.arange(p.rows)  # the band's keys of row i: [first, stop)
                    first = torch.zeros_like(i) if p.lo is None else (i + p.lo).clamp(min=0)
                    stop = torch.full((p.rows,), p.cols) if p.hi is None else (i + p.hi + 1)
                    want = (first, stop.clamp(max=p.cols))
                    assert bool((want[0] < want[1]).all()), p  # the schedule's pieces
                    split += len(flash_plan(p.rows, p.cols, causal, band)[1]) > 1
                    for rule in (flash_rules.FA2, flash_rules.FA3):
                        got = _library_rows(rule, p.rows, p.cols, causal, band)
                        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (
                            rule, p
                        )
    assert len(seen) >= 10_000 and split > 0, (checked, len(seen), split)


def test_flash_masks_equal_every_band_of_small_blocks() -> None:
    """Every band (lo <= hi, each bound None or from -sq - 1 to sk) of every block up to 9 x 9,
    rows without keys included (8,883 bands): the calls' masks under flash-attn 2's and FA3's
    rules equal the band, and no window is below -1."""
    bands = 0
    for sq, sk in itertools.product(range(1, 10), repeat=2):
        bounds = [None, *range(-sq - 1, sk + 1)]
        for lo, hi in itertools.product(bounds, repeat=2):
            if lo is not None and hi is not None and lo > hi:
                continue
            bands += 1
            causal = (lo, hi) == (None, 0)
            flag, calls = flash_plan(sq, sk, causal, None if causal else (lo, hi))
            want = band_mask(sq, sk, (lo, hi), torch.device("cpu"))
            for rule in (flash_rules.FA2, flash_rules.FA3):
                got = torch.zeros(sq, sk, dtype=torch.bool)
                for c in calls:
                    assert c.left >= -1 and c.right >= -1
                    got[c.rows, c.cols] = flash_rules.visible(
                        rule, c.rows.stop - c.rows.start, c.cols.stop - c.cols.start, flag,
                        c.left, c.right,
                    )  # fmt: skip
                assert torch.equal(got, want), (rule, sq, sk, lo, hi, calls)
    assert bands == 8883
