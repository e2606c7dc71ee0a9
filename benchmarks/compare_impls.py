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

    python benchmarks/compare_impls.py [--seq-len 4096] [--world-sizes 2 4] [--iters 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from cpbench.app.sweep import run_sweep
from cpbench.results.scenarios import parse_scenario
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
    args = parser.parse_args()
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
    print(json.dumps(summary, default=str))


if __name__ == "__main__":
    main()
