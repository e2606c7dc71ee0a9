"""The reference check of prefill with a cached prefix on the ranks: sharded, run under a
`ByteCounter`, compared on rank 0 with the float64 reference (query i sees key j iff j <= i + P)
by verify's bound, and the bytes against `model.inference.prefill_bytes`."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist

from cpbench.attention.comm import ByteCounter, counting
from cpbench.attention.inference import prefill_attention, shard_prefill, unshard_prefill
from cpbench.attention.inference_decode import decode_attention, shard_cache
from cpbench.attention.kernels import LocalKernel
from cpbench.attention.mesh import build_mesh
from cpbench.attention.reference import reference_attention
from cpbench.bench.reference import TORCH_DTYPES, error_bound, run_batch
from cpbench.config.problem import CpProblem
from cpbench.config.tolerances import rounded_terms
from cpbench.model.formulas import same_bytes
from cpbench.model.inference import (
    CACHE_LAYOUTS,
    DECODE_MERGES,
    DEFAULT_NEW_TOKEN_LAYOUT,
    NEW_TOKEN_LAYOUTS,
    PREFILL_SCHEMES,
    DecodeCase,
    PrefillCase,
    check_cache_layout,
    check_decode_merge,
    check_new_token_layout,
    check_scheme,
    decode_bytes,
    kv_cache_bytes_per_rank,
    prefill_bytes,
)


def prefill_case(
    scheme: str,
    world: int,
    cached_len: int,
    new_tokens: int,
    heads: int = 8,
    kv_heads: int = 8,
    head_dim: int = 16,
    batch: int = 1,
    dtype: str = "float32",
    seed: int = 0,
    new_token_layout: str = DEFAULT_NEW_TOKEN_LAYOUT,
) -> PrefillCase:
    """A `PrefillCase` on the mesh its scheme runs on (W x 1 for ulysses, 1 x W otherwise)."""
    the_scheme = check_scheme(scheme)
    ulysses, ring = (world, 1) if the_scheme == "ulysses" else (1, world)
    problem = CpProblem(
        seq_len=cached_len + new_tokens,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        batch=batch,
        dtype=dtype,  # type: ignore[arg-type]  # checked by CpProblem
        ulysses=ulysses,
        ring=ring,
    )
    layout = check_new_token_layout(new_token_layout)
    return PrefillCase(problem, cached_len, new_tokens, the_scheme, seed, layout)


def case_inputs(case: PrefillCase | DecodeCase, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Q of the new tokens, K and V of cached + new, from the case's seed (q, then k, then v)."""
    p = case.problem
    g = torch.Generator().manual_seed(case.seed)
    total = case.cached_len + case.new_tokens
    q = torch.randn(p.batch, case.new_tokens, p.heads, p.head_dim, generator=g)
    k = torch.randn(p.batch, total, p.kv_heads, p.head_dim, generator=g)
    v = torch.randn(p.batch, total, p.kv_heads, p.head_dim, generator=g)
    return tuple(t.to(device) for t in (q, k, v))


def _judged(
    case: PrefillCase | DecodeCase,
    fields: dict[str, Any],
    inputs: tuple[torch.Tensor, ...],
    out: torch.Tensor,
    parts: int,
    sent: dict[str, int],
    analytic: dict[str, int],
    cache: dict[str, int] | None = None,
) -> dict:
    """Rank 0's record of a case: the gathered output's max abs error against the float64
    reference (the diagonal shifted by P, the inputs rounded to the dtype) and its bound
    (`parts` partials merged, sums over P + T keys), the bytes sent against the model's and,
    for decode, the cache shard's bytes against the model's."""
    p, cache = case.problem, cache or {}
    rq, rk, rv = (t.to(TORCH_DTYPES[p.dtype]).double() for t in inputs)
    ref = reference_attention(rq, rk, rv, causal=True, causal_offset=case.cached_len)
    error = float((out.double() - ref).abs().max())
    terms = rounded_terms("out", parts, 1)
    bound = error_bound(p.dtype, ref, terms, case.cached_len + case.new_tokens)
    cache_ok = cache.get("cache_bytes") == cache.get("analytic_cache_bytes")
    return {
        **asdict(p),
        "label": case.label,
        **fields,
        "cached_len": case.cached_len,
        "new_tokens": case.new_tokens,
        "max_error": error,
        "tolerance": bound,
        "bytes": sent,
        "analytic_bytes": analytic,
        "bytes_match": same_bytes(sent, analytic),
        **cache,
        "passed": error <= bound and same_bytes(sent, analytic) and cache_ok,
    }


