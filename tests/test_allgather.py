"""All-gather CP (cpbench/attention/allgather.py) on the session's 4 gloo ranks: every layout x
mask (causal, full, documents incl. a single-token one, window, documents + window, a window
longer than the sequence) x GQA x head stride, output and dQ/dK/dV against a float64 reference
built from `MaskSpec.visible` (tolerance 1e-5: the merge accumulates in fp32), and the bytes
handed to gloo equal the protocol: forward (A-1) K/V chunks gathered, backward the same plus
(A-1) fp32 dK/dV chunks reduce-scattered, for every stride.

The kernel here is a float64 einsum that takes the pieces' bands, so the test holds whatever
the production kernels support."""

from __future__ import annotations

import torch
import torch.distributed as dist

from cpbench.attention.allgather import AllGatherAttention, GatherSpec
from cpbench.attention.comm import ByteCounter, counting
from cpbench.config.geometry import pack, ring_schedule
from cpbench.config.masks import MaskSpec

WORLD = 4
TOLERANCE = 1e-5


class BandNaive:
    name = "bandnaive"

    def _mask(self, sq, sk, causal, band, dev):
        i = torch.arange(sq, device=dev)[:, None]
        j = torch.arange(sk, device=dev)[None]
        if band is None:
            return (j <= i) if causal else torch.ones(sq, sk, dtype=torch.bool)
        lo, hi = band
        m = torch.ones(sq, sk, dtype=torch.bool)
        if lo is not None:
            m &= (j - i) >= lo
        if hi is not None:
            m &= (j - i) <= hi
        return m

    def forward(self, q, k, v, causal, scale, band=None):
        G = q.shape[2] // k.shape[2]
        kk = k.repeat_interleave(G, 2).double()
        vv = v.repeat_interleave(G, 2).double()
        s = torch.einsum("bqhd,bkhd->bhqk", q.double(), kk) * scale
        s = s.masked_fill(
            ~self._mask(q.shape[1], k.shape[1], causal, band, q.device), float("-inf")
        )
        lse = torch.logsumexp(s, -1)
        return torch.einsum("bhqk,bkhd->bqhd", torch.exp(s - lse[..., None]), vv).to(
            q.dtype
        ), lse.float()

    def backward(self, dout, q, k, v, out, lse, causal, scale, band=None):
        G = q.shape[2] // k.shape[2]
        kk = k.repeat_interleave(G, 2).double()
        vv = v.repeat_interleave(G, 2).double()
        s = torch.einsum("bqhd,bkhd->bhqk", q.double(), kk) * scale
        s = s.masked_fill(
            ~self._mask(q.shape[1], k.shape[1], causal, band, q.device), float("-inf")
        )
        p = torch.exp(s - lse.double()[..., None])
        do = dout.double()
        dv = torch.einsum("bhqk,bqhd->bkhd", p, do)
        dp = torch.einsum("bqhd,bkhd->bhqk", do, vv)
        delta = (do * out.double()).sum(-1).transpose(1, 2)[..., None]
        ds = p * (dp - delta) * scale
        dq = torch.einsum("bhqk,bkhd->bqhd", ds, kk)
        dk = torch.einsum("bhqk,bqhd->bkhd", ds, q.double())
        b, sk, h, d = dk.shape
        dk = dk.view(b, sk, h // G, G, d).sum(3)
        dv = dv.view(b, sk, h // G, G, d).sum(3)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def reference(q, k, v, mask, L):
    vis = torch.tensor([[mask.visible(a, b) for b in range(L)] for a in range(L)])
    G = q.shape[2] // k.shape[2]
    s = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(G, 2)) / q.shape[-1] ** 0.5
    s = s.masked_fill(~vis, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), v.repeat_interleave(G, 2))


def _run() -> tuple[int, int, int, float]:
    """Pool task: every case on this rank; (rank, cases, wrong results or bytes, worst error)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = GatherSpec(None, world, rank)
    cases = []
    for layout in ["contiguous", "zigzag", "striped", "doc_zigzag", "balanced"]:
        for mask in [
            MaskSpec(True),
            MaskSpec(False),
            MaskSpec(True, (5, 1, 20, 3, 3)),
            MaskSpec(True, None, 7),
            MaskSpec(True, (9, 12, 11), 4),
            MaskSpec(True, None, 100),
        ]:
            for h, hkv, stride in (
                [(4, 2, None), (4, 2, 1)] if layout in ("zigzag", "balanced") else [(4, 2, 1)]
            ):
                cases.append((layout, mask, h, hkv, stride))
    worst = 0.0
    bad = 0
    for ci, (layout, mask, h, hkv, stride) in enumerate(cases):
        L = 32
        pk = pack(mask, L, 1, world, layout)
        Lr = pk.seq_len
        sched = ring_schedule(pk)
        g = torch.Generator().manual_seed(ci)
        q = torch.randn(2, Lr, h, 8, generator=g, dtype=torch.float64)
        k = torch.randn(2, Lr, hkv, 8, generator=g, dtype=torch.float64)
        v = torch.randn(2, Lr, hkv, 8, generator=g, dtype=torch.float64)
        do = torch.randn(2, Lr, h, 8, generator=g, dtype=torch.float64)
        qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
        ref = reference(qr, kr, vr, pk.mask, Lr)
        ref.backward(do)
        idx = torch.tensor([p for r in pk.shards[rank] for p in r.positions()])
        ql = q[:, idx].clone().requires_grad_()
        kl = k[:, idx].clone().requires_grad_()
        vl = v[:, idx].clone().requires_grad_()
        counter = ByteCounter()
        with counting(counter):
            out = AllGatherAttention.apply(
                ql, torch.stack([kl, vl], 2), spec, sched, 8**-0.5, BandNaive(), "full", stride
            )
            with counter.phase("bwd"):
                out.backward(do[:, idx])
        errs = [
            (out - ref[:, idx]).abs().max().item(),
            (ql.grad - qr.grad[:, idx]).abs().max().item(),
            (kl.grad - kr.grad[:, idx]).abs().max().item(),
            (vl.grad - vr.grad[:, idx]).abs().max().item(),
        ]
        chunk = 2 * 2 * (Lr // world) * hkv * 8
        want = {
            "fwd": {"ag_kv": chunk * 8 * (world - 1)},
            "bwd": {"ag_kv": chunk * 8 * (world - 1), "rs_dkv": chunk * 4 * (world - 1)},
        }
        if counter.as_dict() != want:
            bad += 1
        worst = max(worst, *errs)
        if max(errs) > TOLERANCE:
            bad += 1
    return rank, len(cases), bad, worst


def test_allgather_every_layout_and_mask_matches_reference_and_bytes(pool) -> None:  # type: ignore[no-untyped-def]
    rows = pool(WORLD).run(_run, timeout=300)
    assert [r[0] for r in rows] == list(range(WORLD))
    for rank, cases, bad, worst in rows:
        assert cases >= 30
        assert bad == 0, f"rank {rank}: {bad} of {cases} cases wrong (worst error {worst:.2e})"
        assert worst < TOLERANCE
