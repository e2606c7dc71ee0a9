"""Wall time and peak RSS of `cpbench plan` at cluster scale (issue 25's target: llama3-70b at
1M tokens on 16,384 GPUs under 10 s and 500 MB).

Each run is a fresh process (`python -m cpbench.cli plan ... --json`, start-up and imports
included); wall time from `time.perf_counter` around it, CPU time and peak RSS of the child
from `resource.getrusage(RUSAGE_CHILDREN)` (the child's ru_maxrss, KiB on Linux; one child per
`wait4`, so each run reads its own). The machine may be shared: repeat (`--repeats`) and read
the spread; CPU time is less sensitive to other load than wall time.

    PYTHONPATH=$PWD python benchmarks/plan_scale.py --gpus 1024 4096 16384 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def run_once(model: str, seq_len: int, gpus: int, per_node: int, extra: list[str]
             ) -> tuple[float, float, float, int]:
    """(wall s, user + sys CPU s, peak RSS MB, exit code) of one `cpbench plan` process."""
    command = [sys.executable, "-m", "cpbench.cli", "plan", "--model", model, "--seq-len",
               str(seq_len), "--gpus", str(gpus), "--gpus-per-node", str(per_node), "--json",
               *extra]
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             env=os.environ.copy())
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, child.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama3-70b")
    parser.add_argument("--seq-len", type=int, default=1048576)
    parser.add_argument("--gpus", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[],
                        help="more `cpbench plan` options (e.g. --exhaustive)")
    args = parser.parse_args()
    print(f"cpbench plan --model {args.model} --seq-len {args.seq_len} --gpus-per-node "
          f"{args.gpus_per_node} {' '.join(args.extra)}; {args.repeats} runs each; wall and CPU "
          "in s, peak RSS in MB (2**20 bytes)")
    for gpus in args.gpus:
        runs = [run_once(args.model, args.seq_len, gpus, args.gpus_per_node, args.extra)
                for _ in range(args.repeats)]
        walls, cpus, rss = ([r[i] for r in runs] for i in range(3))
        codes = sorted({r[3] for r in runs})
        print(f"--gpus {gpus:>6}: wall median {statistics.median(walls):.2f} "
              f"(min {min(walls):.2f}, max {max(walls):.2f}); CPU median "
              f"{statistics.median(cpus):.2f} (min {min(cpus):.2f}, max {max(cpus):.2f}); "
              f"peak RSS max {max(rss):.0f}; exit {codes}")


if __name__ == "__main__":
    main()
