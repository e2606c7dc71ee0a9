"""The local kernels on a real GPU (skipped where torch sees none; the GPU acceptance run's
device command runs this file): every kernel usable here, forward and backward with its own
out/LSE, on causal, full and band pieces (the memory-efficient op's bias with rows padded and
rows that see no key included), one key for cuDNN, GQA, against float64 on the inputs rounded
to the dtype. The CPU suite checks the same marshalling against fakes (test_gpu_kernels.py);
this checks the ops themselves."""

from __future__ import annotations

import pytest
import torch

from cpbench.attention.kernels import band_capable, default_scale, kernel_unavailable, select_kernel
from cpbench.attention.kernels.base import Band, band_mask

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

KERNELS = ["sdpa", "cudnn", "efficient", "flash_attn", "flash_attn3", "naive"]
PIECES: list[tuple[int, int, bool, Band | None]] = [
    # (queries, keys, causal, band)
    (128, 128, True, None),
    (128, 128, False, None),
    (96, 150, False, None),  # keys not a multiple of 16 or 32
    (1, 1, False, None),  # one key: cuDNN hands the call to einsum
    (5, 1, False, None),
    (128, 128, False, (-17, 0)),  # a sliding window's diagonal piece
    (96, 150, False, (-40, 9)),  # an offset band, the bias's rows padded
    (64, 64, False, (None, -1)),  # row 0 sees no key
    (64, 64, False, (3, 30)),  # the last rows see none
]
TOLERANCE = {torch.bfloat16: 3e-2, torch.float32: 2e-4}
"""Max abs error on unit-normal inputs of at most 150 keys, head dim 64: bf16 rounds the output
and gradients to 8 bits (2^-8 x their magnitude, a few units), float32 leaves TF32-free
accumulation error; both far below a wrong mask's error (order 1)."""


def _reference(q, k, v, dout, causal, band):  # type: ignore[no-untyped-def]
    """float64 out, LSE and grads; a row that sees no key: out 0, LSE -inf, no gradient."""
    sq, sk = q.shape[1], k.shape[1]
    ref_in = [t.double().requires_grad_(True) for t in (q, k, v)]
    group = q.shape[2] // k.shape[2]
    kk, vv = (t.repeat_interleave(group, dim=2) for t in ref_in[1:])
    scores = torch.einsum("bqhd,bkhd->bhqk", ref_in[0], kk) * default_scale(q.shape[-1])
    keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril()
    if band is not None:
        keep = band_mask(sq, sk, band, q.device)
    scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, vv)
    out.backward(dout.double())
    return out.detach(), lse.detach(), [t.grad for t in ref_in]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize(("sq", "sk", "causal", "band"), PIECES)
def test_kernel_on_the_gpu_matches_float64(name, dtype, sq, sk, causal, band) -> None:  # type: ignore[no-untyped-def]
    device = torch.device("cuda")
    reason = kernel_unavailable(name, device, dtype, 64)
    if reason is not None:
        pytest.skip(f"kernel not usable on this GPU: {name} {reason}")
    if band is not None and not band_capable(name, device):
        pytest.skip(f"no mask band on this GPU: kernel {name}")
    kernel = select_kernel(device, dtype, name, band=band is not None, head_dim=64)
    g = torch.Generator(device=device).manual_seed(sq * 1000 + sk)
    q, dout = (torch.randn(2, sq, 8, 64, generator=g, device=device, dtype=dtype)
               for _ in range(2))  # fmt: skip
    k, v = (torch.randn(2, sk, 2, 64, generator=g, device=device, dtype=dtype) for _ in range(2))
    scale = default_scale(64)
    out, lse = kernel.forward(q, k, v, causal, scale, band)
    grads = kernel.backward(dout, q, k, v, out, lse, causal, scale, band)
    ref, ref_lse, ref_grads = _reference(q, k, v, dout, causal, band)
    tol = TOLERANCE[dtype]
    assert out.shape == q.shape and lse.shape == (2, 8, sq)
    assert float((out.double() - ref).abs().max()) < tol
    seen = torch.isfinite(ref_lse)
    assert float((lse.double() - ref_lse)[seen].abs().max()) < tol
    assert bool((lse[~seen] == float("-inf")).all())
    for got, want in zip(grads, ref_grads, strict=True):
        assert want is not None and got.shape == want.shape
        assert bool(torch.isfinite(got).all())
        assert float((got.double() - want).abs().max()) < tol * max(1.0, float(want.abs().max()))
