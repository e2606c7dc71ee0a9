"""Communication volume formulas: numbers, symbolic forms, nccl-tests view, bad input."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpbench.config.constraints import required_kv_replication, seq_divisor
from cpbench.config.problem import CpProblem
from cpbench.config.vocabulary import GLOBAL_LAYOUTS as LAYOUTS
from cpbench.config.vocabulary import PASSES, canonical_dtype, dtype_bytes
from cpbench.errors import CpbenchError
from cpbench.model.formulas import (
    bandwidths,
    busbw_factor,
    comm_volume,
    same_bytes,
    substitute,
)
from tests.formula_oracle import (
    evaluate_formula,
    ring_bytes_sent,
    ring_elements_sent,
    ulysses_elements_sent,
)

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

FAST = settings(max_examples=60, deadline=None)


@st.composite
def configs(draw: st.DrawFn, max_ring: int = 8) -> CpProblem:
    """A feasible configuration on a small mesh (any scheme, layout, dtype, GQA or MHA)."""
    kv_heads = draw(st.sampled_from([1, 2, 4, 8]))
    heads = kv_heads * draw(st.sampled_from([1, 2, 4]))
    ulysses_options = [
        u
        for u in (1, 2, 4, 8)
        if heads % u == 0 and required_kv_replication(kv_heads, u) is not None
    ]
    ulysses = draw(st.sampled_from(ulysses_options))
    ring = draw(st.integers(1, max_ring))
    layout = draw(st.sampled_from(LAYOUTS))
    seq_len = seq_divisor(ulysses, ring, layout) * draw(st.integers(1, 64))
    return CpProblem(seq_len=seq_len, heads=heads, kv_heads=kv_heads, head_dim=draw(st.sampled_from([8, 64, 128])), batch=draw(st.integers(1, 3)), ulysses=ulysses, ring=ring, layout=layout, dtype=draw(st.sampled_from(["float32", "bfloat16", "float16", "bf16"]))).require_feasible()


# ------------------------------------------------------------------ formulas == numbers


@FAST
@given(configs())
def test_every_symbolic_formula_evaluates_to_its_number(config: CpProblem) -> None:
    symbols = config.symbols()
    volume = comm_volume(config)
    for phase in PASSES:
        for stage in volume.stages(phase):
            assert evaluate_formula(stage.formula, symbols) == stage.elements_sent
            assert evaluate_formula(stage.bytes_formula, symbols) == stage.bytes_sent
            # the substituted text is plain arithmetic with the same value
            assert evaluate_formula(substitute(stage.bytes_formula, symbols), {}) == (
                stage.bytes_sent
            )
            for c in stage.collectives:
                assert evaluate_formula(c.per_call_formula, symbols) == c.elements_per_call
                assert evaluate_formula(c.formula, symbols) == c.elements_sent
                assert evaluate_formula(c.bytes_formula, symbols) == c.bytes_sent


@FAST
@given(configs())
def test_stage_functions_agree_with_collectives(config: CpProblem) -> None:
    volume = comm_volume(config)
    for phase in PASSES:
        by_stage = {s.stage: s for s in volume.stages(phase)}
        ulysses = by_stage.get("ulysses")
        ring = by_stage.get("ring")
        assert (ulysses.elements_sent if ulysses else 0) == ulysses_elements_sent(config, phase)
        assert (ring.elements_sent if ring else 0) == ring_elements_sent(config, phase)
        assert (ring.bytes_sent if ring else 0) == ring_bytes_sent(config, phase)
    assert ("ulysses" in {s.stage for s in volume.forward}) == (config.ulysses > 1)
    assert ("ring" in {s.stage for s in volume.forward}) == (config.ring > 1)


def test_design_md_gqa_formula_for_usp() -> None:
    # DESIGN.md: Ulysses GQA per rank B*(L/U)*(U-1)/U*(2d + 2*c*d_kv), with L -> L/R for USP
    config = CpProblem(seq_len=65536, heads=32, kv_heads=8, head_dim=128, batch=2, ulysses=4, ring=4).require_feasible()
    b, ell, u, r, d, d_kv, c = 2, 65536, 4, 4, 32 * 128, 8 * 128, 1
    expected = Fraction(b * (ell // r), u) * Fraction(u - 1, u) * (2 * d + 2 * c * d_kv)
    assert ulysses_elements_sent(config, "forward") == expected


# --------------------------------------------------------------------- scaling properties

MESH_HEADS = [(32, 8), (32, 32), (16, 2), (8, 1)]


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(MESH_HEADS),
    st.sampled_from([8, 64, 128]),
    st.integers(1, 4),
    st.integers(1, 16),
)
def test_ulysses_volume_falls_as_one_over_u(
    heads_pair: tuple[int, int], head_dim: int, batch: int, k: int
) -> None:
    """At fixed L and R = 1: V(U) = B*(L/U)*(U-1)/U*(2d + 2*c*d_kv), i.e. exactly
    V(U) * U^2/(U-1) == B*L*(2d + 2*c(U)*d_kv): the volume falls as 1/U apart from the
    (U-1)/U factor (and the replication factor c(U) once U > h_kv)."""
    heads, kv_heads = heads_pair
    seq_len = 8 * k
    d, d_kv = heads * head_dim, kv_heads * head_dim
    for u in (2, 4, 8):
        if heads % u or required_kv_replication(kv_heads, u) is None:
            continue
        config = CpProblem(seq_len=seq_len, heads=heads, kv_heads=kv_heads, head_dim=head_dim, batch=batch, ulysses=u).require_feasible()
        c = config.replication
        volume = ulysses_elements_sent(config, "forward")
        assert Fraction(volume * u * u, u - 1) == batch * seq_len * (2 * d + 2 * c * d_kv)
        if kv_heads == heads:  # MHA: 4*B*(L/U)*d*(U-1)/U (Q, K, V, O)
            assert volume == Fraction(4 * batch * seq_len * d * (u - 1), u * u)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 32), st.sampled_from([(32, 8), (8, 8), (4, 1)]), st.integers(1, 4))
def test_ring_forward_volume_tends_to_2bld_kv(
    ring: int, heads_pair: tuple[int, int], k: int
) -> None:
    """Pure ring: V(R) = 2*B*L*d_kv*(R-1)/R exactly, so the gap to the limit 2*B*L*d_kv is
    exactly 2*B*L*d_kv/R: independent of R up to a 1/R term, and increasing in R."""
    heads, kv_heads = heads_pair
    head_dim, batch, seq_len = 64, 2, 64 * k * ring
    limit = 2 * batch * seq_len * kv_heads * head_dim
    config = CpProblem(seq_len=seq_len, heads=heads, kv_heads=kv_heads, head_dim=head_dim, batch=batch, ring=ring).require_feasible()
    volume = ring_elements_sent(config, "forward")
    assert volume == Fraction(limit * (ring - 1), ring)
    assert limit - volume == Fraction(limit, ring)
    if ring > 1 and seq_len % (ring - 1) == 0:
        smaller = CpProblem(seq_len=seq_len, heads=heads, kv_heads=kv_heads, head_dim=head_dim, batch=batch, ring=ring - 1).require_feasible()
        assert ring_elements_sent(smaller, "forward") < volume


@FAST
@given(configs())
def test_gqa_reduces_only_the_kv_terms(config: CpProblem) -> None:
    """Against the MHA model with the same h: Q/O/dO/dQ all-to-alls are identical, every K/V
    term (all-to-all and ring) is scaled by (c*h_kv)/h."""
    s = config.shape
    mha_shape = replace(s, kv_heads=s.heads)
    mha = CpProblem.for_shape(shape=mha_shape, ulysses=config.ulysses, ring=config.ring, layout=config.layout, dtype=config.dtype).require_feasible()
    ratio = Fraction(config.replication * s.kv_heads, s.heads)
    gqa_volume, mha_volume = comm_volume(config), comm_volume(mha)
    for phase in PASSES:
        mha_by_name = {c.name: c for c in mha_volume.collectives(phase)}
        for c in gqa_volume.collectives(phase):
            reference = mha_by_name[c.name]
            if "kv" in c.name:
                assert c.elements_sent == reference.elements_sent * ratio
            else:
                assert c.elements_sent == reference.elements_sent


@FAST
@given(configs())
def test_backward_mirrors_forward(config: CpProblem) -> None:
    volume = comm_volume(config)
    assert ulysses_elements_sent(config, "backward") == ulysses_elements_sent(config, "forward")
    if config.ring > 1:
        chunk = 2 * config.shape.batch * config.ring_shard * config.kv_heads_per_rank
        chunk *= config.shape.head_dim
        extra = (config.ring - 1) * chunk * 4  # R - 1 fp32 dK/dV hops (the own chunk's stays)
        assert ring_bytes_sent(config, "backward") == ring_bytes_sent(config, "forward") + extra
    # the layout never changes the volume
    for layout in LAYOUTS:
        if config.shape.seq_len % seq_divisor(config.ulysses, config.ring, layout) == 0:
            other = CpProblem.for_shape(shape=config.shape, ulysses=config.ulysses, ring=config.ring, layout=layout, dtype=config.dtype).require_feasible()
            for phase in PASSES:
                assert comm_volume(other).bytes_sent(phase) == volume.bytes_sent(phase)


@FAST
@given(configs())
def test_sum_over_ranks_equals_global_total(config: CpProblem) -> None:
    """Count message by message over every rank: an all-to-all sends handed/U elements to each
    of the U-1 other ranks of its group; a ring hop sends the whole chunk to the next rank."""
    volume = comm_volume(config)
    for phase in PASSES:
        counted = 0
        for _rank in range(config.world):
            for c in volume.collectives(phase):
                if c.kind == "all_to_all":
                    per_peer = c.elements_per_call // c.group_size
                    counted += c.calls * per_peer * (c.group_size - 1) * c.bytes_per_element
                else:
                    counted += c.calls * c.elements_per_call * c.bytes_per_element
        assert counted == volume.global_bytes_sent(phase)
        assert volume.global_bytes_sent(phase) == volume.bytes_sent(phase) * config.world


# ------------------------------------------------------------------ hand-computed examples


def test_hand_computed_pure_ulysses_gqa() -> None:
    # L=8192, h=32, h_kv=8, d_h=128, B=1, U=4, bf16: S = 8192/4 = 2048 tokens per rank
    # a2a_q : handed 1*2048*32*128 = 8_388_608, sent x3/4 = 6_291_456
    # a2a_kv: handed 2*1*2048*8*128 = 4_194_304, sent x3/4 = 3_145_728
    # a2a_out = a2a_q; forward = 2*6_291_456 + 3_145_728 = 15_728_640 elements = 31_457_280 B
    # (DESIGN: 2048 * 3/4 * (2*4096 + 2*1024) = 1536 * 10240 = 15_728_640)
    config = CpProblem(seq_len=8192, heads=32, kv_heads=8, head_dim=128, ulysses=4, dtype="bfloat16").require_feasible()
    volume = comm_volume(config)
    sent = {c.name: c.elements_sent for c in volume.collectives("forward")}
    assert sent == {"a2a_q": 6_291_456, "a2a_kv": 3_145_728, "a2a_out": 6_291_456}
    assert volume.elements_sent("forward") == 15_728_640
    assert volume.bytes_sent("forward") == 31_457_280
    assert volume.bytes_sent("backward") == 31_457_280
    assert volume.global_bytes_sent("forward") == 4 * 31_457_280


def test_hand_computed_pure_ring() -> None:
    # L=8192, h=32, h_kv=8, d_h=128, B=1, R=4, fp16: chunk = 2*1*2048*8*128 = 4_194_304 elements
    # forward: 3 hops = 12_582_912 elements = 25_165_824 B
    # backward: K/V 3 hops again (25_165_824 B) + dK/dV 3 hops in fp32 (3*4_194_304*4 =
    # 50_331_648 B; the own chunk's gradient stays home) = 75_497_472 B
    config = CpProblem(seq_len=8192, heads=32, kv_heads=8, head_dim=128, ring=4, dtype="fp16").require_feasible()
    volume = comm_volume(config)
    (kv,) = volume.collectives("forward")
    assert (kv.name, kv.calls, kv.elements_per_call) == ("p2p_kv", 3, 4_194_304)
    assert volume.bytes_sent("forward") == 25_165_824
    assert volume.bytes_sent("backward") == 75_497_472
    dkv = volume.collectives("backward")[1]
    assert (dkv.name, dkv.calls, dkv.bytes_per_element, dkv.element_symbol) == (
        "p2p_dkv",
        3,
        4,
        "4",
    )


def test_hand_computed_usp_with_kv_replication() -> None:
    # L=16384, h=32, h_kv=2, d_h=64, B=2, U=4, R=2, fp32: c = 4/2 = 2, S = 16384/8 = 2048
    # a2a_q : handed 2*2048*32*64 = 8_388_608, sent 6_291_456
    # a2a_kv: handed 2*2*2048*(2*2)*64 = 2_097_152, sent 1_572_864
    # ring: L/R = 8192, KV heads per rank c*h_kv/U = 1: chunk 2*2*8192*1*64 = 2_097_152, 1 hop
    config = CpProblem(seq_len=16384, heads=32, kv_heads=2, head_dim=64, batch=2, ulysses=4, ring=2, dtype="float32").require_feasible()
    assert config.replication == 2
    volume = comm_volume(config)
    sent = {c.name: c.elements_sent for c in volume.collectives("forward")}
    assert sent == {
        "a2a_q": 6_291_456,
        "a2a_kv": 1_572_864,
        "a2a_out": 6_291_456,
        "p2p_kv": 2_097_152,
    }
    assert volume.bytes_sent("forward") == 4 * (2 * 6_291_456 + 1_572_864 + 2_097_152)


def test_formula_text_is_specialised_per_scheme() -> None:
    usp = comm_volume(CpProblem(seq_len=4096, heads=8, kv_heads=8, head_dim=64, ulysses=2, ring=2).require_feasible())
    assert usp.forward[0].formula == "B*(L/(U*R))*(U-1)/U*(2*d + 2*c*d_kv)"
    assert usp.forward[1].formula == "2*B*L*(c*d_kv/U)*(R-1)/R"
    pure = comm_volume(CpProblem(seq_len=4096, heads=8, kv_heads=8, head_dim=64, ulysses=2).require_feasible())
    assert pure.forward[0].formula == "B*(L/U)*(U-1)/U*(2*d + 2*c*d_kv)"
    ring = comm_volume(CpProblem(seq_len=4096, heads=8, kv_heads=8, head_dim=64, ring=2).require_feasible())
    assert ring.forward[0].formula == "2*B*L*d_kv*(R-1)/R"
    assert comm_volume(CpProblem(seq_len=4096, heads=8, kv_heads=8, head_dim=64).require_feasible()).forward == ()


# ------------------------------------------------------------------------- nccl-tests view


def test_nccl_bandwidth_helpers() -> None:
    assert bandwidths(1e9, 0.5, "all_to_all", 8) == pytest.approx((2e9, 2e9 * 7 / 8))
    assert bandwidths(1e9, 0.5, "send_recv", 2) == (2e9, 2e9)
    assert busbw_factor("all_to_all", 1) == 0
    assert bandwidths(1e9, 1.0, "all_to_all", 4) == (1e9, 0.75e9)
    with pytest.raises(CpbenchError, match="0"):
        bandwidths(1e9, 0, "send_recv", 2)
    with pytest.raises(CpbenchError, match="broadcast"):
        busbw_factor("broadcast", 4)  # type: ignore[arg-type]
    with pytest.raises(CpbenchError, match="0"):
        busbw_factor("all_to_all", 0)


@FAST
@given(configs(), st.floats(1e-6, 10.0))
def test_busbw_times_time_is_the_bytes_sent_per_call(config: CpProblem, seconds: float) -> None:
    for phase in PASSES:
        for c in comm_volume(config).collectives(phase):
            _, bus = bandwidths(c.bytes_per_call, seconds, c.kind, c.group_size)
            assert bus * seconds == pytest.approx(c.bytes_sent / c.calls, rel=1e-12)


# ------------------------------------------------------------------------------ bad input


def test_dtypes() -> None:
    assert canonical_dtype("bf16") == "bfloat16"
    assert canonical_dtype("FP32") == "float32"
    assert dtype_bytes("float16") == 2
    with pytest.raises(CpbenchError, match=r"'int8'.*bfloat16"):
        canonical_dtype("int8")


@pytest.mark.parametrize(
    ("sizes", "mesh", "words"),
    [
        ((0, 32, 8, 128), {}, ["seq_len", "0"]),
        ((1024, 32, 8, 0), {}, ["head_dim", "0"]),
        ((1024, 30, 8, 128), {}, ["30", "8"]),
        ((1024, 32, 8, 128), {"ulysses": 3}, ["ulysses (3)", "32"]),
        ((1024, 32, 8, 128), {"ulysses": 0}, ["ulysses", "0"]),
        ((1000, 32, 8, 128), {"ulysses": 4, "ring": 4}, ["1000", "16"]),
        ((1024, 32, 8, 128), {"layout": "random"}, ["random"]),
        ((1024, 32, 8, 128), {"dtype": "int8"}, ["int8", "float32"]),
    ],
)
def test_bad_input_raises_with_the_numbers(
    sizes: tuple[int, int, int, int], mesh: dict[str, object], words: list[str]
) -> None:
    with pytest.raises(CpbenchError) as info:
        sizes_by_name = dict(zip(("seq_len", "heads", "kv_heads", "head_dim"), sizes, strict=True))
        CpProblem(**sizes_by_name, **mesh).require_feasible()  # type: ignore[arg-type]
    for word in words:
        assert word in str(info.value)


def test_formula_evaluator_rejects_what_it_does_not_know() -> None:
    with pytest.raises(CpbenchError, match="x"):
        evaluate_formula("2*x", {})
    with pytest.raises(CpbenchError, match="unsupported"):
        evaluate_formula("2**3", {})
    volume = comm_volume(CpProblem(seq_len=64, heads=2, kv_heads=2, head_dim=8, ulysses=2).require_feasible())
    with pytest.raises(CpbenchError, match="sideways"):
        volume.stages("sideways")  # type: ignore[arg-type]


def test_same_bytes_holds_a_collective_of_zero_bytes_the_same_as_one_never_called() -> None:
    # a window of one token: the model lists p2p_kv at 0 bytes, the counter never saw a call
    assert same_bytes({}, {"p2p_kv": 0})
    # a world of one: the counter saw the all-to-all of 0 bytes, the model lists nothing
    assert same_bytes({"a2a_lse": 0, "a2a_out": 0}, {})
    assert same_bytes({"p2p_kv": 4096, "a2a_q": 0}, {"p2p_kv": 4096})
    assert not same_bytes({"p2p_kv": 4095}, {"p2p_kv": 4096})
    assert not same_bytes({"p2p_kv": 4096, "a2a_q": 8}, {"p2p_kv": 4096})
    assert not same_bytes({}, {"p2p_kv": 1})
