"""`cpbench tune` against the exhaustive sweep of the same problem, on this machine: the sweep
measures every candidate `recommend` ranks (one scenario, `cpbench sweep`), the tune measures
what its loop asks for (`cpbench tune`), each a fresh process timed wall-clock from start to
exit (start-up and imports included). Prints both walls, the tune's share of the sweep's, and
whether the tune's pick is the sweep's fastest or tied with it (their measured 95% intervals
overlap, as the sweep's own `best` column calls a tie).

    PYTHONPATH=$PWD python benchmarks/tune_vs_sweep.py [--gpus 4 --heads 8 --kv-heads 2 ...]

Issue 40's bar (CPU, gloo): the sweep's best or a tie with it, in <= 40% of the sweep's wall."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomli_w

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cpbench.app.recommend.ranking import recommend_mesh  # noqa: E402
from cpbench.app.recommend.scenario import candidates_scenario  # noqa: E402
from cpbench.app.recommend.types import RecommendRequest  # noqa: E402
from cpbench.results.frame import record_interval  # noqa: E402


def timed(command: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return wall, done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=4, help="CPU ranks")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=2048)
    args = parser.parse_args()
    problem = ["--heads", str(args.heads), "--kv-heads", str(args.kv_heads), "--head-dim",
               str(args.head_dim), "--seq-len", str(args.seq_len), "--gpus", str(args.gpus),
               "--hardware", "cpu-local", "--dtype", "float32"]  # fmt: skip
    rec = recommend_mesh(RecommendRequest(
        heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim, seq_len=args.seq_len,
        gpus=args.gpus, hardware="cpu-local", dtype="float32", top=0,
    ))  # fmt: skip
    cli = [sys.executable, "-m", "cpbench.cli"]
    with tempfile.TemporaryDirectory() as folder:
        scenario = Path(folder) / "every-candidate.toml"
        data = candidates_scenario(rec, rec.ranked)
        data["name"] = "every-candidate"
        scenario.write_text(tomli_w.dumps(data))
        swept = Path(folder) / "sweep.jsonl"
        sweep_wall, _ = timed([*cli, "sweep", str(scenario), "--out", str(swept), "--yes"])
        tune_wall, out = timed([*cli, "tune", *problem, "--out", str(Path(folder) / "t.jsonl"),
                                "--json"])  # fmt: skip
        report = json.loads(out)
        records = [json.loads(line) for line in swept.read_text().splitlines()]
    ok = [r for r in records if r["status"] == "ok"]
    by_key = {(r["config"]["ulysses"], r["config"]["ring"], r["config"]["layout"],
               r["config"].get("cp_comm", "p2p"), r["config"].get("heads_k_stride")): r
              for r in ok}  # fmt: skip
    pick = rec.ranked[[c["label"] for c in report["candidates"]].index(report["pick"])]
    c = pick.prediction.candidate
    gather = c.ring > 1 and c.all_gather
    key = (c.ulysses, c.ring, c.layout, "all_gather" if gather else "p2p",
           c.heads_k_stride if gather else None)  # fmt: skip
    best = min(ok, key=lambda r: r["timing"]["median"])
    picked = by_key.get(key)
    verdict = "not in the sweep"
    if picked is not None:
        a, b = record_interval(picked), record_interval(best)
        tied = a is not None and b is not None and a.low <= b.high and b.low <= a.high
        apart = picked["timing"]["median"] / best["timing"]["median"] - 1
        verdict = "the sweep's best" if picked is best else (
            f"{'tied with it' if tied else 'not tied'} ({apart:.1%} slower in the sweep, "
            f"{picked['timing']['median'] * 1e3:.2f} ms)")
    print(f"sweep: {len(records)} configurations ({len(ok)} ok) in {sweep_wall:.1f} s wall; "
          f"fastest {best['id']} {best['timing']['median'] * 1e3:.2f} ms")
    print(f"tune: {report['runs']} measured in {tune_wall:.1f} s wall "
          f"({tune_wall / sweep_wall:.0%} of the sweep's), pick {report['pick']}: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
