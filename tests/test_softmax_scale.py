"""An explicit softmax scale is honoured or refused, never replaced by the default: `scale or
default` once turned 0.0 into 1/sqrt(D) silently. torch's fused CPU kernel masks before it
scales (0 x -inf = NaN), so a scale must be finite and > 0; every public entry point, one rank."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from cpbench.attention.api import cp_attention
from cpbench.attention.inference import prefill_attention
from cpbench.attention.inference_decode import decode_attention
from cpbench.attention.mesh import CPMesh
from cpbench.attention.reference import reference_attention
from cpbench.errors import CpbenchError

B, L, H, H_KV, D = 1, 8, 4, 2, 16
ONE_RANK = CPMesh(ulysses=1, ring=1, rank=0, cp_ranks=(0,))
TOLERANCE = 1e-5
"""float32 kernels against the float64 reference on unit-normal inputs of 8 tokens."""


def _qkv(keys: int, queries: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, queries, H, D, generator=g)
    k = torch.randn(B, keys, H_KV, D, generator=g)
    v = torch.randn(B, keys, H_KV, D, generator=g)
    return q, k, v


def _training(scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, v = _qkv(L, L)
    want = reference_attention(q.double(), k.double(), v.double(), True, scale)
    return cp_attention(q, k, v, ONE_RANK, causal=True, scale=scale), want


def _prefill(scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    cached = 5
    q, k, v = _qkv(cached + L, L)
    want = reference_attention(q.double(), k.double(), v.double(), True, scale, cached)
    return prefill_attention(q, k, v, ONE_RANK, cached, L, scale=scale), want


def _decode(scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, v = _qkv(L + 1, 1)
    want = reference_attention(q.double(), k.double(), v.double(), True, scale, L)
    return decode_attention(q, k, v, ONE_RANK, L, scale=scale), want


ENTRY_POINTS: dict[str, Callable[[float | None], tuple[torch.Tensor, torch.Tensor]]] = {
    "training": _training,
    "prefill": _prefill,
    "decode": _decode,
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("scale", [None, 0.05, 1.0])
def test_a_given_scale_is_the_scale_used(entry: str, scale: float | None) -> None:
    got, want = ENTRY_POINTS[entry](scale)
    assert float((got.double() - want).abs().max()) < TOLERANCE
    # A wrong scale is visible: the default 0.25 is far from the scales given here.
    if scale is not None:
        other = ENTRY_POINTS[entry](None)[1]
        assert float((other - want).abs().max()) > 100 * TOLERANCE


@pytest.mark.parametrize("entry", [*ENTRY_POINTS, "reference"])
@pytest.mark.parametrize("scale", [0.0, -0.1, math.inf, math.nan])
def test_a_scale_that_is_not_positive_and_finite_is_refused(entry: str, scale: float) -> None:
    with pytest.raises(CpbenchError, match=r"scale \(.*\) must be a finite number > 0"):
        if entry == "reference":
            q, k, v = _qkv(L, L)
            reference_attention(q, k, v, True, scale)
        else:
            ENTRY_POINTS[entry](scale)