def run_prefill_case_on_rank(
    case: PrefillCase, device: torch.device, kernel: str | LocalKernel = "auto"
) -> dict | None:
    """Collective: run one case on every rank; rank 0 returns its record, the others None."""
    p = case.problem
    dtype = TORCH_DTYPES[p.dtype]
    q, k, v = case_inputs(case, device)
    mesh = build_mesh(p.ulysses, p.ring)
    layout = case.new_token_layout
    lq, lk, lv = (t.to(dtype) for t in shard_prefill(q, k, v, mesh, case.cached_len, layout))
    counter = ByteCounter()
    with counting(counter):
        out_local = prefill_attention(
            lq, lk, lv, mesh, case.cached_len, case.new_tokens, case.scheme, kernel,
            new_token_layout=layout,
        )  # fmt: skip
    sent = dict(counter.as_dict().get("fwd", {}))
    out = unshard_prefill(out_local, mesh, case.new_tokens, layout)
    if dist.get_rank() != 0:
        return None
    # the output merges up to one partial per rank of the CP group; sums run over P + T keys
    fields = {"scheme": case.scheme, "new_token_layout": layout}
    return _judged(case, fields, (q, k, v), out, p.ulysses * p.ring, sent, prefill_bytes(case))


def default_prefill_cases(world: int, dtype: str = "float32") -> list[PrefillCase]:
    """The prefill matrix `cpbench verify --inference` checks on `world` ranks: both new-token
    layouts x every scheme x (P, T) with P = 0 (no cache), T = 1 (one new token), T < W
    (ranks with no new token), P and T not multiples of W (padded shards), T > P, and T << P;
    8 query heads over 8, 2 and 1 KV heads (GQA; Ulysses replicates a KV head below W)."""
    lengths = [
        (0, 1),
        (0, 8 * world),
        (5, 1),
        (16 * world, 1),
        (16 * world, world - 1 or 1),
        (16 * world + 3, 5),
        (8 * world, 16 * world + 1),
        (64 * world, 2 * world),
    ]
    grid = itertools.product(NEW_TOKEN_LAYOUTS, PREFILL_SCHEMES, lengths, (8, 2, 1))
    return [
        prefill_case(scheme, world, cached_len, new_tokens, kv_heads=kv_heads, dtype=dtype,
                     new_token_layout=layout)  # fmt: skip
        for layout, scheme, (cached_len, new_tokens), kv_heads in grid
        if not (scheme == "ulysses" and world % kv_heads and kv_heads % world)
    ]


def decode_case(
    layout: str,
    world: int,
    cached_len: int,
    new_tokens: int,
    heads: int = 8,
    kv_heads: int = 8,
    head_dim: int = 16,
    dtype: str = "float32",
    seed: int = 0,
    merge: str = "all_gather",
) -> DecodeCase:
    """A `DecodeCase` on a 1 x W mesh."""
    problem = CpProblem(
        seq_len=cached_len + new_tokens,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=dtype,  # type: ignore[arg-type]  # checked by CpProblem
        ring=world,
    )
    the_merge = check_decode_merge(merge, heads, world)
    return DecodeCase(problem, cached_len, new_tokens, check_cache_layout(layout), seed, the_merge)


