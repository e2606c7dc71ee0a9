"""Multi-rank tests: the pool spawns gloo ranks once per world size and runs many cases; each
case is checked against the single-process float64 reference (tolerance: verify.TOLERANCE)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cpbench.app.verify import default_cases
from cpbench.bench.pool import TaskError, TaskTimeout
from cpbench.bench.reference import run_cases_on_rank
from cpbench.config.bench import VerifyCase
from cpbench.config.problem import CpProblem
from cpbench.config.tolerances import TOLERANCE
from cpbench.model.formulas import comm_volume
from tests import rank_tasks

ROOT = Path(__file__).resolve().parents[1]
WORLD_SIZES = [1, 2, 4]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_every_scheme_layout_gqa_case_matches_reference(pool, world_size: int) -> None:  # type: ignore[no-untyped-def]
    # The 4-rank mask matrix runs in tests/test_masks_attention.py (once, not twice).
    cases = default_cases(world_size, masks=world_size < 4)
    records = pool(world_size).run(run_cases_on_rank, cases, timeout=300)[0]
    assert len(records) == len(cases) > 0
    bad = [(r["label"], r.get("errors"), r.get("error")) for r in records if not r["passed"]]
    assert not bad
    assert max(r["max_error"] for r in records) < TOLERANCE["float32"]
    # Every mesh of the world size was exercised, with KV replication where U > kv_heads.
    assert {(r["ulysses"], r["ring"]) for r in records} == {
        (u, world_size // u) for u in range(1, world_size + 1) if world_size % u == 0
    }


def test_odd_shapes_batch_and_three_ranks_in_a_ring(pool) -> None:  # type: ignore[no-untyped-def]
    cases = [
        VerifyCase(ulysses=2, ring=2, layout="zigzag", causal=True, heads=4, kv_heads=2, seq_len=24, head_dim=8, batch=3),
        VerifyCase(ulysses=1, ring=4, layout="striped", causal=True, heads=2, kv_heads=1, seq_len=4, head_dim=8, batch=1),
        VerifyCase(ulysses=4, ring=1, layout="contiguous", causal=True, heads=4, kv_heads=1, seq_len=8, head_dim=32),
        VerifyCase(ulysses=2, ring=2, layout="striped", causal=False, heads=6, kv_heads=2, seq_len=16, head_dim=8, seed=3),
        VerifyCase(ulysses=1, ring=4, layout="contiguous", causal=True, heads=4, kv_heads=4, seq_len=64, kernel="naive"),
    ]
    records = pool(4).run(run_cases_on_rank, cases, timeout=120)[0]
    assert [r["passed"] for r in records] == [True] * len(cases), records


def test_sequence_that_does_not_divide_is_a_clear_error(pool) -> None:  # type: ignore[no-untyped-def]
    case = VerifyCase(ulysses=1, ring=2, layout="zigzag", causal=True, heads=4, kv_heads=4, seq_len=6)  # 6 % (2*2) != 0
    record = pool(2).run(run_cases_on_rank, [case], timeout=60)[0][0]
    assert not record["passed"]
    assert "divisible by 4" in record["error"]
    bad_gqa = VerifyCase(ulysses=2, ring=1, layout="contiguous", causal=True, heads=6, kv_heads=3, seq_len=8)
    record = pool(2).run(run_cases_on_rank, [bad_gqa], timeout=60)[0][0]
    assert "ulysses (2) and kv_heads (3) do not divide each other" in record["error"]
    bad_heads = VerifyCase(ulysses=2, ring=1, layout="contiguous", causal=True, heads=3, kv_heads=1, seq_len=8)
    record = pool(2).run(run_cases_on_rank, [bad_heads], timeout=60)[0][0]
    assert "ulysses (2) must divide heads (3)" in record["error"]


@pytest.mark.parametrize(
    ("ulysses", "ring", "kv_heads", "dtype"),
    [
        (1, 4, 2, "float32"),
        (4, 1, 4, "float32"),
        (2, 2, 2, "float32"),
        (4, 1, 1, "float32"),
        (2, 2, 1, "bfloat16"),
        (1, 4, 4, "bfloat16"),
    ],
)
def test_counted_bytes_equal_analytic_bytes(pool, ulysses, ring, kv_heads, dtype) -> None:  # type: ignore[no-untyped-def]
    """The invariant of DESIGN.md section 2: the bytes each rank hands to the communication
    library equal the analytic model's, per collective, forward and backward (exactly)."""
    seq_len, heads, head_dim, batch = 32, 4, 8, 2
    per_rank = pool(4).run(
        rank_tasks.count_bytes,
        seq_len,
        heads,
        kv_heads,
        head_dim,
        batch,
        ulysses,
        ring,
        "zigzag",
        dtype,
        timeout=120,
    )
    config = CpProblem(seq_len=seq_len, heads=heads, kv_heads=kv_heads, head_dim=head_dim, batch=batch, ulysses=ulysses, ring=ring, layout="zigzag", dtype=dtype).require_feasible()
    volume = comm_volume(config)
    for phase, key in (("forward", "fwd"), ("backward", "bwd")):
        expected = {c.name: c.bytes_sent for c in volume.collectives(phase)}
        for counted in per_rank:
            assert counted.get(key, {}) == expected, (phase, counted)


