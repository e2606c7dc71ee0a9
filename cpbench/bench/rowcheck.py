"""The full-length sampled-row check: the configuration at its benchmarked length, forward, on a
sample of query rows against every key, in float64. Why and how: docs/design.md section 7."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from cpbench.attention.kernels import LocalKernel, default_scale
from cpbench.attention.layouts import positions
from cpbench.attention.reference import row_visibility
from cpbench.config.bench import BenchConfig
from cpbench.config.tolerances import allowed_error, rounded_terms

DEFAULT_ROWS = 256
"""Query rows sampled by the check."""
CHUNK_BYTES = 256 * 2**20
"""Float64 scores computed at once (rows x heads x keys x 8 bytes), so a long sequence never
holds the whole [rows, L] score matrix of every head."""


def sampled_rows(run_len: int, rows: int = DEFAULT_ROWS) -> torch.Tensor:
    """`rows` distinct positions spread evenly over [0, run_len), 0 and run_len - 1 included
    (all positions when the run is shorter)."""
    if rows >= run_len:
        return torch.arange(run_len)
    return torch.linspace(0, run_len - 1, rows).round().long().unique()


def reference_rows(
    q_rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """float64 softmax(q k^T / sqrt(d)) v of some query rows `[B, r, h, D]` against every key
    `[B, L, h_kv, D]`, masked by `visible [r, L]`; computed in chunks of rows."""
    b, r, h, d = q_rows.shape
    length, kv_heads = k.shape[1], k.shape[2]
    scale = default_scale(d)
    kk = k.double().repeat_interleave(h // kv_heads, dim=2)
    vv = v.double().repeat_interleave(h // kv_heads, dim=2)
    per_row = max(1, b * h * length * 8)
    step = max(1, CHUNK_BYTES // per_row)
    out = []
    for start in range(0, r, step):
        qq = q_rows[:, start : start + step].double()
        scores = torch.einsum("bqhd,bkhd->bhqk", qq, kk) * scale
        keep = visible[start : start + step]
        scores = scores.masked_fill(~keep, float("-inf"))
        probs = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
        out.append(torch.einsum("bhqk,bkhd->bqhd", probs, vv))
    return torch.cat(out, dim=1)


def full_length_row_check(
    config: BenchConfig,
    kernel: LocalKernel,
    device: torch.device,
    rows: int = DEFAULT_ROWS,
    seed: int = 0,
) -> dict[str, Any]:
    """Collective: the sampled-row check (docs/design.md section 7) on every rank; every rank
    returns the same answer (the record's `accuracy.sampled_rows`)."""
    from cpbench.attention import build_mesh, cp_attention  # noqa: PLC0415
    from cpbench.bench.reference import TORCH_DTYPES  # noqa: PLC0415

    dtype = TORCH_DTYPES[config.dtype]
    run_len, run_mask = config.packing.seq_len, config.packing.mask
    g = torch.Generator(device="cpu").manual_seed(seed)
    b, d = config.batch, config.head_dim
    # Global inputs of the run length, identical on every rank (drawn on the CPU from the seed).
    q, k, v = (
        torch.randn(b, run_len, heads, d, generator=g).to(device, dtype)
        for heads in (config.heads, config.kv_heads, config.kv_heads)
    )
    mesh = build_mesh(config.ulysses, config.ring)
    rank = dist.get_rank() if dist.is_initialized() else 0
    mine = positions(config.seq_len, config.ulysses, config.ring, config.layout, rank, config.mask)
    mine = mine.to(device)
    with torch.no_grad():
        lq, lk, lv = (t.index_select(1, mine).contiguous() for t in (q, k, v))
        out = cp_attention(
            lq, lk, lv, mesh, layout=config.layout, kernel=kernel,
            kv_replication=config.kv_replication, mask=config.mask,
        )  # fmt: skip
    wanted = sampled_rows(run_len, rows).to(device)
    held = torch.isin(mine, wanted).nonzero().flatten()  # local indices of the sampled rows
    error = torch.zeros(2, dtype=torch.float64, device=device)  # [max abs error, max |ref|]
    if held.numel():
        global_rows = mine.index_select(0, held)
        visible = row_visibility(run_mask, global_rows, run_len)
        ref = reference_rows(q.index_select(1, global_rows), k, v, visible)
        got = out.index_select(1, held).double()
        error[0] = (got - ref).abs().max()
        error[1] = ref.abs().max()
    if dist.is_initialized():
        dist.all_reduce(error, op=dist.ReduceOp.MAX)
    max_error, ref_max = float(error[0]), float(error[1])
    terms = rounded_terms("out", config.ring, config.heads // config.kv_heads)
    bound = allowed_error(config.dtype, ref_max, terms, run_len)
    return {
        "seq_len": config.seq_len,
        "run_seq_len": run_len,
        "rows": int(wanted.numel()),
        "max_abs_error": max_error,
        "bound": bound,
        "passed": max_error <= bound,
        "method": (
            f"forward at the full length on {int(wanted.numel())} query rows spread evenly over "
            "the run, against every key under the point's mask, float64 reference"
        ),
    }
