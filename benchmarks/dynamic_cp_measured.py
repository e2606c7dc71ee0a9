"""Dynamic CP measured on this machine beside its prediction: a skewed batch of whole sequences,
the three policies of `cpbench recommend --lengths` planned on a profile, each plan routed to
gloo subgroups of one pool of W ranks (every group checked against the single-process reference
first), timed in interleaved rounds; the measured and predicted speedups over static CP and the
ranking by each.

    PYTHONPATH=$PWD python benchmarks/dynamic_cp_measured.py [--world 4] [--rounds 3]
        [--calibrate | --hardware PROFILE]

--calibrate first measures single sequences, and packs of the batch's distribution, on every
mesh of 1, 2 and W ranks (`cpbench sweep`, about a minute) and prices the plans on the profile
`cpbench calibrate` fits to them (the packs fix the call overhead): the prediction of a
calibrated model, what the bar is about.

Issue 37's bar (CPU, gloo, world 4): the best policy's measured speedup within 15% of the
predicted one, every routed result right, the ranking by measurement that of the prediction."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cpbench.app.dynamic import measure_policies  # noqa: E402
from cpbench.config.documents import draw_lengths  # noqa: E402
from cpbench.model.dynamic import DynamicProblem, plan_policies, speedup  # noqa: E402
from cpbench.model.hardware.loading import load_profile  # noqa: E402

CALIBRATION = """name = "dynamic-cp-calibration"
description = "Single sequences on every mesh, to calibrate the dynamic-CP prices."
device = "cpu"
warmup = 1
iters = 6
budget = 1.0
check_max_seq_len = 512

[axes]
seq_len = [256, 1024, 2048]
heads = {heads}
kv_heads = {heads}
head_dim = {head_dim}
dtype = "float32"
causal = true
mesh = "all"
layout = ["zigzag", "doc_zigzag"]
# packed documents of the batch's distribution: what each extra kernel call costs
documents = ["none", "lognormal:{lengths}"]
"""


def calibrated_profile(folder: Path, world: int, heads: int, head_dim: int, lengths: str) -> str:
    """Sweep single sequences and packs of `lengths` (lognormal parameters) at worlds 1, 2 and
    `world`, calibrate: the fitted profile's path."""
    scenario = folder / "calibration.toml"
    scenario.write_text(CALIBRATION.format(heads=heads, head_dim=head_dim, lengths=lengths))
    results = []
    for w in sorted({1, 2, world}):
        out = folder / f"w{w}.jsonl"
        subprocess.run([sys.executable, "-m", "cpbench", "sweep", str(scenario), "--world-size",
                        str(w), "--out", str(out), "--yes"], check=True, capture_output=True)
        results.append(str(out))
    profile = folder / "calibrated.toml"
    subprocess.run([sys.executable, "-m", "cpbench", "calibrate", *results, "-o", str(profile)],
                   check=True, capture_output=True)  # fmt: skip
    return str(profile)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--tokens-per-rank", type=int, default=512)
    parser.add_argument("--lengths", default="mean=256,sigma=1.3,min=32,max=2048",
                        help="lognormal parameters of the batch")  # fmt: skip
    parser.add_argument("--micro-batches", type=int, default=4,
                        help="the batch holds this many micro-batches of W x C tokens")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--hardware", default="cpu-local")
    parser.add_argument("--calibrate", action="store_true",
                        help="calibrate the profile on this machine first (see above)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="cpbench-dcp-"))
    if args.calibrate:
        args.hardware = calibrated_profile(folder, args.world, args.heads, args.head_dim,
                                           args.lengths)
    profile = load_profile(args.hardware)
    budget = args.micro_batches * args.world * args.tokens_per_rank
    lengths = tuple(draw_lengths("lognormal", args.lengths, budget, args.seed))
    problem = DynamicProblem(lengths, args.world, args.tokens_per_rank, args.heads, args.heads,
                             args.head_dim, "float32", static_cp=args.world)  # fmt: skip
    plans = plan_policies(problem, profile)
    print(f"batch: {len(lengths)} sequences, {sum(lengths):,} tokens (lognormal {args.lengths}), "
          f"{args.world} gloo ranks of {args.tokens_per_rank} tokens, {args.heads} heads of "
          f"{args.head_dim}, float32; profile {args.hardware}; step = fwd+bwd of one attention "
          f"layer over the batch, median of {args.rounds} interleaved rounds")
    start = time.perf_counter()
    settings = {"warmup": 1, "iters": 6, "precision": 0.05, "budget": 3.0, "rounds": args.rounds}
    measured = measure_policies(problem, profile, plans, settings)
    wall = time.perf_counter() - start
    static_measured = measured["static"].median_s
    print(f"{'policy':>9} {'micro-batches':>13} {'checks':>7} {'predicted ms':>13} "
          f"{'measured ms':>12} {'95% interval':>17} {'idle':>5} {'x static pred':>14} "
          f"{'x static meas':>14}")
    for name, m in measured.items():
        low, high = m.interval
        print(f"{name:>9} {len(m.plan.micro_batches):>13} "
              f"{len(m.checks) - len(m.failed):>3}/{len(m.checks):<3} "
              f"{m.plan.step_s * 1e3:>13.2f} {m.median_s * 1e3:>12.2f} "
              f"{f'{low * 1e3:.2f}-{high * 1e3:.2f}':>17} {m.idle_share:>5.0%} "
              f"{speedup(m.plan, plans['static']):>14.3f} {static_measured / m.median_s:>14.3f}")
    by_prediction = sorted(plans, key=lambda n: plans[n].step_s)
    by_measurement = sorted(measured, key=lambda n: measured[n].median_s)
    best = by_measurement[0]
    predicted, got = speedup(plans[best], plans["static"]), static_measured / measured[best].median_s
    print(f"ranking predicted {by_prediction}, measured {by_measurement}: "
          f"{'the same' if by_prediction == by_measurement else 'DIFFERENT'}")
    print(f"best measured ({best}): speedup {got:.3f} measured vs {predicted:.3f} predicted "
          f"({got / predicted - 1:+.1%}); {wall:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
