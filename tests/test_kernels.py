"""Local kernels against the float64 reference: forward (out, LSE) and backward with a given
out/LSE, causal and full, MHA and GQA, unequal query/key lengths."""

from __future__ import annotations

import pytest
import torch

from cpbench.attention.kernels import (
    CpuSdpaKernel,
    NaiveKernel,
    causal_mask,
    default_scale,
    select_kernel,
)
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
