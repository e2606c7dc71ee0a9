"""Predicted dynamic-CP speedups on Megatron-LM's own benchmark set-up and on a heavier tail:
the three policies of `cpbench recommend --lengths` (cpbench/model/dynamic) over the batches
that benchmark draws, on a hardware profile.

Megatron's benchmark (examples/dynamic_context_parallel, branch dev): lognormal lengths of mean
1024 and sigma 1.5 clipped to 128-8192, 2048 tokens per rank, static CP 4, 2 x W sequences per
global batch (8 micro-batches of 1 per DP rank), iterations 10-29 of 30, the 10%-trimmed mean
of the iteration time; it reports 1.285x (4 GPUs), 1.412 (8), 1.212 (16), 1.375 (32), 1.495
(64) end to end (a 12-layer GPT of hidden 2048, 16 heads) with its legacy scheduler.

    PYTHONPATH=$PWD python benchmarks/dynamic_cp_predicted.py [--hardware h100-sxm]

Prints per world size the trimmed-mean step of each policy and the speedups, and the seconds
the three plans took."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cpbench.config.documents import draw_lengths  # noqa: E402
from cpbench.model.dynamic import DynamicProblem, plan_policies  # noqa: E402
from cpbench.model.hardware.loading import load_profile  # noqa: E402

PUBLISHED = {4: 1.285, 8: 1.412, 16: 1.212, 32: 1.375, 64: 1.495}
"""Megatron's README: trimmed-mean iteration-time speedup of dynamic CP over static CP 4."""
SHAPES = {
    # name: (lengths, tokens per rank, heads, kv heads, static CP, sequences per batch or None)
    "megatron-benchmark": ("mean=1024,sigma=1.5,min=128,max=8192", 2048, 16, 16, 4, "2W"),
    "heavier-tail": ("mean=4096,sigma=2,min=256,max=131072", 16384, 32, 8, None, None),
}
ITERATIONS = range(10, 30)
"""The benchmark's timed iterations (the first 10 of 30 are warm-up)."""


def trimmed_mean(values: list[float], share: float = 0.1) -> float:
    """Megatron's: drop int(share x n) values from each end."""
    cut = int(share * len(values))
    kept = sorted(values)[cut : len(values) - cut]
    return statistics.fmean(kept)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hardware", default="h100-sxm")
    parser.add_argument("--gpus", type=int, nargs="*", default=sorted(PUBLISHED))
    args = parser.parse_args()
    profile = load_profile(args.hardware)
    for shape, (params, per_rank, heads, kv_heads, static_cp, count) in SHAPES.items():
        print(f"{shape}: lognormal {params}, {per_rank} tokens per rank, {heads}/{kv_heads} "
              f"heads, static CP {static_cp or 'the power of two of the longest'}, "
              f"{'2 x W sequences' if count else '8 micro-batches of W x C tokens'} a batch, "
              f"{args.hardware}; step = one attention layer fwd+bwd, trimmed mean over "
              f"iterations {ITERATIONS.start}-{ITERATIONS.stop - 1}")
        print(f"{'GPUs':>5} {'static ms':>10} {'megatron ms':>12} {'cpbench ms':>11} "
              f"{'megatron/static':>16} {'cpbench/static':>15} {'cpbench/megatron':>17} "
              f"{'published':>10} {'plan s':>7}")
        for world in args.gpus:
            if int(params.rsplit("max=", 1)[1]) > world * per_rank:
                continue  # the longest sequence needs more ranks than the world has
            steps: dict[str, list[float]] = {"static": [], "megatron": [], "cpbench": []}
            seconds = 0.0
            for iteration in ITERATIONS:
                lengths = draw_lengths("lognormal", params, 8 * world * per_rank, iteration)
                if count:
                    lengths = lengths[: 2 * world]
                problem = DynamicProblem(tuple(lengths), world, per_rank, heads, kv_heads, 128,
                                         static_cp=static_cp)  # fmt: skip
                start = time.perf_counter()
                plans = plan_policies(problem, profile)
                seconds += time.perf_counter() - start
                for name, plan in plans.items():
                    steps[name].append(plan.step_s)
            s, m, c = (trimmed_mean(steps[k]) for k in ("static", "megatron", "cpbench"))
            published = f"{PUBLISHED[world]:.3f}" if count and world in PUBLISHED else "-"
            print(f"{world:>5} {s * 1e3:>10.3f} {m * 1e3:>12.3f} {c * 1e3:>11.3f} "
                  f"{s / m:>16.3f} {s / c:>15.3f} {m / c:>17.3f} {published:>10} "
                  f"{seconds / len(ITERATIONS):>7.3f}")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
