"""Wall and CPU time of `cpbench recommend` at cluster scale and with many packed documents
(issue 39's target: 131,072 GPUs and 100,000 documents each under 10 s, like `plan`).

Each run is a fresh process (`python -m cpbench.cli recommend ...`, start-up and imports
included), killed after `--timeout` seconds; wall time from `time.perf_counter` around it, CPU
time (user + sys) from `getrusage(RUSAGE_CHILDREN)` before and after, peak RSS the largest
child's so far. The documents case writes a file of `--documents` lengths (as many
of L // D + 1 as make them sum to the sequence length, the rest L // D) and passes it with
`--documents FILE` (read as in cpbench/config/documents.py). The machine may be shared: CPU
time is less sensitive to other load than wall time.

    PYTHONPATH=$PWD python benchmarks/recommend_scale.py
    PYTHONPATH=$PWD python benchmarks/recommend_scale.py --gpus 8 64 --documents 100000 --doc-gpus 8

A third case draws its documents from a distribution (`--distribution`, issue 39's lognormal at
1,024 GPUs by default: L = 1M, 32/8 heads), whose long ring makes the layouts that cut every
document into 2R parts expensive to count (the ranking's counting budget rejects those, saying so).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_once(args: list[str], timeout: float) -> tuple[float, float, float, int, str]:
    """(wall s, user + sys CPU s, peak RSS MB, exit code, last stderr line) of one run; a run
    past `timeout` seconds is killed (exit -9, "timed out")."""
    command = [sys.executable, "-m", "cpbench.cli", "recommend", *args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    child = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=os.environ.copy(), text=True
    )
    try:
        _, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        _, err = child.communicate()
        err += f"\ntimed out after {timeout:g} s"
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    last = err.strip().splitlines()[-1] if err.strip() else ""
    return wall, cpu, after.ru_maxrss / 1024, child.returncode, last


def documents_file(folder: Path, count: int, seq_len: int) -> Path:
    """`count` lengths summing to `seq_len`: L // D + 1 for the first L % D, L // D after."""
    base, extra = divmod(seq_len, count)
    if base == 0:
        raise SystemExit(f"{count} documents cannot fill {seq_len} tokens")
    path = folder / f"documents-{count}.txt"
    path.write_text("".join(f"{base + 1 if i < extra else base}\n" for i in range(count)))
    return path


def report(label: str, args: list[str], repeats: int, limit: float, timeout: float) -> None:
    runs = [run_once(args, timeout) for _ in range(repeats)]
    walls, cpus, rss = ([r[i] for r in runs] for i in range(3))
    codes = sorted({r[3] for r in runs})
    verdict = "under" if max(walls) < limit else "OVER"
    print(
        f"{label:<28} wall {min(walls):7.2f} s (max {max(walls):7.2f}), CPU "
        f"{min(cpus):7.2f} s (max {max(cpus):7.2f}), peak RSS {max(rss):5.0f} MB, exit "
        f"{codes}; {verdict} {limit:g} s",
        flush=True,
    )
    for wall, _, _, code, last in runs:
        if code:
            print(f"    exit {code} after {wall:.1f} s: {last}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", type=int, default=128)
    parser.add_argument("--kv-heads", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=4194304)
    parser.add_argument("--gpus", type=int, nargs="+", default=[8, 64, 1024, 8192, 131072])
    parser.add_argument(
        "--documents", type=int, default=100000, help="documents of the packed case (0: skip it)"
    )
    parser.add_argument(
        "--doc-gpus", type=int, nargs="+", default=[8], help="GPU counts of the documents case"
    )
    parser.add_argument(
        "--distribution", default="lognormal:mean=4096,max=65536",
        help="documents drawn from this source for the distribution case ('' skips it)",
    )  # fmt: skip
    parser.add_argument("--dist-gpus", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--limit", type=float, default=10.0, help="the target, seconds")
    parser.add_argument("--timeout", type=float, default=120.0, help="kill a run after, seconds")
    args = parser.parse_args()
    shape = [
        "--heads",
        str(args.heads),
        "--kv-heads",
        str(args.kv_heads),
        "--seq-len",
        str(args.seq_len),
    ]
    print(
        f"cpbench recommend {' '.join(shape)}; {args.repeats} run(s) each, fresh processes; "
        f"min (max) wall and CPU time, peak RSS in MB (2**20 bytes)"
    )
    for gpus in args.gpus:
        report(
            f"--gpus {gpus}", [*shape, "--gpus", str(gpus)], args.repeats, args.limit, args.timeout
        )
    if args.documents:
        with tempfile.TemporaryDirectory() as folder:
            path = documents_file(Path(folder), args.documents, args.seq_len)
            for gpus in args.doc_gpus:
                report(
                    f"--gpus {gpus}, {args.documents} docs",
                    [*shape, "--gpus", str(gpus), "--documents", str(path)],
                    args.repeats,
                    args.limit,
                    args.timeout,
                )
    if args.distribution:
        drawn = ["--heads", "32", "--kv-heads", "8", "--seq-len", "1048576"]
        print(f"cpbench recommend {' '.join(drawn)} --documents {args.distribution}")
        for gpus in args.dist_gpus:
            report(
                f"--gpus {gpus}, drawn documents",
                [*drawn, "--gpus", str(gpus), "--documents", args.distribution],
                args.repeats,
                args.limit,
                args.timeout,
            )


if __name__ == "__main__":
    main()