def test_compute_variant_sends_nothing_and_comm_variant_sends_the_same(pool) -> None:  # type: ignore[no-untyped-def]
    args = (32, 4, 2, 8, 1, 2, 2, "contiguous", "float32")
    full = pool(4).run(rank_tasks.count_bytes, *args, "full", timeout=60)
    compute = pool(4).run(rank_tasks.count_bytes, *args, "compute", timeout=60)
    comm = pool(4).run(rank_tasks.count_bytes, *args, "comm", timeout=60)
    assert all(c == {} for c in compute)
    assert comm == full


def test_pool_survives_a_failing_and_a_hanging_task(pool) -> None:  # type: ignore[no-untyped-def]
    p = pool(2)
    with pytest.raises(TaskError, match="injected failure"):
        p.run(rank_tasks.raise_on_rank, 1, timeout=60)
    assert p.run(rank_tasks.sleep_then_rank, 0.0, timeout=60) == [0, 1]
    with pytest.raises(TaskTimeout, match="within 1 s"):
        p.run(rank_tasks.sleep_then_rank, 30.0, timeout=1)
    assert p.run(rank_tasks.sleep_then_rank, 0.0, timeout=120) == [0, 1]


def test_a_started_rank_has_the_parents_environment_of_that_moment(pool, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """CPU ranks are forked from a forkserver that keeps the environment it started with; a rank
    started later sees the parent's environment as it is then, as a spawned rank would."""
    p = pool(2)
    p.start()
    monkeypatch.setenv("CPBENCH_TEST_MARK", "set after the first start")
    p.close()
    try:
        answers = p.run(rank_tasks.process_and_environment, "CPBENCH_TEST_MARK", timeout=60)
        assert [a["value"] for a in answers] == ["set after the first start"] * 2
    finally:
        p.close()  # the session's next ranks start without the mark


ORPHANED_PARENT = """
import os, signal, sys
from pathlib import Path
from cpbench.bench.pool import WorkerPool, WorldSpec
from tests import rank_tasks
if __name__ == "__main__":
    answers = WorkerPool(WorldSpec(2, "cpu")).run(
        rank_tasks.process_and_environment, "HOME", timeout=120
    )
    pids = [a["pid"] for a in answers] + sorted({a["ppid"] for a in answers})
    Path(sys.argv[1]).write_text(" ".join(map(str, pids)))
    os.kill(os.getpid(), signal.SIGKILL)  # dies without closing its pool
"""


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")  # a zombie nobody reaps has stopped too
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def test_ranks_and_their_server_exit_when_the_parent_is_killed(tmp_path: Path) -> None:
    """A parent killed outright (no close) leaves nothing running: its forkserver sees the
    parent's end of their pipe close and exits, and each rank leaves its loop when its parent
    changes (bench/pool.py), within a few of its 1 s polls."""
    script = tmp_path / "parent.py"
    script.write_text(ORPHANED_PARENT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    # Not through pipes: a rank left running would hold them open, and the run would wait.
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "pids")],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          timeout=180, cwd=ROOT, env=env)  # fmt: skip
    assert done.returncode == -signal.SIGKILL
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert len(pids) == 3  # two ranks and the one process that forked them
    deadline = time.monotonic() + 15
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in pids if _running(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"still running 15 s after their parent was killed: {left}"


EARLY_START = """
import os, sys
from multiprocessing import forkserver
from cpbench.bench.pool import start_forkserver_early

def server() -> object:
    return forkserver._forkserver._forkserver_pid  # private: None until it runs

start_forkserver_early("cuda")
cuda = server()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", RANK="0", WORLD_SIZE="2")
start_forkserver_early("cpu")
launched = server()
for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
    del os.environ[name]
start_forkserver_early("cpu")
answer = f"{cuda} {launched} {server() is not None} {'torch' in sys.modules}"
open(sys.argv[1], "w").write(answer)
"""


def test_the_forkserver_starts_early_only_for_local_cpu_ranks_and_imports_no_torch_here(
    tmp_path: Path,
) -> None:
    """`start_forkserver_early` (called first by the commands that run ranks): nothing for CUDA
    or inside a launched world; for CPU ranks the server runs, and this process has not
    imported torch for it (the server's imports run beside the command's own)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    # Output to files, not pipes: the server keeps the inherited ones open until its imports
    # are done and it sees its parent gone (seconds this test need not wait).
    answer, errors = tmp_path / "answer", tmp_path / "stderr"
    with errors.open("w") as stderr:
        done = subprocess.run([sys.executable, "-c", EARLY_START, str(answer)],
                              stdout=subprocess.DEVNULL, stderr=stderr, timeout=120, cwd=ROOT,
                              env=env)  # fmt: skip
    assert done.returncode == 0, errors.read_text()[-3000:]
    assert answer.read_text().split() == ["None", "None", "True", "False"]
