"""`cpbench verify`'s mask cases with kernel `flash_attn` served by the flash-attn 2 stand-in
that follows csrc/flash_attn/flash_api.cpp (window clamping) and src/mask.h (the mask), on the
pool's gloo ranks (`tests.impl_support.run_cases_with_flash_rule`): the mask cases of the verify
matrix at world sizes 2, 4 and 8 (ring p2p and all-gathered; ring, USP and Ulysses meshes; every
layout) pass against the float64 reference. The same cases through the kernel as it was before
the fix (one call per piece, -1 for "unbounded") fail: the check can fail.

World 2 runs every mask case (KV heads 8, 2 and 1). World 4 runs every mesh (U1xR4, U2xR2,
U4xR1) x layout x mask with 2 KV heads (GQA ratio 4; KV replication at U4), p2p and
all-gathered. World 8 runs the meshes whose ring has 4 or 8 ranks (U1xR8, U2xR4), every
layout x mask, with one KV head (GQA ratio 8, KV replication at U2), p2p and all-gathered.
What worlds 4 and 8 add is the pieces of longer rings (L = 128 and 256): windows reaching
several ranks back, documents spanning them. The pieces a kernel call sees do not depend on the
KV head count: a count changes only the heads of each call, and the kernel's GQA grouping is
checked at world 2 with every count (MHA, ratio 4, one KV head replicated). The Ulysses-major
meshes U4xR2 and U8xR1 give the kernel the pieces of a ring of 2 and 1, which worlds 2 and 4
check (U4 included). The kernels' band property (tests/test_kernels.py) checks 10,000 distinct
pieces of random meshes up to world 8 against the rule.
The whole matrices of mask cases are `run_cases_with_flash_rule` on `_mask_cases(n,
every_kv_count=True)`: world 4's 525 (this test's until December 2026: 0 failures, 19-22 s
here) and world 8's 735 (0 failures, 83 s).
Worlds 4 and 8 run on the main torch only (tests/ci_split.ONCE_PER_CI); the floor-torch
run keeps world 2.
Rank 0 judges with the batch's float64 references (`bench.reference.ReferenceMemo`): one per
problem, shared by its meshes and layouts."""

from __future__ import annotations

import pytest

from cpbench.app.verify import default_cases
from cpbench.config.bench import VerifyCase
from cpbench.config.tolerances import TOLERANCE
from tests.ci_split import ONCE_PER_CI, on_the_main_torch
from tests.impl_support import run_cases_with_flash_rule

ONCE_PER_CI_MARK = pytest.mark.skipif(not on_the_main_torch(), reason=ONCE_PER_CI)


KV_HEADS = {4: 2, 8: 1}
"""The one KV head count of worlds 4 and 8 (see the module docstring): GQA ratio 4 with KV
replication at U4, and ratio 8 with KV replication wherever U > 1."""
WORLD_8_MIN_RING = 4
"""World 8's meshes: those whose ring has at least this many ranks (see the module docstring)."""


def _mask_cases(world_size: int, every_kv_count: bool = False) -> list[VerifyCase]:
    """The document / window cases `cpbench verify --kernel flash_attn` runs at this world size
    (its default matrix without the causal and full cases); at worlds 4 and 8 (unless
    `every_kv_count`), those with `KV_HEADS`, at world 8 on the meshes of `WORLD_8_MIN_RING`
    (see the module docstring)."""
    cases = [c for c in default_cases(world_size, kernel="flash_attn") if not c.mask.plain]
    if every_kv_count or world_size not in KV_HEADS:
        return cases
    min_ring = WORLD_8_MIN_RING if world_size == 8 else 1
    return [c for c in cases if c.kv_heads == KV_HEADS[world_size] and c.ring >= min_ring]


@pytest.mark.parametrize(
    ("world_size", "cases"),
    [
        (2, 315),  # 2 meshes x 5 layouts x 7 masks x 3 KV head counts, + 105 all-gathered
        pytest.param(4, 175, marks=ONCE_PER_CI_MARK),  # 3 meshes x 5 x 7 x 1, + 70 gathered
        pytest.param(8, 140, marks=ONCE_PER_CI_MARK),  # 2 meshes x 5 x 7 x 1, x2 gathered
    ],
)
def test_verify_mask_cases_pass_with_flash_attn_2_by_its_rules(pool, world_size, cases) -> None:  # type: ignore[no-untyped-def]
    matrix = _mask_cases(world_size)
    assert len(matrix) == cases
    per_rank = pool(world_size).run(run_cases_with_flash_rule, "fixed", matrix, timeout=1800)
    records = per_rank[0][0]
    assert len(records) == cases
    bad = [(r["label"], r.get("errors"), r.get("error")) for r in records if not r["passed"]]
    assert not bad
    assert max(r["max_error"] for r in records) < TOLERANCE["float32"]
    # flash-attn really ran the pieces: every rank called it, some with more query rows
    # than key columns + 1 (the blocks whose right window the library clamps).
    counts = [stats for _, stats in per_rank]
    assert all(c["calls"] > 0 for c in counts) and sum(c["tall"] for c in counts) > 0


def test_the_kernel_before_the_fix_fails_the_same_cases(pool) -> None:  # type: ignore[no-untyped-def]
    """The kernel's calls before the fix (right window -1 for an unbounded edge; flash-attn's
    bottom-right causal on non-square blocks) under the same library rule: the world-2 mask
    cases the issue names fail (U1xR2 zigzag with window L/4 + 8 = 24, documents with window 9)
    with errors of order 1, far beyond the float32 bound."""
    matrix = _mask_cases(2)
    per_rank = pool(2).run(run_cases_with_flash_rule, "old-window", matrix, timeout=900)
    records, _ = per_rank[0]
    failed = {r["label"]: r for r in records if not r["passed"]}
    assert "ring U1xR2 zigzag window 24 h8/kv8" in failed
    assert "ring U1xR2 zigzag document (3 docs) + window 9 h8/kv8" in failed
    assert failed["ring U1xR2 zigzag window 24 h8/kv8"]["max_error"] > 0.1
    assert len(failed) >= 20
