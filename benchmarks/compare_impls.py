"""Side-by-side: cpbench's ring / zigzag / Ulysses / USP next to the external implementations
(torch_cp = PyTorch context_parallel, ring_flash_attn, yunchang; TransformerEngine where a GPU
runs it) on the same shapes, the same world size and the same machine, in one run.

Every configuration goes through the sweep harness (`cpbench.app.sweep.run_sweep`): correctness
check against the float64 reference, warm-up, timed iterations (per-iteration max over
ranks), bytes counted per rank (cpbench: its own communicator; the libraries: at the
torch.distributed boundary), peak memory per rank. Printed per world size and dtype: median
step, ratio to cpbench on the same mesh and layout, bytes per rank (forward + backward), peak
memory per rank, max abs error of the check.

On a CPU, ring-flash-attention and yunchang run on the tests' stand-in flash_attn
(tests/stand_ins: PyTorch's fused CPU attention behind flash-attn's private API), and, like
flash-attn, only in fp16/bf16: they are measured in the bfloat16 group, where cpbench and
torch_cp run too. float32 compares cpbench with torch_cp.

All-gather CP side by side (issue 13): cpbench's own all-gather scheme (`cp_comm="all_gather"`,
U = 1, zigzag; one gather of all KV heads and with `--heads-k-stride`) against `torch_cp`
(PyTorch's context_parallel, whose default rotate method is all-gather, with its head-tail
balancer = zigzag), on the same ranks, shapes and kernel (SDPA), at every world size in one
run: rounds interleave the implementations (so machine noise hits them alike), each round
times one fwd+bwd step as the max over ranks, and the best of `--rounds` is kept. The ratio
printed is torch_cp / cpbench (> 1: cpbench faster). `--allgather-only` skips the sweep part.

    python benchmarks/compare_impls.py [--seq-len 4096] [--world-sizes 2 4] [--iters 3]
    python benchmarks/compare_impls.py --allgather-only [--rounds 7] [--kv-heads 2]
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from cpbench.app.sweep import run_sweep
from cpbench.results.scenarios.loading import parse_scenario
from cpbench.results.store import read_records

ROOT = Path(__file__).resolve().parent.parent
IMPLS = {
    "float32": ["cpbench", "torch_cp", "torch_cp:alltoall"],
    "bfloat16": ["cpbench", "torch_cp", "ring_flash_attn", "yunchang"],
}
GPU_EXTRA = ["transformer_engine"]


def _use_stand_in() -> bool:
    """On a machine without CUDA, put the tests' flash_attn stand-in on sys.path (the ranks
    spawned afterwards inherit it)."""
    if torch.cuda.is_available():
        return False
    sys.path.insert(0, str(ROOT / "tests" / "stand_ins"))
    return True


def measure(
    world: int, dtype: str, args: argparse.Namespace, out: Path, device: str
) -> list[dict[str, Any]]:
    impls = IMPLS[dtype] + (GPU_EXTRA if device == "cuda" and dtype != "float32" else [])
    spec = parse_scenario(
        {
            "name": f"compare-impls-w{world}-{dtype}",
            "world_size": world,
            "device": device,
            "warmup": args.warmup,
            "iters": args.iters,
            "timeout": args.timeout,
            "check_max_seq_len": args.check_max_seq_len,
            "axes": {
                "seq_len": args.seq_len,
                "heads": args.heads,
                "head_dim": args.head_dim,
                "dtype": dtype,
                "causal": True,
                "mesh": "all",
                "layout": "zigzag",
                "impl": impls,
            },
        },
        "<compare_impls>",
    )
    if out.exists():
        out.unlink()
    run_sweep(spec, device, world, out)
    return read_records(out)


def rows_of(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    base = {
        (r["config"]["ulysses"], r["config"]["ring"]): r["timing"]["median"]
        for r in records
        if r["status"] == "ok" and r["config"]["impl"] == "cpbench"
    }
    rows = []
    for r in records:
        c = r["config"]
        row: dict[str, Any] = {
            "impl": c["impl"],
            "mesh": f"U{c['ulysses']}xR{c['ring']}",
            "dtype": c["dtype"],
            "status": r["status"],
        }
        if r["status"] == "ok":
            step = r["timing"]["median"]
            cpbench = base.get((c["ulysses"], c["ring"]))
            measured = r["comm"]["measured_bytes"]
            row.update(
                step_s=step,
                ratio=step / cpbench if cpbench else None,
                bytes_per_rank=max(sum(x) for x in zip(*measured.values(), strict=True)),
                peak_mem=max(r["memory"]["peak_bytes"]),
                max_err=r["accuracy"]["max_abs_error"] if r["accuracy"] else None,
                kernel=c["kernel"],
            )
        else:
            row["reason"] = r["error"]
        rows.append(row)
    return rows


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def print_table(world: int, dtype: str, rows: list[dict[str, Any]], seq_len: int) -> None:
    print(f"\n## world size {world}, {dtype}, L={seq_len}")
    print("| impl | mesh | step | vs cpbench | bytes/rank (fwd+bwd) | peak mem/rank | max err |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        if row["status"] != "ok":
            reason = (row.get("reason") or "")[:90]
            print(f"| {row['impl']} | {row['mesh']} | {row['status']}: {reason} | | | | |")
            continue
        ratio = f"{row['ratio']:.2f}x" if row["ratio"] else "-"
        print(
            f"| {row['impl']} | {row['mesh']} | {row['step_s'] * 1e3:.0f} ms | {ratio} | "
            f"{_mib(row['bytes_per_rank'])} | {_mib(row['peak_mem'])} | {row['max_err']:.1e} |"
        )


ALLGATHER_IMPLS = ("cpbench all-gather", "cpbench all-gather hs1", "torch_cp")
"""What the all-gather comparison times, interleaved in every round."""


def allgather_rounds(
    world: int, seq_len: int, heads: int, kv_heads: int, head_dim: int, rounds: int
) -> dict[str, Any]:
    """On every rank of a `world`-rank pool: interleaved rounds of cpbench all-gather (one
    gather, and one KV head per gather) and torch_cp (rotate allgather), one fwd+bwd step each,
    the step time the max over ranks; returns the best round per impl and the max abs error
    of each against cpbench's output on the same inputs."""
    from cpbench.attention import build_mesh, cp_attention, shard  # noqa: PLC0415
    from cpbench.config.bench import BenchConfig  # noqa: PLC0415
    from cpbench.impls import get_adapter  # noqa: PLC0415

    config = BenchConfig(
        seq_len=seq_len, batch=1, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
        dtype="float32", causal=True, ulysses=1, ring=world, layout="zigzag",
        kv_replication=None, kernel="sdpa", phase="fwd+bwd", device="cpu",
        world_size=world, impl="torch_cp",
    )
    runner = get_adapter("torch_cp").prepare(config)
    mesh = build_mesh(1, world)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, seq_len, heads, head_dim, generator=g)
    k = torch.randn(1, seq_len, kv_heads, head_dim, generator=g)
    v = torch.randn(1, seq_len, kv_heads, head_dim, generator=g)
    ours = [shard(t, mesh, "zigzag").requires_grad_(True) for t in (q, k, v)]
    theirs = [runner.shard(t).requires_grad_(True) for t in (q, k, v)]

    def step(impl: str) -> tuple[float, torch.Tensor]:
        dist.barrier()
        start = time.perf_counter()
        if impl == "torch_cp":
            with runner.context():
                out = runner.forward(*theirs)
                out.sum().backward()
        else:
            stride = 1 if impl.endswith("hs1") else None
            out = cp_attention(
                ours[0], ours[1], ours[2], mesh, layout="zigzag", kernel="sdpa",
                cp_comm="all_gather", heads_k_stride=stride,
            )
            out.sum().backward()
        elapsed = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        return float(elapsed), out.detach()

    outputs = {impl: step(impl)[1] for impl in ALLGATHER_IMPLS}  # warm-up, and the outputs
    reference = runner.unshard(outputs["torch_cp"])
    errors = {}
    for impl in ALLGATHER_IMPLS[:2]:
        pieces = [torch.empty_like(outputs[impl]) for _ in range(world)]
        dist.all_gather(pieces, outputs[impl].contiguous())
        from cpbench.attention.layouts import unshard_tensors  # noqa: PLC0415

        full = unshard_tensors(pieces, 1, world, "zigzag", 1, None)
        errors[impl] = float((full - reference).abs().max())
    best = {impl: float("inf") for impl in ALLGATHER_IMPLS}
    for r in range(rounds):
        order = ALLGATHER_IMPLS if r % 2 == 0 else tuple(reversed(ALLGATHER_IMPLS))
        for impl in order:
            for t in (*ours, *theirs):
                t.grad = None
            best[impl] = min(best[impl], step(impl)[0])
    return {"best_s": best, "max_abs_error_vs_torch_cp": errors}


