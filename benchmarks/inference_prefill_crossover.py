"""Prefill with a cached prefix on gloo ranks: ring pass-KV versus ring pass-Q, side by side.

T new tokens on P cached (T/P from 1/64 to 1), 8 query heads, head dim 64, float32, one thread
per rank, forward only, the new tokens sharded by `--new-token-layout` (zigzag: 2W head-tail
chunks, the default of `prefill_attention` and what `recommend --inference` prices;
contiguous; both: the two side by side). Each configuration runs every layout and scheme
interleaved (kv, q, kv, q, ... for each layout in turn, every iteration) so load drifts hit
them alike; a time is the slowest rank's (all-reduce max of the per-rank
wall time of one `prefill_attention` call, after a barrier), the median of `--iters` after one
warm-up, with the min-max spread. The bytes each rank sent are counted (ByteCounter) and
checked against `model.inference.prefill_bytes`. The measured crossover (the T/P where pass-KV
becomes faster, interpolated in log T/P between the two bracketing points) is printed beside
the model's (`pass_kv_pass_q_crossover` priced with the `cpu-local` hardware profile, and
again with the kernel rate and link latency/bandwidth this script measures on the same ranks).

    python benchmarks/inference_prefill_crossover.py [--cached-len 2048] [--world 2]
        [--kv-heads 8] [--iters 5] [--new-token-layout both] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from scipy.stats import linregress

from cpbench.attention import build_mesh, prefill_attention, shard_prefill
from cpbench.attention.comm import ByteCounter, all_to_all, counting, ring_exchange
from cpbench.attention.kernels import select_kernel
from cpbench.bench.pool import WorkerPool, WorldSpec
from cpbench.config.problem import CpProblem
from cpbench.model.hardware.loading import load_profile
from cpbench.model.hardware.profile import EfficiencyCurve, HardwareProfile, LinkCost
from cpbench.model.hardware.transforms import with_curve, with_link_cost
from cpbench.model.inference import (
    NEW_TOKEN_LAYOUTS,
    PrefillCase,
    prefill_bytes,
    prefill_imbalance,
)
from cpbench.model.inference_cost import pass_kv_pass_q_crossover, price_prefill

HEADS, HEAD_DIM = 8, 64
SCHEMES = ("pass_kv", "pass_q")


def rank_task(
    world: int,
    cached_len: int,
    ratios: list[float],
    kv_heads: int,
    iters: int,
    layouts: tuple[str, ...] = ("zigzag",),
) -> list:
    """On every rank: for each T/P, time both schemes under every new-token layout,
    interleaved; rank 0's list is the result (times are the slowest rank's, seconds, by
    layout then scheme)."""
    torch.set_num_threads(1)
    mesh = build_mesh(1, world)
    g = torch.Generator().manual_seed(0)
    rows = []
    for ratio in ratios:
        t = max(1, round(ratio * cached_len))
        q = torch.randn(1, t, HEADS, HEAD_DIM, generator=g)
        k = torch.randn(1, cached_len + t, kv_heads, HEAD_DIM, generator=g)
        v = torch.randn(1, cached_len + t, kv_heads, HEAD_DIM, generator=g)
        shards = {layout: shard_prefill(q, k, v, mesh, cached_len, layout) for layout in layouts}
        times = {layout: {s: [] for s in SCHEMES} for layout in layouts}
        # per iteration, every rank's CPU seconds on its main thread (the kernels: one torch
        # thread; gloo moves the bytes on its own threads): the work per rank, which two
        # cores shared by W ranks do not show in the wall time
        busy: dict[str, dict[str, list[list[float]]]] = {
            layout: {s: [] for s in SCHEMES} for layout in layouts
        }
        sent: dict[str, dict[str, dict[str, int]]] = {layout: {} for layout in layouts}
        for it in range(iters + 1):
            for layout in layouts:
                lq, lk, lv = shards[layout]
                for scheme in SCHEMES:
                    counter = ByteCounter()
                    dist.barrier()
                    start, cpu = time.perf_counter(), time.thread_time()
                    with counting(counter):
                        prefill_attention(
                            lq, lk, lv, mesh, cached_len, t, scheme, new_token_layout=layout
                        )
                    cpu = time.thread_time() - cpu
                    took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
                    dist.all_reduce(took, op=dist.ReduceOp.MAX)
                    per_rank = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
                    dist.all_gather(per_rank, torch.tensor([cpu], dtype=torch.float64))
                    if it:  # the first round is the warm-up
                        times[layout][scheme].append(float(took))
                        busy[layout][scheme].append([float(c) for c in per_rank])
                    sent[layout][scheme] = dict(counter.as_dict().get("fwd", {}))
        rows.append(
            {"new_tokens": t, "ratio": t / cached_len, "times": times, "cpu": busy, "bytes": sent}
        )
    return rows


def calibrate_task(world: int, kv_heads: int, iters: int) -> dict:
    """On every rank: the numbers the crossover model needs, measured here (rank 0's dict):
    the local kernel's FLOP/s on a 1024 x 2048 full block (4 B H D per pair), and the latency
    and bandwidth of a ring send/recv and of an all-to-all, fitted (scipy linregress) on the
    slowest rank's median time over message sizes 4 KiB - 4 MiB."""
    torch.set_num_threads(1)
    mesh = build_mesh(1, world)
    kernel = select_kernel("cpu", torch.float32, "auto")
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 1024, HEADS, HEAD_DIM, generator=g)
    k = torch.randn(1, 2048, kv_heads, HEAD_DIM, generator=g)
    secs = []
    for _ in range(iters + 1):
        start = time.perf_counter()
        kernel.forward(q, k, k, False, 0.125)
        secs.append(time.perf_counter() - start)
    flops = 4 * HEADS * HEAD_DIM * 1024 * 2048 / statistics.median(secs[1:])
    sizes = [1 << n for n in range(10, 21, 2)]  # float32 elements: 4 KiB .. 4 MiB

    def slowest(fn: Callable[[torch.Tensor], object], x: torch.Tensor) -> float:
        times = []
        for it in range(iters + 1):
            dist.barrier()
            start = time.perf_counter()
            fn(x)
            took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            if it:
                times.append(float(took))
        return statistics.median(times)

    def hop(x: torch.Tensor) -> object:
        return ring_exchange(x, mesh.ring_next, mesh.ring_prev, mesh.ring_group, "cal").wait()

    def a2a(x: torch.Tensor) -> object:
        return all_to_all(x.view(world, -1), mesh.ring_group, world, "cal")

    fits = {}
    for name, fn, sent in (("send_recv", hop, 1.0), ("all_to_all", a2a, (world - 1) / world)):
        xs = [4 * n * sent for n in sizes]  # bytes a rank sends (the model's counting)
        ys = [slowest(fn, torch.randn(n)) for n in sizes]
        fit = linregress(xs, ys)
        # under load the time need not grow with the size: a slope <= 0 is no bandwidth (inf)
        busbw = 1 / fit.slope if fit.slope > 0 else math.inf
        fits[name] = {"latency_s": max(fit.intercept, 0.0), "busbw": busbw, "r2": fit.rvalue**2}
    return {"flops": flops, **fits}


