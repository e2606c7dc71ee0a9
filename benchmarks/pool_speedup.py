"""Persistent pool vs a fresh spawn per configuration, on the same configurations.

Runs the first N feasible configurations of a scenario twice through the real sweep: once with
one pool for all of them, once re-spawning the ranks before every configuration, and prints the
wall times and their ratio.

    python benchmarks/pool_speedup.py [--scenario cpu-smoke] [--count 6]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from cpbench.app.sweep import run_sweep
from cpbench.results.scenarios.loading import load_scenario


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="cpu-smoke")
    parser.add_argument("--count", type=int, default=6)
    args = parser.parse_args()
    scenario = load_scenario(args.scenario)
    _, world = scenario.resolve("cpu", 0)
    # The first N distinct feasible points (the sweep runs `distinct`, not `expand`).
    chosen = [p for p in scenario.distinct("cpu", world) if p.feasibility.ok][: args.count]

    class Subset:  # the same scenario, restricted to the first N distinct feasible points
        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(scenario, name)

        def distinct(self, device: str, world_size: int):  # type: ignore[no-untyped-def]
            return chosen

        def expand(self, device: str, world_size: int):  # type: ignore[no-untyped-def]
            return [(p.config, p.feasibility) for p in chosen]

    times = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, respawn in (("persistent pool", False), ("spawn per configuration", True)):
            result = run_sweep(Subset(), "cpu", world, Path(tmp) / f"{respawn}.jsonl",  # type: ignore[arg-type]
                               respawn_each=respawn)
            times[name] = result.wall_seconds
            print(f"{name:>24}: {len(result.records)} configurations in "
                  f"{result.wall_seconds:.1f} s ({result.spawns} spawns)")
    ratio = times["spawn per configuration"] / times["persistent pool"]
    print(f"speed-up of the persistent pool: {ratio:.2f}x")


if __name__ == "__main__":
    main()
