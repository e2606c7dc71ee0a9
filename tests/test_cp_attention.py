"""Multi-rank tests: the pool spawns gloo ranks once per world size and runs many cases; each
case is checked against the single-process float64 reference (tolerance: verify.TOLERANCE)."""

from __future__ import annotations

import pytest

from cpbench.app.verify import default_cases
from cpbench.bench.pool import TaskError, TaskTimeout
from cpbench.bench.reference import run_cases_on_rank
from cpbench.config.bench import VerifyCase
from cpbench.config.problem import CpProblem
from cpbench.config.tolerances import TOLERANCE
from cpbench.model.formulas import comm_volume
from tests import rank_tasks

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
