"""A sweep with injected faults, to be launched by torchrun (tests/test_torchrun.py):

    torchrun --standalone --nproc-per-node 2 tests/torchrun_sweep.py SCENARIO OUT [--resume]

Every rank runs `run_sweep` in place with `rank_tasks.measure_or_misbehave` as its task (head_dim
24 raises on rank 1, 40 hangs), as `cpbench sweep` would run `measure_config`. Rank 0 prints the
statuses it recorded as one JSON line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `tests` as a package

# What a pool rank imports before it says "ready" (cpbench/bench/pool.py): the module torch's
# first backward imports and the measurement's modules, so that the scenario's short timeout
# (tests/test_torchrun.TIMEOUT) times the configurations, not a fresh job's imports.
import torch.fx.experimental.symbolic_shapes  # noqa: E402, F401

import cpbench.bench.measure  # noqa: E402, F401
from cpbench.app.sweep import run_sweep  # noqa: E402
from cpbench.bench.launch import launched_rank  # noqa: E402
from cpbench.results.scenarios.loading import load_scenario  # noqa: E402
from tests import rank_tasks  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario")
    parser.add_argument("out", type=Path)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    scenario = load_scenario(args.scenario)
    result = run_sweep(
        scenario,
        "cpu",
        scenario.world_size,
        args.out,
        resume=args.resume,
        task=rank_tasks.measure_or_misbehave,
    )
    launch = launched_rank()
    if launch is not None and launch.rank == 0:
        print(json.dumps({"counts": result.counts(), "spawns": result.spawns}), flush=True)


if __name__ == "__main__":
    main()