def run_decode_case_on_rank(
    case: DecodeCase, device: torch.device, kernel: str | LocalKernel = "auto"
) -> dict | None:
    """Collective: one decode step on every rank; rank 0 returns its record (output error
    against the reference, bytes against `decode_bytes`, its cache shard's bytes against
    `kv_cache_bytes_per_rank`), the others None."""
    p = case.problem
    dtype = TORCH_DTYPES[p.dtype]
    total = case.cached_len + case.new_tokens
    q, k, v = case_inputs(case, device)
    mesh = build_mesh(1, p.ring)
    lk, lv = (t.to(dtype) for t in shard_cache(k, v, mesh, case.layout))
    counter = ByteCounter()
    with counting(counter):
        out = decode_attention(
            q.to(dtype), lk, lv, mesh, case.cached_len, case.layout, kernel, merge=case.merge
        )
    sent = dict(counter.as_dict().get("fwd", {}))
    if case.merge == "all_to_all":  # rank r holds heads r H / W .. (r + 1) H / W: gather them
        heads = [torch.empty_like(out) for _ in range(p.ring)]
        dist.all_gather(heads, out.contiguous(), group=mesh.cp_group)
        out = torch.cat(heads, dim=2)
    # on the cache's device: an NCCL world has no CPU backend for the all-reduce
    cache_bytes = torch.tensor([lk.nbytes + lv.nbytes], dtype=torch.int64, device=lk.device)
    dist.all_reduce(cache_bytes, op=dist.ReduceOp.MAX, group=mesh.cp_group)
    if dist.get_rank() != 0:
        return None
    # one partial output per cache shard is merged; sums run over the whole cache
    analytic = decode_bytes(
        case.new_tokens, p.ring, p.heads, p.head_dim, p.dtype, p.batch, case.merge
    )
    cache = {
        "cache_bytes": int(cache_bytes),
        "analytic_cache_bytes": kv_cache_bytes_per_rank(
            total, p.ring, p.kv_heads, p.head_dim, p.dtype, p.batch
        ),
    }
    fields = {"scheme": f"decode_{case.layout}", "merge": case.merge}
    return _judged(case, fields, (q, k, v), out, p.ring, sent, analytic, cache)


def default_decode_cases(world: int, dtype: str = "float32") -> list[DecodeCase]:
    """Decode steps of 1 to 8 new tokens over both cache layouts: no earlier cache (P = 0),
    a cache shorter than the ranks, and caches not a multiple of W; GQA 8/8 and 8/1; merged
    by all-gather and by all-to-all to a head split (8 heads: W = 2, 4 and 8 divide them)."""
    cached_lens = (0, world - 1 or 1, 16 * world + 3, 64 * world)
    grid = itertools.product(DECODE_MERGES, CACHE_LAYOUTS, cached_lens, (1, 2, 5, 8), (8, 1))
    return [
        decode_case(layout, world, cached_len, new_tokens, kv_heads=kv_heads, dtype=dtype,
                    merge=merge)  # fmt: skip
        for merge, layout, cached_len, new_tokens, kv_heads in grid
        if not (merge == "all_to_all" and 8 % world)
    ]


def run_inference_case_on_rank(
    case: PrefillCase | DecodeCase, device: torch.device, kernel: str | LocalKernel = "auto"
) -> dict | None:
    """Collective: one prefill or decode case (rank 0 gets its record, the others None)."""
    if isinstance(case, PrefillCase):
        return run_prefill_case_on_rank(case, device, kernel)
    return run_decode_case_on_rank(case, device, kernel)


def _failure_fields(case: PrefillCase | DecodeCase) -> dict[str, Any]:
    if isinstance(case, PrefillCase):
        return {"label": case.label, "scheme": case.scheme}
    return {"label": case.label, "scheme": f"decode_{case.layout}", "merge": case.merge}


def run_inference_cases_on_rank(
    cases: Sequence[PrefillCase | DecodeCase],
    device: str = "cpu",
    kernel: str | LocalKernel = "auto",
) -> list[dict | None]:
    """Pool task: prefill and decode cases in order (`reference.run_batch`: a CpbenchError in
    one case is recorded, not raised), each record marked with its phase (`"inference":
    "prefill"` or `"decode"`)."""
    dev = torch.device(device)
    records = run_batch(cases, lambda case: run_inference_case_on_rank(case, dev, kernel),
                        _failure_fields)  # fmt: skip
    return [
        None if r is None else {**r, "inference": "prefill" if isinstance(c, PrefillCase) else "decode"}
        for c, r in zip(cases, records, strict=True)
    ]
