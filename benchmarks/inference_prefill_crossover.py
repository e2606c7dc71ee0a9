"""Prefill with a cached prefix on gloo ranks: ring pass-KV versus ring pass-Q, side by side.

T new tokens on P cached (T/P from 1/64 to 1), 8 query heads, head dim 64, float32, one thread
per rank, forward only. Each configuration runs the two schemes interleaved (kv, q, kv, q, ...)
so load drifts hit both alike; a time is the slowest rank's (all-reduce max of the per-rank
wall time of one `prefill_attention` call, after a barrier), the median of `--iters` after one
warm-up, with the min-max spread. The bytes each rank sent are counted (ByteCounter) and
checked against `model.inference.prefill_bytes`. The measured crossover (the T/P where pass-KV
becomes faster, interpolated in log T/P between the two bracketing points) is printed beside
the model's (`pass_kv_pass_q_crossover` priced with the `cpu-local` hardware profile).

    python benchmarks/inference_prefill_crossover.py [--cached-len 2048] [--world 2]
        [--kv-heads 8] [--iters 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time

import torch
import torch.distributed as dist

from cpbench.attention import build_mesh, prefill_attention, shard_prefill
from cpbench.attention.comm import ByteCounter, counting
from cpbench.bench.pool import WorkerPool, WorldSpec
from cpbench.config.problem import CpProblem
from cpbench.model.hardware.loading import load_profile
from cpbench.model.inference import (
    PrefillCase,
    RingLink,
    pass_kv_pass_q_crossover,
    prefill_bytes,
    prefill_time,
)

HEADS, HEAD_DIM = 8, 64
SCHEMES = ("pass_kv", "pass_q")


def rank_task(world: int, cached_len: int, ratios: list[float], kv_heads: int, iters: int) -> list:
    """On every rank: for each T/P, time both schemes interleaved; rank 0's list is the
    result (times are the slowest rank's, seconds)."""
    torch.set_num_threads(1)
    mesh = build_mesh(1, world)
    g = torch.Generator().manual_seed(0)
    rows = []
    for ratio in ratios:
        t = max(1, round(ratio * cached_len))
        q = torch.randn(1, t, HEADS, HEAD_DIM, generator=g)
        k = torch.randn(1, cached_len + t, kv_heads, HEAD_DIM, generator=g)
        v = torch.randn(1, cached_len + t, kv_heads, HEAD_DIM, generator=g)
        lq, lk, lv = shard_prefill(q, k, v, mesh, cached_len)
        times: dict[str, list[float]] = {s: [] for s in SCHEMES}
        sent: dict[str, dict[str, int]] = {}
        for it in range(iters + 1):
            for scheme in SCHEMES:
                counter = ByteCounter()
                dist.barrier()
                start = time.perf_counter()
                with counting(counter):
                    prefill_attention(lq, lk, lv, mesh, cached_len, t, scheme)
                took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
                dist.all_reduce(took, op=dist.ReduceOp.MAX)
                if it:  # the first round is the warm-up
                    times[scheme].append(float(took))
                sent[scheme] = dict(counter.as_dict().get("fwd", {}))
        rows.append({"new_tokens": t, "ratio": t / cached_len, "times": times, "bytes": sent})
    return rows


def measured_crossover(rows: list[dict]) -> float | str:
    """The T/P where pass-KV's median time first beats pass-Q's for good (every larger T/P
    too), interpolated in log T/P on the log of the time ratio between the two bracketing
    points; a sentence when one scheme is faster at every point."""
    gaps = [
        (
            r["ratio"],
            math.log(statistics.median(r["times"]["pass_kv"]))
            - math.log(statistics.median(r["times"]["pass_q"])),
        )
        for r in rows
    ]
    if all(g <= 0 for _, g in gaps):
        return "none: pass-KV faster at every T/P"
    if all(g > 0 for _, g in gaps):
        return "none: pass-Q faster at every T/P"
    last_q = max(i for i, (_, g) in enumerate(gaps) if g > 0)
    if last_q + 1 == len(gaps):
        return "none: pass-Q faster at the largest T/P"
    (r0, g0), (r1, g1) = gaps[last_q], gaps[last_q + 1]
    f = g0 / (g0 - g1)
    return math.exp(math.log(r0) + f * (math.log(r1) - math.log(r0)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cached-len", type=int, default=2048)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    p = args.cached_len
    ratios = [1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0]
    with WorkerPool(WorldSpec(args.world, "cpu")) as pool:
        rows = pool.run(rank_task, args.world, p, ratios, args.kv_heads, args.iters, timeout=3000)[
            0
        ]
    problem = CpProblem(
        seq_len=1, heads=HEADS, kv_heads=args.kv_heads, head_dim=HEAD_DIM, dtype="float32"
    )
    profile = load_profile("cpu-local")
    print(
        f"prefill on {args.world} gloo ranks ({platform.node()}), P = {p} cached, 8 heads / "
        f"{args.kv_heads} KV heads, d 64, float32, forward; times: slowest rank, median of "
        f"{args.iters} [min-max], milliseconds"
    )
    print(
        f"{'T/P':>7} {'T':>5} {'pass_kv ms':>22} {'pass_q ms':>22} {'kv/q':>6} {'model kv/q':>10} bytes=model"
    )
    for r in rows:
        t = r["new_tokens"]
        link = RingLink.from_profile(profile, "float32", args.world, (p + t) / args.world)
        model = {s: prefill_time(s, p, t, problem, args.world, link) for s in SCHEMES}
        cells = []
        for s in SCHEMES:
            ts = r["times"][s]
            cells.append(
                f"{1e3 * statistics.median(ts):8.2f} [{1e3 * min(ts):.2f}-{1e3 * max(ts):.2f}]"
            )
        ratio = statistics.median(r["times"]["pass_kv"]) / statistics.median(r["times"]["pass_q"])
        match = all(
            r["bytes"][s]
            == prefill_bytes(
                PrefillCase(
                    CpProblem(
                        seq_len=p + t,
                        heads=HEADS,
                        kv_heads=args.kv_heads,
                        head_dim=HEAD_DIM,
                        dtype="float32",
                        ring=args.world,
                    ),
                    p,
                    t,
                    s,
                )
            )
            for s in SCHEMES
        )
        print(
            f"{r['ratio']:7.4f} {t:5d} {cells[0]:>22} {cells[1]:>22} {ratio:6.2f} "
            f"{model['pass_kv'] / model['pass_q']:10.2f} {'yes' if match else 'NO'}"
        )
    link = RingLink.from_profile(profile, "float32", args.world, p / args.world)
    print(f"measured crossover T/P: {measured_crossover(rows)}")
    print(
        f"model crossover T/P (cpu-local profile): {pass_kv_pass_q_crossover(p, problem, args.world, link)}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
