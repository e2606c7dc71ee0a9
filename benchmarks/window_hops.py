"""The ring hops a sliding window skips: bytes and step time on 4 gloo ranks.

Causal contiguous ring of 4 versus the same with a sliding window of L/8, L = 8192, 8 heads,
head dim 64, float32, forward+backward, one thread per rank. Bytes sent per rank are counted
(ByteCounter: what each rank hands to gloo) and compared with the protocol of docs/design.md
(forward k - 1 K/V hops, backward k - 1 K/V hops + k fp32 dK/dV hops, k = the schedule's
steps); step time is the slowest rank's, best of `--iters`, the two masks interleaved.

    python benchmarks/window_hops.py [--seq-len 8192] [--iters 5]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch
import torch.distributed as dist

from cpbench.attention import build_mesh, cp_attention, shard
from cpbench.attention.comm import ByteCounter, counting
from cpbench.bench.pool import WorkerPool, WorldSpec
from cpbench.config.geometry import pack, ring_schedule
from cpbench.config.masks import MaskSpec

HEADS, HEAD_DIM, RING = 8, 64, 4


def protocol_bytes(mask: MaskSpec, seq_len: int) -> dict[str, int]:
    """Per-rank bytes of the protocol for a fp32 ring of 4 (K/V and dK/dV chunks alike)."""
    steps = ring_schedule(pack(mask, seq_len, 1, RING, "contiguous")).steps
    chunk = (seq_len // RING) * 2 * HEADS * HEAD_DIM * 4
    hops_kv = steps - 1
    return {
        "steps": steps,
        "fwd": hops_kv * chunk,
        "bwd": hops_kv * chunk + (steps * chunk if steps > 1 else 0),
    }


def rank_task(seq_len: int, windows: list[int | None], iters: int) -> dict:
    torch.set_num_threads(1)
    mesh = build_mesh(1, RING)
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (
        shard(torch.randn(1, seq_len, HEADS, HEAD_DIM, generator=g), mesh, "contiguous")
        for _ in range(4)
    )
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    masks = [MaskSpec(window=w) for w in windows]

    def step(mask: MaskSpec) -> None:
        for t in (q, k, v):
            t.grad = None
        out = cp_attention(q, k, v, mesh, layout="contiguous", mask=mask)
        out.backward(dout)

    counted = []
    for mask in masks:
        step(mask)  # warm-up
        counter = ByteCounter()
        with counting(counter):
            for t in (q, k, v):
                t.grad = None
            out = cp_attention(q, k, v, mesh, layout="contiguous", mask=mask)
            with counter.phase("bwd"):
                out.backward(dout)
        counted.append({"fwd": counter.total("fwd"), "bwd": counter.total("bwd")})
    best = [float("inf")] * len(masks)
    for _ in range(iters):
        for i, mask in enumerate(masks):  # interleaved: drift hits both alike
            dist.barrier()
            start = time.perf_counter()
            step(mask)
            elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's step
            best[i] = min(best[i], float(elapsed))
    return {"rank": dist.get_rank(), "bytes": counted, "best_s": best}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    windows: list[int | None] = [None, args.seq_len // 8]
    with WorkerPool(WorldSpec(RING, "cpu")) as pool:
        per_rank = pool.run(rank_task, args.seq_len, windows, args.iters, timeout=3600)
    print(
        f"# L={args.seq_len} h={HEADS} d_h={HEAD_DIM} float32 fwd+bwd, contiguous ring of "
        f"{RING} (gloo, 1 thread/rank), {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}; bytes sent per rank (MiB = 2^20 B), step time = slowest "
        f"rank, best of {args.iters} interleaved"
    )
    rows = []
    for i, window in enumerate(windows):
        mask = MaskSpec(window=window)
        expected = protocol_bytes(mask, args.seq_len)
        counted = [r["bytes"][i] for r in per_rank]
        exact = all(
            c["fwd"] == expected["fwd"] and c["bwd"] == expected["bwd"] for c in counted
        )
        row = {
            "mask": mask.label,
            "steps": expected["steps"],
            "fwd_bytes": counted[0]["fwd"],
            "bwd_bytes": counted[0]["bwd"],
            "protocol_fwd_bytes": expected["fwd"],
            "protocol_bwd_bytes": expected["bwd"],
            "bytes_equal_protocol_on_every_rank": exact,
            "step_s": per_rank[0]["best_s"][i],
        }
        rows.append(row)
        print(
            f"{mask.label:>12}: {expected['steps']} ring steps, fwd {row['fwd_bytes'] / 2**20:6.2f} "
            f"MiB, bwd {row['bwd_bytes'] / 2**20:6.2f} MiB (protocol: "
            f"{'equal' if exact else 'DIFFERENT'}), step {row['step_s'] * 1e3:8.1f} ms"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
