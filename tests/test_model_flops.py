"""FLOPs and per-rank causal work under each layout."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpbench.config.constraints import (
    AttentionShape,
    required_kv_replication,
    seq_divisor,
)
from cpbench.config.problem import CpProblem
from cpbench.config.vocabulary import GLOBAL_LAYOUTS as LAYOUTS
from cpbench.errors import CpbenchError
from cpbench.model.flops import (
    FLOPS_CONVENTION,
    FlopsBreakdown,
    attention_flops,
    flops_breakdown,
    imbalance,
    layout_work,
    phase_factor,
    ring_rank_pairs,
    ring_step_pairs,
)
from tests.flops_reference import range_pairs, ring_rank_positions

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

FAST = settings(max_examples=50, deadline=None)


def step_flops(breakdown: FlopsBreakdown, phase: str) -> tuple[tuple[float, ...], ...]:
    """`[s][j]`: FLOPs of each global rank of ring rank j at ring step s."""
    factor = breakdown.pair_flops * phase_factor(phase)
    return tuple(tuple(float(p * factor) for p in step) for step in breakdown.work.step_pairs)


def brute_pairs(queries: list[int], keys: list[int], causal: bool) -> Fraction:
    """Token by token: key < query counts 1, key == query counts 1/2 (causal)."""
    if not causal:
        return Fraction(len(queries) * len(keys))
    key_set = set(keys)
    total = Fraction(0)
    for q in queries:
        total += sum(1 for k in keys if k < q)
        if q in key_set:
            total += Fraction(1, 2)
    return total


def positions(seq_len: int, ring: int, layout: str, rank: int) -> list[int]:
    return [p for r in ring_rank_positions(seq_len, ring, layout, rank) for p in r]


# ----------------------------------------------------------------------- worked examples


def test_worked_example_contiguous_and_zigzag_p4() -> None:
    # U=1, R=P=4, units of (L/(2P))^2 = (L/8)^2: query chunk q counts q + 0.5 KV chunks;
    # contiguous rank r holds chunks 2r, 2r+1: (2r+0.5) + (2r+1.5) = 4r + 2 -> 2, 6, 10, 14;
    # zigzag rank r holds chunks r, 7-r: (r+0.5) + (7.5-r) = 8.
    for seq_len in (8, 64, 8192):
        contiguous = layout_work(CpProblem(heads=1, kv_heads=1, head_dim=8, seq_len=seq_len, ulysses=1, ring=4, layout="contiguous"))
        zigzag = layout_work(CpProblem(heads=1, kv_heads=1, head_dim=8, seq_len=seq_len, ulysses=1, ring=4, layout="zigzag"))
        assert list(contiguous.rank_chunk_units) == [2, 6, 10, 14]
        assert list(zigzag.rank_chunk_units) == [8, 8, 8, 8]
        assert zigzag.imbalance == 1.0
        assert contiguous.imbalance == pytest.approx(14 / 8)


def test_striped_closed_form_p4() -> None:
    # L=64, R=4, n=16: rank r pairs = R*n*(n-1)/2 + r*n + n/2 = 480 + 16r + 8 = 488 + 16r;
    # in units of (64/8)^2 = 64: 7.625, 7.875, 8.125, 8.375 (close to 8, not equal)
    work = layout_work(CpProblem(heads=1, kv_heads=1, head_dim=8, seq_len=64, ulysses=1, ring=4, layout="striped"))
    assert list(work.ring_rank_pairs) == [488, 504, 520, 536]
    assert [float(x) for x in work.rank_chunk_units] == [7.625, 7.875, 8.125, 8.375]
    assert work.imbalance == pytest.approx(8.375 / 8)


def test_step_pairs_hand_computed_contiguous_r2() -> None:
    # L=4, R=2, n=2: step 0 each rank attends its own block, diagonal n^2/2 = 2;
    # step 1 rank 1 gets rank 0's K/V (all earlier: n^2 = 4), rank 0 gets rank 1's (all later: 0)
    assert ring_step_pairs(4, 2, "contiguous") == ((2, 2), (0, 4))


def test_usp_ranks_share_their_ring_rank_work() -> None:
    # U=2, R=2, L=16, contiguous: ring rank pairs n^2*(j+1/2) with n=8: 32, 96;
    # each of the 2 Ulysses ranks gets half: [16, 16, 48, 48]; global rank p = j*U + u
    work = layout_work(CpProblem(heads=1, kv_heads=1, head_dim=8, seq_len=16, ulysses=2, ring=2, layout="contiguous"))
    assert list(work.ring_rank_pairs) == [32, 96]
    assert list(work.rank_pairs) == [16, 16, 48, 48]
    assert work.rank_pairs[1 * 2 + 1] == work.ring_rank_pairs[1] / 2  # p = 3: j = 1, u = 1
    assert sum(work.rank_pairs) == Fraction(16 * 16, 2)
    # mean in chunk units is 2P = 8
    assert sum(work.rank_chunk_units) / 4 == 8


def test_hand_computed_flops() -> None:
    # B=1, h=32, L=8192, d_h=128: 4*1*32*8192^2*128 = 2^2 * 2^5 * 2^26 * 2^7 = 2^40
    shape = AttentionShape(8192, 32, 8, 128)
    assert attention_flops(shape, causal=False) == 2.0**40
    assert attention_flops(shape, causal=True) == 2.0**39
    assert attention_flops(shape, causal=True, phase="backward") == 2.5 * 2.0**39
    assert attention_flops(shape, causal=True, phase="forward_backward") == 3.5 * 2.0**39
    assert "4*B*h*L^2*d_h" in FLOPS_CONVENTION and "2.5" in FLOPS_CONVENTION


# ------------------------------------------------------------ closed forms vs brute force


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 5),
    st.sampled_from(LAYOUTS),
    st.integers(1, 4),
    st.booleans(),
)
def test_closed_forms_match_token_by_token_counting(
    ring: int, layout: str, k: int, causal: bool
) -> None:
    seq_len = seq_divisor(1, ring, layout) * k
    steps = ring_step_pairs(seq_len, ring, layout, causal)
    totals = ring_rank_pairs(seq_len, ring, layout, causal)
    for j in range(ring):
        queries = positions(seq_len, ring, layout, j)
        assert len(queries) == seq_len // ring
        assert totals[j] == brute_pairs(queries, list(range(seq_len)), causal)
        for s in range(ring):
            keys = positions(seq_len, ring, layout, (j - s) % ring)
            assert steps[s][j] == brute_pairs(queries, keys, causal)
        assert sum(steps[s][j] for s in range(ring)) == totals[j]
    # the layout is a permutation of the tokens
    everything = sorted(p for j in range(ring) for p in positions(seq_len, ring, layout, j))
    assert everything == list(range(seq_len))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 40), st.integers(0, 40), st.integers(0, 40), st.integers(0, 40))
def test_range_pairs_matches_brute_force(a: int, n: int, b: int, m: int) -> None:
    query, key = range(a, a + n), range(b, b + m)
    assert range_pairs(query, key) == brute_pairs(list(query), list(key), True)


# ------------------------------------------------------------------ sums and balance


@st.composite
def meshes(draw: st.DrawFn) -> tuple[AttentionShape, int, int, str, bool]:
    kv_heads = draw(st.sampled_from([1, 2, 4, 8]))
    heads = kv_heads * draw(st.sampled_from([1, 2, 4]))
    ulysses = draw(
        st.sampled_from(
            [
                u
                for u in (1, 2, 4, 8)
                if heads % u == 0 and required_kv_replication(kv_heads, u) is not None
            ]
        )
    )
    ring = draw(st.integers(1, 16))
    layout = draw(st.sampled_from(LAYOUTS))
    seq_len = seq_divisor(ulysses, ring, layout) * draw(st.integers(1, 1000))
    shape = AttentionShape(
        seq_len, heads, kv_heads, draw(st.sampled_from([64, 128])), draw(st.integers(1, 4))
    )
    return shape, ulysses, ring, layout, draw(st.booleans())


@FAST
@given(meshes(), st.sampled_from(["forward", "backward", "forward_backward"]))
def test_rank_flops_sum_to_global_flops(
    mesh: tuple[AttentionShape, int, int, str, bool], phase: str
) -> None:
    shape, ulysses, ring, layout, causal = mesh
    breakdown = flops_breakdown(CpProblem.for_shape(shape=shape, ulysses=ulysses, ring=ring, layout=layout, causal=causal))
    per_rank = breakdown.rank_flops(phase)
    assert len(per_rank) == ulysses * ring
    assert sum(per_rank) == pytest.approx(attention_flops(shape, causal, phase), rel=1e-9)
    assert breakdown.global_flops(phase) == attention_flops(shape, causal, phase)
    # exact in pairs: L^2/2 causal, L^2 full
    work = breakdown.work
    assert sum(work.rank_pairs) == work.total
    assert work.total == (Fraction(shape.seq_len**2, 2) if causal else shape.seq_len**2)
    # per step, per rank FLOPs add up to the rank's FLOPs
    steps = step_flops(breakdown, phase)
    for j in range(ring):
        assert sum(step[j] for step in steps) == pytest.approx(per_rank[j * ulysses], rel=1e-9)
    assert breakdown.slowest_rank_flops(phase) == max(per_rank)


@FAST
@given(meshes())
def test_balance_per_layout(mesh: tuple[AttentionShape, int, int, str, bool]) -> None:
    shape, ulysses, ring, layout, causal = mesh
    work = layout_work(CpProblem(heads=1, kv_heads=1, head_dim=8, seq_len=shape.seq_len, ulysses=ulysses, ring=ring, layout=layout, causal=causal))
    if not causal:
        assert set(work.rank_pairs) == {Fraction(shape.seq_len**2, ulysses * ring)}
    elif layout == "zigzag":
        assert work.imbalance == 1.0
    elif layout == "contiguous":
        # slowest n^2*(R - 1/2) over mean n^2*R/2
        assert work.imbalance == pytest.approx((2 * ring - 1) / ring)
    assert work.imbalance >= 1.0
    assert max(work.step_max_pairs) <= Fraction(shape.seq_len // ring) ** 2


def test_long_sequences_are_fast_and_exact() -> None:
    shape = AttentionShape(1 << 20, 32, 8, 128)
    for layout in LAYOUTS:
        breakdown = flops_breakdown(CpProblem.for_shape(shape=shape, ulysses=4, ring=64, layout=layout))
        assert breakdown.work.total == Fraction(1 << 40, 2)
        assert len(breakdown.work.step_pairs) == 64


# -------------------------------------------------------------------------------- errors


def test_bad_input() -> None:
    with pytest.raises(CpbenchError, match=r"100.*8.*zigzag"):
        layout_work(CpProblem(heads=1, kv_heads=1, head_dim=8, seq_len=100, ulysses=1, ring=4, layout="zigzag"))
    with pytest.raises(CpbenchError, match="diagonal"):
        layout_work(CpProblem(heads=1, kv_heads=1, head_dim=8, seq_len=64, ulysses=1, ring=4, layout="diagonal"))
    with pytest.raises(CpbenchError, match=r"ulysses \(3\)"):
        flops_breakdown(CpProblem.for_shape(shape=AttentionShape(96, 32, 8, 64), ulysses=3, ring=1, layout="contiguous"))
    with pytest.raises(CpbenchError, match="sideways"):
        attention_flops(AttentionShape(64, 4, 4, 8), phase="sideways")
    with pytest.raises(CpbenchError, match="ring rank 4"):
        ring_rank_positions(64, 4, "contiguous", 4)
    with pytest.raises(CpbenchError, match="ring"):
        ring_rank_pairs(64, 0, "contiguous")
    with pytest.raises(CpbenchError):
        imbalance([])