def measured_profile(profile: HardwareProfile, cal: dict) -> HardwareProfile | None:
    """`profile` with the kernel and the intra-node link `calibrate_task` measured on these
    ranks (a flat efficiency: the measured FLOP/s over the profile's float32 peak; send/recv and
    all-to-all latency + bytes / busbw); None when a fit found no bandwidth (time not growing
    with the message size: a loaded machine)."""
    if any(math.isinf(cal[name]["busbw"]) for name in ("send_recv", "all_to_all")):
        return None
    measured = profile
    for name in ("send_recv", "all_to_all"):
        cost = LinkCost(cal[name]["latency_s"], cal[name]["busbw"], "measured by this benchmark")
        measured = with_link_cost(measured, "intra_node", name, cost)  # type: ignore[arg-type]
    efficiency = cal["flops"] / profile.peak_flops("float32")
    curve = EfficiencyCurve((1,), (min(efficiency, 1.0),), "measured by this benchmark")
    return with_curve(measured, profile.default_kernel, curve)


def measured_crossover(rows: list[dict], layout: str) -> float | str:
    """The T/P where pass-KV's median time first beats pass-Q's for good (every larger T/P
    too), interpolated in log T/P on the log of the time ratio between the two bracketing
    points; a sentence when one scheme is faster at every point."""
    gaps = [
        (
            r["ratio"],
            math.log(statistics.median(r["times"][layout]["pass_kv"]))
            - math.log(statistics.median(r["times"][layout]["pass_q"])),
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
    parser.add_argument(
        "--new-token-layout", choices=[*NEW_TOKEN_LAYOUTS, "both"], default="zigzag"
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    p = args.cached_len
    layouts = NEW_TOKEN_LAYOUTS if args.new_token_layout == "both" else (args.new_token_layout,)
    ratios = [1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0]
    with WorkerPool(WorldSpec(args.world, "cpu")) as pool:
        rows = pool.run(
            rank_task, args.world, p, ratios, args.kv_heads, args.iters, layouts, timeout=3000
        )[0]
        cal = pool.run(calibrate_task, args.world, args.kv_heads, args.iters, timeout=600)[0]
    here = measured_profile(load_profile("cpu-local"), cal)
    problem = CpProblem(
        seq_len=1, heads=HEADS, kv_heads=args.kv_heads, head_dim=HEAD_DIM, dtype="float32"
    )
    profile = load_profile("cpu-local")
    print(
        f"prefill on {args.world} gloo ranks ({platform.node()}), P = {p} cached, 8 heads / "
        f"{args.kv_heads} KV heads, d 64, float32, forward; times: slowest rank, median of "
        f"{args.iters} [min-max], milliseconds; imbalance: max / mean pairs per rank"
    )
    print(
        f"measured here: kernel {cal['flops'] / 1e9:.2f} GFLOP/s per rank; send/recv "
        f"{1e6 * cal['send_recv']['latency_s']:.0f} us + bytes / "
        f"{cal['send_recv']['busbw'] / 1e9:.2f} GB/s (fit r2 {cal['send_recv']['r2']:.2f}); "
        f"all-to-all "
        f"{1e6 * cal['all_to_all']['latency_s']:.0f} us + bytes / "
        f"{cal['all_to_all']['busbw'] / 1e9:.2f} GB/s (fit r2 {cal['all_to_all']['r2']:.2f}; "
        f"bytes: what a rank sends)"
    )
    print(
        f"{'layout':>10} {'T/P':>7} {'T':>5} {'imbal':>5} {'pass_kv ms':>22} {'pass_q ms':>22} "
        f"{'kv/q':>6} {'model kv/q':>10} {'(here)':>7} bytes=model"
    )
    for layout in layouts:
        for r in rows:
            print(_row(r, layout, p, args, problem, profile, here))
    for layout in layouts:
        print(f"{layout}: measured crossover T/P: {measured_crossover(rows, layout)}")
        for name, priced in (("cpu-local profile", profile), ("measured kernel + link", here)):
            if priced is None:
                print(f"{layout}: model crossover T/P ({name}): not priced, a link fit found "
                      "no bandwidth")  # fmt: skip
                continue
            crossover = pass_kv_pass_q_crossover(
                p, problem, args.world, priced, new_token_layout=layout  # type: ignore[arg-type]
            )
            print(f"{layout}: model crossover T/P ({name}): {crossover}")
    print(
        "work per rank, measured: max / mean over ranks of each rank's median main-thread CPU "
        "seconds, against the model's max / mean pairs (prefill_imbalance)"
    )
    for layout in layouts:
        for r in rows:
            cells = []
            for s in SCHEMES:
                medians = [statistics.median(c) for c in zip(*r["cpu"][layout][s], strict=True)]
                cells.append(f"{s} {max(medians) / statistics.mean(medians):.2f}")
            model = prefill_imbalance(p, r["new_tokens"], args.world, layout)
            print(f"  {layout:>10} T/P {r['ratio']:.4f}: {', '.join(cells)}; model {model:.2f}")
    if len(layouts) > 1:
        print("contiguous / zigzag median time, by T/P (same run):")
        for r in rows:
            cells = [
                f"{s} {statistics.median(r['times']['contiguous'][s]) / statistics.median(r['times']['zigzag'][s]):.2f}"  # noqa: E501
                for s in SCHEMES
            ]
            print(f"  T/P {r['ratio']:.4f}: {', '.join(cells)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "calibration": cal}, f, indent=1)


def _row(
    r: dict,
    layout: str,
    p: int,
    args: argparse.Namespace,
    problem: CpProblem,
    profile: HardwareProfile,
    here: HardwareProfile | None,
) -> str:
    """One printed row: the layout's measured times, their ratio, the model's, bytes = model."""
    t = r["new_tokens"]
    model, fitted = (
        {s: price_prefill(s, p, t, problem, args.world, priced, new_token_layout=layout).total_s  # type: ignore[arg-type]
         for s in SCHEMES}
        for priced in (profile, here or profile)
    )  # fmt: skip
    times = r["times"][layout]
    cells = [
        f"{1e3 * statistics.median(ts):8.2f} [{1e3 * min(ts):.2f}-{1e3 * max(ts):.2f}]"
        for ts in (times[s] for s in SCHEMES)
    ]
    ratio = statistics.median(times["pass_kv"]) / statistics.median(times["pass_q"])
    mesh = CpProblem(seq_len=p + t, heads=HEADS, kv_heads=args.kv_heads, head_dim=HEAD_DIM,
                     dtype="float32", ring=args.world)  # fmt: skip
    match = all(
        r["bytes"][layout][s] == prefill_bytes(PrefillCase(mesh, p, t, s, new_token_layout=layout))
        for s in SCHEMES
    )
    imbalance = prefill_imbalance(p, t, args.world, layout)
    return (
        f"{layout:>10} {r['ratio']:7.4f} {t:5d} {imbalance:5.2f} {cells[0]:>22} {cells[1]:>22} "
        f"{ratio:6.2f} {model['pass_kv'] / model['pass_q']:10.2f} "
        f"{fitted['pass_kv'] / fitted['pass_q'] if here else math.nan:7.2f} "
        f"{'yes' if match else 'NO'}"
    )


if __name__ == "__main__":
    main()
