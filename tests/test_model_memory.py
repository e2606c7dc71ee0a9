"""Per-rank memory lower bound and the largest sequence for a budget."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpbench.config.constraints import required_kv_replication, seq_divisor
from cpbench.config.problem import CpProblem
from cpbench.config.vocabulary import GLOBAL_LAYOUTS as LAYOUTS
from cpbench.config.vocabulary import STEP_PASSES
from cpbench.errors import CpbenchError
from cpbench.model.memory import (
    MemoryEstimate,
    max_seq_len_for_budget,
    memory_estimate,
    scheme_stages,
)
from cpbench.units import GIB

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

FAST = settings(max_examples=50, deadline=None)

Mesh = tuple[int, int, int, int, int, int, str, str]
"""heads, kv_heads, head_dim, batch, ulysses, ring, layout, dtype."""


@st.composite
def meshes(draw: st.DrawFn) -> Mesh:
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
    return (
        heads,
        kv_heads,
        draw(st.sampled_from([64, 128])),
        draw(st.integers(1, 4)),
        ulysses,
        draw(st.integers(1, 8)),
        draw(st.sampled_from(LAYOUTS)),
        draw(st.sampled_from(["float32", "bfloat16", "float16"])),
    )


def estimate(seq_len: int, mesh: Mesh) -> MemoryEstimate:
    heads, kv_heads, head_dim, batch, ulysses, ring, layout, dtype = mesh
    return memory_estimate(CpProblem(seq_len=seq_len, heads=heads, kv_heads=kv_heads, head_dim=head_dim, batch=batch, ulysses=ulysses, ring=ring, layout=layout, dtype=dtype).require_feasible())


def divisor_of(mesh: Mesh) -> int:
    return seq_divisor(mesh[4], mesh[5], mesh[6])


@FAST
@given(meshes(), st.integers(1, 50))
def test_memory_grows_with_seq_len_and_is_linear(mesh: Mesh, k: int) -> None:
    step = divisor_of(mesh)
    small, large = estimate(k * step, mesh), estimate((k + 1) * step, mesh)
    double = estimate(2 * k * step, mesh)
    for phase in STEP_PASSES:
        assert large.peak(phase) > small.peak(phase)
        assert large.total(phase) > small.total(phase)
        assert double.peak(phase) == 2 * small.peak(phase)
        assert small.peak(phase) <= small.total(phase)
    assert small.peak("forward") <= small.peak("forward_backward")
    assert small.total("forward") < small.total("forward_backward")


@FAST
@given(meshes(), st.integers(1, 200 * GIB), st.sampled_from(STEP_PASSES))
def test_max_seq_len_is_consistent_with_the_memory_function(
    mesh: Mesh, budget: int, phase: str
) -> None:
    heads, kv_heads, head_dim, batch, ulysses, ring, layout, dtype = mesh
    problem = CpProblem(
        seq_len=divisor_of(mesh), heads=heads, kv_heads=kv_heads, head_dim=head_dim,
        batch=batch, ulysses=ulysses, ring=ring, layout=layout, dtype=dtype,
    )
    answer = max_seq_len_for_budget(budget, problem, phase)
    step = divisor_of(mesh)
    assert answer % step == 0
    if answer > 0:
        assert estimate(answer, mesh).peak(phase) <= budget
    assert estimate(answer + step, mesh).peak(phase) > budget


def test_hand_computed_single_rank() -> None:
    # L=1024, h=h_kv=1, d_h=64, B=1, bf16, U=R=1: every [1,1024,1,64] bf16 tensor is 131_072 B,
    # the fp32 LSE [1,1,1024] is 4_096 B.
    # forward (one stage): q, k, v, o + lse = 4*131_072 + 4_096 = 528_384
    # backward attention: q, k, v, o, lse, do, dq, dk, dv = 8*131_072 + 4_096 = 1_052_672
    m = memory_estimate(CpProblem(seq_len=1024, heads=1, kv_heads=1, head_dim=64).require_feasible())
    assert m.stages == scheme_stages(1)
    assert m.peak("forward") == m.total("forward") == 528_384
    assert m.peak("forward_backward") == m.total("forward_backward") == 1_052_672


def test_hand_computed_pure_ring_counts_local_shards_once() -> None:
    # L=4096, h=8, h_kv=2, d_h=64, B=1, R=4, fp16: n = 1024 tokens per rank
    # q, o: [1,1024,8,64] = 1_048_576 B each; k, v: [1,1024,2,64] = 262_144 B each
    # out accumulator fp32 [1,1024,8,64] = 2_097_152; lse fp32 [1,8,1024] = 32_768
    # K/V double buffer [2,2,1,1024,2,64] fp16 = 1_048_576
    # forward peak = 2*1_048_576 + 2*262_144 + 2_097_152 + 32_768 + 1_048_576 = 5_799_936
    m = memory_estimate(CpProblem(seq_len=4096, heads=8, kv_heads=2, head_dim=64, ring=4, dtype="float16").require_feasible())
    names = [item.name for item in m.items]
    assert len(names) == len(set(names))
    assert not {"q_heads", "kv_heads", "o_heads", "a2a_q_send"} & set(names)
    assert m.peak("forward") == 5_799_936


def test_usp_items_and_kv_replication() -> None:
    m = memory_estimate(CpProblem(seq_len=8192, heads=32, kv_heads=2, head_dim=128, ulysses=4, ring=2).require_feasible())  # c = 2
    by_name = {item.name: item for item in m.items}
    assert by_name["q_local"].shape == (1, 1024, 32, 128)
    assert by_name["q_heads"].shape == (1, 4096, 8, 128)
    assert by_name["kv_heads"].shape == (2, 1, 4096, 1, 128)
    assert by_name["kv_replicated"].shape == (2, 1, 1024, 4, 128)
    assert "dkv_replicated" in by_name
    for name in ("out_accumulator", "lse", "dq_accumulator", "dkv_accumulator", "dkv_recv_buffer"):
        assert by_name[name].dtype == "float32"
    assert by_name["kv_ring_buffers"].dtype == "bfloat16"
    assert m.peak_stage("forward_backward") in m.stages
    assert m.peak("forward_backward") == max(m.stage_bytes(s) for s in m.stages)


def _budget_answer(budget: float, heads: int, phase: str = "forward_backward", **mesh: object) -> int:
    """The longest L for a budget (the problem's own length, 1024, is ignored)."""
    problem = CpProblem(seq_len=1024, heads=heads, kv_heads=8, head_dim=128, **mesh)  # type: ignore[arg-type]
    return max_seq_len_for_budget(budget, problem, phase)  # type: ignore[arg-type]


def test_bad_input() -> None:
    with pytest.raises(CpbenchError, match="-5"):
        _budget_answer(-5, 32)
    with pytest.raises(CpbenchError, match="sideways"):
        _budget_answer(GIB, 32, phase="sideways")
    with pytest.raises(CpbenchError, match=r"ulysses \(3\)"):
        _budget_answer(GIB, 32, ulysses=3)
    with pytest.raises(CpbenchError, match="int8"):
        _budget_answer(GIB, 32, dtype="int8")
    with pytest.raises(CpbenchError, match="kv_heads"):
        _budget_answer(GIB, 30)
    assert _budget_answer(1, 32) == 0
    with pytest.raises(CpbenchError, match="stage"):
        memory_estimate(CpProblem(seq_len=64, heads=2, kv_heads=2, head_dim=8).require_feasible()).stage_bytes("fwd_a2a_in")
