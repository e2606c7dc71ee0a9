"""Functions that the multi-rank tests send to the pool's ranks (importable by spawned ranks)."""

from __future__ import annotations

import time

import torch

from cpbench.attention import build_mesh, cp_attention, shard
from cpbench.attention.comm import ByteCounter, counting


def count_bytes(
    seq_len: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    batch: int,
    ulysses: int,
    ring: int,
    layout: str,
    dtype: str,
    variant: str = "full",
) -> dict[str, dict[str, int]]:
    """Run one forward+backward under a ByteCounter; return {phase: {collective: bytes}}."""
    mesh = build_mesh(ulysses, ring)
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(batch, seq_len, heads, head_dim, generator=g)
    k = torch.randn(batch, seq_len, kv_heads, head_dim, generator=g)
    v = torch.randn(batch, seq_len, kv_heads, head_dim, generator=g)
    local = [shard(t, mesh, layout).to(dt).requires_grad_(True) for t in (q, k, v)]
    counter = ByteCounter()
    with counting(counter):
        out = cp_attention(
            *local,
            mesh,
            causal=True,
            layout=layout,
            variant=variant,
            kernel="naive" if dt != torch.float32 else "auto",
        )
        with counter.phase("bwd"):
            out.sum().backward()
    return counter.as_dict()


def raise_on_rank(rank_to_fail: int) -> int:
    import torch.distributed as dist  # noqa: PLC0415

    if dist.get_rank() == rank_to_fail:
        raise RuntimeError("injected failure")
    dist.barrier()  # the healthy ranks wait for the failed one, as a real collective would
    return dist.get_rank()


def sleep_then_rank(seconds: float) -> int:
    import torch.distributed as dist  # noqa: PLC0415

    time.sleep(seconds)
    return dist.get_rank()


def measure_or_misbehave(config: dict, settings: dict) -> dict:
    """`measure_config`, except that head_dim 24 raises on rank 1 and head_dim 40 hangs: the
    faults a sweep must survive (a rank that raises, a configuration that never returns)."""
    import torch.distributed as dist  # noqa: PLC0415

    from cpbench.bench.measure import measure_config  # noqa: PLC0415

    if config["head_dim"] == 24 and dist.get_rank() == 1:
        raise RuntimeError("CUDA out of memory (injected)")
    if config["head_dim"] == 40:
        time.sleep(3600)
    return measure_config(config, settings)
