"""Decode over a KV cache sharded by sequence, forward only, merged by all-gather or all-to-all.

Usage: docs/inference.md, "cpbench's prefill and decode schemes"; the model: "The model"."""

from __future__ import annotations

import torch

from cpbench.attention.comm import all_gather_chunks, all_to_all
from cpbench.attention.inference import merge_accumulators
from cpbench.attention.kernels import LocalKernel, default_scale, select_kernel
from cpbench.attention.mesh import CPMesh
from cpbench.attention.ring import _merge
from cpbench.config.inference import MAX_DECODE_TOKENS
from cpbench.errors import CpbenchError
from cpbench.model.inference import (
    DecodeMerge,
    cache_shard_len,
    cache_visible,
    check_cache_layout,
    check_decode_merge,
    split_starts,
)


def shard_cache(
    k_all: torch.Tensor, v_all: torch.Tensor, mesh: CPMesh, layout: str = "contiguous"
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's shard of the global cache `[B, N, h_kv, D]` (over the CP group)."""
    the_layout = check_cache_layout(layout)
    w, r, n = mesh.world, mesh.rank, k_all.shape[1]
    if the_layout == "contiguous":
        s = split_starts(n, w)
        return k_all[:, s[r] : s[r + 1]].contiguous(), v_all[:, s[r] : s[r + 1]].contiguous()
    return k_all[:, r::w].contiguous(), v_all[:, r::w].contiguous()


def decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mesh: CPMesh,
    cached_len: int,
    layout: str = "contiguous",
    kernel: str | LocalKernel = "auto",
    scale: float | None = None,
    merge: DecodeMerge = "all_gather",
) -> torch.Tensor:
    """Decode attention of `q [B, T, h, D]` (the same on every rank) over this rank's cache
    shard `k`/`v [B, n_r, h_kv, D]` of N = cached_len + T keys; returns the whole output
    `[B, T, h, D]` on every rank (`merge="all_gather"`), or this rank's heads of it
    `[B, T, h / W, D]` (`"all_to_all"`; W must divide h). Collective over the CP group."""
    the_layout = check_cache_layout(layout)
    b, t, h, d = q.shape
    the_merge = check_decode_merge(merge, h, mesh.world)
    if not 1 <= t <= MAX_DECODE_TOKENS:
        raise CpbenchError(f"a decode step takes 1 to {MAX_DECODE_TOKENS} new tokens, got {t}")
    w, r = mesh.world, mesh.rank
    total = cached_len + t
    held = cache_shard_len(total, w, r, the_layout)
    if k.shape[1] != held or v.shape != k.shape or k.shape[3] != d or h % k.shape[2]:
        raise CpbenchError(
            f"rank {r} of {w} holds {held} of the {total} cached keys ({the_layout}); got q "
            f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if isinstance(kernel, str):
        kernel = select_kernel(q.device, q.dtype, kernel, band=False, head_dim=d)
    the_scale = default_scale(d, scale)
    with torch.no_grad():
        out, lse = merge_accumulators(q)
        seen = [cache_visible(total, w, r, the_layout, cached_len + i) for i in range(t)]
        for n in sorted(set(seen) - {0}):
            rows = [i for i, s in enumerate(seen) if s == n]
            lo, hi = rows[0], rows[-1] + 1  # prefix lengths grow with the row: rows are a run
            block_out, block_lse = kernel.forward(q[:, lo:hi], k[:, :n], v[:, :n], False, the_scale)
            out[:, lo:hi] = block_out
            lse[:, :, lo:hi] = block_lse
        partial = out.to(q.dtype)
        if the_merge == "all_to_all":
            # head group i of every partial goes to rank i: [W, B, T, h / W, D], [W, B, h / W, T]
            per = h // w
            by_out = partial.view(b, t, w, per, d).permute(2, 0, 1, 3, 4)
            by_lse = lse.view(b, w, per, t).transpose(0, 1)
            outs = all_to_all(by_out, mesh.cp_group, w, "a2a_out")  # [source rank, ...]
            lses = all_to_all(by_lse, mesh.cp_group, w, "a2a_lse")
        else:
            outs = all_gather_chunks(partial, mesh.cp_group, w, "allgather_out").wait()
            lses = all_gather_chunks(lse, mesh.cp_group, w, "allgather_lse").wait()
        merged, merged_lse = merge_accumulators(outs[0])
        # rank 0 holds position 0, which every query sees: its LSE is finite on every row, so
        # merging from it never meets -inf with -inf (which would be NaN)
        for src in range(w):
            _merge(merged, merged_lse, outs[src], lses[src])
        return merged.to(q.dtype)
