"""Parallel efficiency of cpbench's CP attention on this machine.

Single-process fused-SDPA causal forward+backward at L=8192, 8 heads, head dim 64, float32,
one thread, versus the same global problem on 2 ranks (gloo, one thread each) with ring/zigzag,
ring/contiguous and ulysses. Efficiency = t_single / (P * t_cp).

    python benchmarks/parallel_efficiency.py [--seq-len 8192] [--iters 5]
"""

from __future__ import annotations

import argparse
import json
import platform

import torch

from cpbench.attention import build_mesh, cp_attention, shard
from cpbench.attention.kernels import CpuSdpaKernel, default_scale
from cpbench.bench.pool import WorkerPool, WorldSpec
from cpbench.bench.timing import TimingSummary, time_iterations

HEADS, HEAD_DIM = 8, 64


def _inputs(seq_len: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, seq_len, HEADS, HEAD_DIM, generator=g) for _ in range(4))


def single_process(seq_len: int, warmup: int, iters: int) -> float:
    torch.set_num_threads(1)
    q, k, v, dout = _inputs(seq_len)
    kernel, scale = CpuSdpaKernel(), default_scale(HEAD_DIM)

    def step() -> None:
        out, lse = kernel.forward(q, k, v, True, scale)
        kernel.backward(dout, q, k, v, out, lse, True, scale)

    return TimingSummary.of(time_iterations(step, warmup, iters, torch.device("cpu"))).median


def cp_rank(seq_len: int, ulysses: int, ring: int, layout: str, warmup: int, iters: int) -> float:
    mesh = build_mesh(ulysses, ring)
    q, k, v, dout = (shard(t, mesh, layout) for t in _inputs(seq_len))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))

    def step() -> None:
        out = cp_attention(q, k, v, mesh, causal=True, layout=layout)
        out.backward(dout)

    return TimingSummary.of(time_iterations(step, warmup, iters, torch.device("cpu"))).median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()
    t_single = single_process(args.seq_len, args.warmup, args.iters)
    rows = [{"scheme": "single process", "seconds": t_single, "efficiency": 1.0}]
    with WorkerPool(WorldSpec(2, "cpu")) as pool:
        for name, u, r, layout in (
            ("ring/zigzag", 1, 2, "zigzag"),
            ("ring/contiguous", 1, 2, "contiguous"),
            ("ring/striped", 1, 2, "striped"),
            ("ulysses", 2, 1, "contiguous"),
        ):
            t = pool.run(cp_rank, args.seq_len, u, r, layout, args.warmup, args.iters)[0]
            rows.append({"scheme": name, "seconds": t, "efficiency": t_single / (2 * t)})
    print(
        f"# L={args.seq_len} h={HEADS} d_h={HEAD_DIM} float32 causal fwd+bwd, "
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}"
    )
    for row in rows:
        print(
            f"{row['scheme']:>16}  {row['seconds'] * 1e3:9.1f} ms  efficiency {row['efficiency']:.2f}"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