def compare_allgather(args: argparse.Namespace) -> list[dict[str, Any]]:
    """cpbench all-gather against torch_cp at every world size, one pool per world size."""
    from cpbench.bench.pool import WorkerPool, WorldSpec  # noqa: PLC0415

    sys.path.insert(0, str(ROOT))  # the ranks import this module by name to run the rounds
    module = importlib.import_module("benchmarks.compare_impls")
    blocks = []
    print(
        f"\n## all-gather CP: cpbench vs torch_cp (rotate allgather), causal fwd+bwd, zigzag, "
        f"float32, L={args.seq_len} h={args.heads} h_kv={args.kv_heads} d_h={args.head_dim}, "
        f"best of {args.rounds} interleaved rounds, step = max over ranks"
    )
    print("| world | impl | best step | torch_cp / impl | max abs err vs torch_cp |")
    print("|---|---|---|---|---|")
    for world in args.world_sizes:
        with WorkerPool(WorldSpec(world, "cpu")) as pool:
            result = pool.run(
                module.allgather_rounds,
                world,
                args.seq_len,
                args.heads,
                args.kv_heads,
                args.head_dim,
                args.rounds,
                timeout=args.timeout,
            )[0]
        best, errors = result["best_s"], result["max_abs_error_vs_torch_cp"]
        for impl in ALLGATHER_IMPLS:
            ratio = best["torch_cp"] / best[impl]
            err = f"{errors[impl]:.1e}" if impl in errors else "-"
            print(f"| {world} | {impl} | {best[impl] * 1e3:.1f} ms | {ratio:.2f}x | {err} |")
        blocks.append({"world_size": world, **result})
    return blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                        choices=sorted(IMPLS))
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--check-max-seq-len", type=int, default=512)
    parser.add_argument("--out-dir", type=Path, default=Path("results"))
    parser.add_argument("--kv-heads", type=int, default=2,
                        help="KV heads of the all-gather comparison (GQA: what travels)")
    parser.add_argument("--rounds", type=int, default=7,
                        help="interleaved rounds of the all-gather comparison (best kept)")
    parser.add_argument("--allgather-only", action="store_true",
                        help="only the all-gather comparison (cpbench vs torch_cp)")
    args = parser.parse_args()
    if args.allgather_only:
        print(json.dumps(compare_allgather(args), default=str))
        return
    device = "cuda" if torch.cuda.is_available() else "cpu"
    stand_in = _use_stand_in()
    print(
        f"# causal fwd+bwd, h={args.heads} d_h={args.head_dim} B=1, {device} "
        f"({platform.processor() or platform.machine()}), torch {torch.__version__}"
        + (", flash_attn = CPU stand-in (tests/stand_ins)" if stand_in else "")
    )
    summary = []
    for world in args.world_sizes:
        for dtype in args.dtypes:
            out = args.out_dir / f"compare-impls-w{world}-{dtype}.jsonl"
            rows = rows_of(measure(world, dtype, args, out, device))
            print_table(world, dtype, rows, args.seq_len)
            summary.append({"world_size": world, "dtype": dtype, "rows": rows, "file": str(out)})
    ratios = [
        row["ratio"]
        for block in summary
        for row in block["rows"]
        if row.get("ratio") and row["impl"] != "cpbench"
    ]
    if ratios:
        print(f"\nmedian step-time ratio external / cpbench: {statistics.median(ratios):.2f}")
    allgather = compare_allgather(args) if device == "cpu" else []
    print(json.dumps({"sweep": summary, "all_gather": allgather}, default=str))


if __name__ == "__main__":
    main()
