"""All-gather CP wired in everywhere the other schemes are (issue 13): the configuration
(`cp_comm`, `heads_k_stride`, schemes, ids), `cp_attention(cp_comm="all_gather")` on gloo ranks
(counted bytes == the formulas' bytes exactly, per collective, forward and backward, for every
stride; output and gradients == the float64 reference), the formulas and their nccl-tests view,
memory against the stride, the cost model's exposed gather, recommend and the framework
settings."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from cpbench.app.formulas import formulas_report
from cpbench.app.recommend import RecommendRequest, recommend_mesh
from cpbench.app.recommend.frameworks import (
    cp_comm_type,
    llama3_setting,
    megatron_setting,
    torchtitan_setting,
)
from cpbench.app.recommend.parallel import solve_parallel_sizes
from cpbench.app.recommend.types import RankedCandidate
from cpbench.app.verify import default_cases
from cpbench.attention import build_mesh, cp_attention, run_length, shard
from cpbench.attention.comm import ByteCounter, counting
from cpbench.bench.reference import run_cases_on_rank
from cpbench.config.bench import BenchConfig
from cpbench.config.constraints import AttentionShape, scheme_of
from cpbench.config.masks import MaskSpec
from cpbench.config.problem import CpProblem, MeshCandidate
from cpbench.config.tolerances import TOLERANCE
from cpbench.config.vocabulary import Pass
from cpbench.errors import CpbenchError
from cpbench.model.cost.prediction import predict
from cpbench.model.formulas import (
    busbw_factor,
    comm_volume,
)
from cpbench.model.hardware.loading import load_profile
from cpbench.model.memory import memory_estimate
from cpbench.render.recommend.explanation import explanation_text
from cpbench.render.recommend.frameworks import setting_note
from tests.formula_oracle import evaluate_formula

# ------------------------------------------------------------------------ the configuration


def _bench(**overrides: object) -> BenchConfig:
    values: dict[str, object] = dict(
        seq_len=64,
        batch=1,
        heads=8,
        kv_heads=4,
        head_dim=16,
        dtype="float32",
        causal=True,
        ulysses=1,
        ring=4,
        layout="zigzag",
        kv_replication=None,
        kernel="auto",
        phase="fwd+bwd",
        device="cpu",
        world_size=4,
    )
    values.update(overrides)
    return BenchConfig(**values)  # type: ignore[arg-type]


def test_schemes_and_ids() -> None:
    assert scheme_of(1, 4, "all_gather") == "allgather"
    assert scheme_of(2, 2, "all_gather") == "usp_allgather"
    assert scheme_of(4, 1, "all_gather") == "ulysses"  # no ring axis: nothing to gather
    assert scheme_of(2, 2) == "usp"
    p2p = _bench()
    ag = _bench(cp_comm="all_gather")
    strided = _bench(cp_comm="all_gather", heads_k_stride=2)
    assert not p2p.key.endswith("-ag")  # old ids stay valid
    assert ag.key == f"{p2p.key}-ag"
    assert strided.key == f"{p2p.key}-ag-hs2"
    assert ag.scheme == "allgather"
    record = strided.to_dict()
    assert record["cp_comm"] == "all_gather" and record["heads_k_stride"] == 2
    assert BenchConfig.from_dict(record) == strided
    old = p2p.to_dict()
    del old["cp_comm"], old["heads_k_stride"]
    assert BenchConfig.from_dict(old).cp_comm == "p2p"


def test_bad_cp_comm_and_strides_are_named() -> None:
    with pytest.raises(CpbenchError, match="cp_comm 'broadcast' is not one of p2p, all_gather"):
        _bench(cp_comm="broadcast")
    with pytest.raises(CpbenchError, match="applies to cp_comm all_gather only"):
        _bench(heads_k_stride=2)
    feasibility = _bench(cp_comm="all_gather", heads_k_stride=3).feasibility
    assert not feasibility.ok
    assert "(c x h_kv / U = 4): 4 % 3 = 1" in (feasibility.reason or "")


# ------------------------------------------------------------- formulas, memory, nccl view


@pytest.mark.parametrize(("ulysses", "ring", "stride"), [(1, 8, None), (1, 8, 2), (2, 4, 1)])
def test_gather_bytes_and_formulas(ulysses: int, ring: int, stride: int | None) -> None:
    L, h, h_kv, d_h, b = 32768, 32, 8, 128, 2
    c = CpProblem(seq_len=L, heads=h, kv_heads=h_kv, head_dim=d_h, batch=b, ulysses=ulysses, ring=ring, layout="zigzag", dtype="bfloat16", cp_comm="all_gather", heads_k_stride=stride).require_feasible()
    assert c.scheme == ("allgather" if ulysses == 1 else "usp_allgather")
    chunk = 2 * b * (L // ring) * (h_kv // ulysses) * d_h
    volume = comm_volume(c)
    ag = [x for x in volume.collectives("forward") if x.stage == "all_gather"]
    assert [x.name for x in ag] == ["ag_kv"]
    assert ag[0].bytes_sent == (ring - 1) * chunk * 2
    kv_per_rank = h_kv // ulysses
    assert ag[0].calls == kv_per_rank // (stride or kv_per_rank)
    # nccl-tests: the size of an all-gather is its whole output, R chunks of the stride
    assert ag[0].bytes_per_call * ag[0].calls == ring * chunk * 2
    assert busbw_factor("all_gather", ring) == Fraction(ring - 1, ring)
    assert busbw_factor("reduce_scatter", ring) == Fraction(ring - 1, ring)
    backward = {x.name: x for x in volume.collectives("backward") if x.stage == "all_gather"}
    assert backward["ag_kv"].bytes_sent == (ring - 1) * chunk * 2
    assert backward["rs_dkv"].bytes_sent == (ring - 1) * chunk * 4  # fp32
    symbols = c.symbols()
    for phase in ("forward", "backward"):
        for stage in volume.stages(phase):
            assert evaluate_formula(stage.bytes_formula, symbols) == stage.bytes_sent
            for x in stage.collectives:
                assert evaluate_formula(x.formula, symbols) == x.elements_sent
                assert evaluate_formula(x.per_call_formula, symbols) == x.elements_per_call
    # the ring on the same mesh sends the same bytes both ways: its dK/dV accumulator makes
    # R - 1 hops, as many chunks as the reduce-scatter hands on
    ring_c = CpProblem(seq_len=L, heads=h, kv_heads=h_kv, head_dim=d_h, batch=b, ulysses=ulysses, ring=ring, layout="zigzag", dtype="bfloat16").require_feasible()
    ring_v = comm_volume(ring_c)
    assert ring_v.bytes_sent("forward") == volume.bytes_sent("forward")
    assert ring_v.bytes_sent("backward") == volume.bytes_sent("backward")


def test_gathered_memory_shrinks_with_the_stride_and_grows_with_length() -> None:
    def gathered(seq_len: int, stride: int | None) -> tuple[int, int]:
        c = CpProblem(seq_len=seq_len, heads=32, kv_heads=8, head_dim=128, batch=1, ulysses=1, ring=8, layout="zigzag", dtype="bfloat16", cp_comm="all_gather", heads_k_stride=stride).require_feasible()
        est = memory_estimate(c)
        item = next(i for i in est.items if i.name == "kv_gathered")
        return item.bytes, est.peak("forward_backward")

    whole, peak_whole = gathered(32768, None)
    assert whole == 2 * 32768 * 8 * 128 * 2  # 2 L d_kv elements, bf16: no second buffer
    half, _ = gathered(32768, 4)
    assert half == 2 * (2 * 32768 * 4 * 128 * 2)  # two strides alive: the next in flight
    one, peak_one = gathered(32768, 1)
    assert one == 2 * (2 * 32768 * 1 * 128 * 2)
    assert peak_one < peak_whole
    assert gathered(65536, None)[0] == 2 * whole  # grows with L
    report = formulas_report(CpProblem(seq_len=32768, heads=32, kv_heads=8, head_dim=128, batch=1, ulysses=1, ring=8, layout="zigzag", cp_comm="all_gather"))
    assert report.all_gather is not None
    rows = {r.heads_k_stride: r for r in report.all_gather.strides}
    assert set(rows) == {8, 4, 2, 1}
    assert rows[8].gathered_kv_bytes == whole and rows[1].gathered_kv_bytes == one
    nccl = {(r.phase, r.name): r for r in report.nccl_tests.collectives}
    assert nccl["backward", "rs_dkv"].kind == "reduce_scatter"
    assert nccl["forward", "ag_kv"].busbw_factor == pytest.approx(7 / 8, abs=1e-12)


def test_sweep_analytic_config_of_a_point() -> None:
    config = _bench(cp_comm="all_gather", heads_k_stride=1)
    model = config
    assert model.all_gather and model.gathers == 4
    names = {c.name for c in comm_volume(model).collectives("backward")}
    assert names == {"ag_kv", "rs_dkv"}


# ----------------------------------------------------------------------------- cost model


def test_one_stride_hides_its_gather_behind_the_own_chunk_only() -> None:
    profile = load_profile("h100-sxm")
    overlap = profile.overlap
    shape = AttentionShape(32768, 32, 8, 128, 1)
    whole = predict(MeshCandidate.for_shape(shape=shape, ulysses=1, ring=8, layout="zigzag", cp_comm="all_gather"), profile)
    link = profile.intra_node.all_to_all
    gather_s = link.latency_s + 7 * 2 * 4096 * 8 * 128 * 2 / link.busbw
    # zigzag: the own chunk is 1/8 of every rank's causal work (n^2/2 of R n^2/2)
    own = whole.forward.compute_s / 8
    hidden = min(own, gather_s)
    expected = max(own, gather_s) - own + (1 - overlap) * hidden
    assert whole.forward.exposed_comm_s == pytest.approx(expected, rel=1e-9)
    assert whole.forward.overlappable_s == pytest.approx(hidden, rel=1e-9)
    rs_s = link.latency_s + 7 * 2 * 4096 * 8 * 128 * 4 / link.busbw
    own_b = whole.backward.compute_s / 8
    expected_b = max(own_b, gather_s) - own_b + (1 - overlap) * min(own_b, gather_s) + rs_s
    assert whole.backward.exposed_comm_s == pytest.approx(expected_b, rel=1e-9)
    ring = predict(MeshCandidate.for_shape(shape=shape, ulysses=1, ring=8, layout="zigzag"), profile)
    assert ring.backward.exposed_comm_s < whole.backward.exposed_comm_s  # the last rs waits
    assert ring.memory_bytes < whole.memory_bytes
    strided = predict(
        MeshCandidate.for_shape(shape=shape, ulysses=1, ring=8, layout="zigzag", cp_comm="all_gather", heads_k_stride=1), profile
    )
    assert strided.memory_bytes < whole.memory_bytes
    assert strided.backward.exposed_comm_s < whole.backward.exposed_comm_s  # smaller last rs


# ------------------------------------------------------------------------------ recommend


def test_recommend_lists_and_explains_all_gather() -> None:
    rec = recommend_mesh(RecommendRequest(heads=32, kv_heads=8, seq_len=32768, gpus=8, top=0))
    labels = [r.label for r in rec.ranked]
    assert "1x8 zigzag all-gather" in labels
    assert "1x8 zigzag all-gather hs1" in labels
    assert "2x4 zigzag all-gather" in labels
    assert rec.explanation is not None and rec.explanation.gather is not None
    assert rec.explanation.gather.ring is not None  # the ring on the same mesh
    why = explanation_text(rec.explanation)
    assert "All-gather: its best candidate" in why and "Against the ring on the same mesh" in why
    assert "GiB of gathered K/V" in why
    only_ring = recommend_mesh(
        RecommendRequest(heads=32, kv_heads=8, seq_len=32768, gpus=8, top=0, cp_comms=("p2p",))
    )
    assert not any(r.prediction.candidate.all_gather for r in only_ring.ranked)


def test_framework_settings_for_all_gather() -> None:
    profile = load_profile("h100-sxm")
    shape = AttentionShape(32768, 32, 8, 128, 1)
    sizes = solve_parallel_sizes(8, 1, 1, None, 1, 1)
    pure = predict(MeshCandidate.for_shape(shape=shape, ulysses=1, ring=8, layout="zigzag", cp_comm="all_gather"), profile)
    usp = predict(MeshCandidate.for_shape(shape=shape, ulysses=2, ring=4, layout="zigzag", cp_comm="all_gather"), profile)
    assert cp_comm_type(1, 8, "all_gather") == "all_gather"
    assert cp_comm_type(1, 8) == "p2p"
    meg = megatron_setting(pure, sizes)
    assert "--cp-comm-type all_gather" in meg.settings and meg.expressible
    meg_usp = megatron_setting(usp, sizes)
    assert not meg_usp.expressible
    assert "no_a2a_all_gather" in {c.kind for c in meg_usp.caveats}
    assert "no a2a+all_gather" in setting_note(meg_usp)
    titan = torchtitan_setting(pure, [RankedCandidate(pure)])
    assert "context_parallel_rotate_method allgather" in titan.settings
    strided = predict(
        MeshCandidate.for_shape(shape=shape, ulysses=1, ring=8, layout="zigzag", cp_comm="all_gather", heads_k_stride=2), profile
    )
    assert "heads_k_stride=2" in llama3_setting(strided).settings


# -------------------------------------------------------------------- verify cases (model)


def test_verify_covers_every_ring_case_all_gathered() -> None:
    cases = default_cases(4)
    ring_cases = {
        (c.ulysses, c.ring, c.layout, c.mask, c.kv_heads)
        for c in cases
        if c.ring > 1 and c.cp_comm == "p2p"
    }
    gathered = {
        (c.ulysses, c.ring, c.layout, c.mask, c.kv_heads)
        for c in cases
        if c.cp_comm == "all_gather" and c.heads_k_stride is None
    }
    assert ring_cases and ring_cases == gathered
    assert any(c.heads_k_stride == 1 for c in cases)
    assert len({c.label for c in cases}) == len(cases)


# ------------------------------------------------------------------ on ranks: bytes, values


def count_gather_bytes(
    seq_len: int,
    kv_heads: int,
    ulysses: int,
    ring: int,
    layout: str,
    stride: int | None,
    documents: tuple[int, ...] | None,
    dtype: str,
) -> dict[str, dict[str, int]]:
    """One forward+backward of all-gather cp_attention under a ByteCounter (on a rank)."""
    mesh = build_mesh(ulysses, ring)
    mask = MaskSpec(documents=documents)
    n = run_length(mask, seq_len, ulysses, ring, layout)
    g = torch.Generator().manual_seed(3)
    dt = getattr(torch, dtype)
    q = torch.randn(2, n, 4, 8, generator=g)
    k = torch.randn(2, n, kv_heads, 8, generator=g)
    v = torch.randn(2, n, kv_heads, 8, generator=g)
    ql, kl, vl = (shard(t, mesh, layout, mask=mask).to(dt).requires_grad_(True) for t in (q, k, v))
    counter = ByteCounter()
    with counting(counter):
        out = cp_attention(
            ql,
            kl,
            vl,
            mesh,
            layout=layout,
            mask=mask,
            kernel="naive" if dt != torch.float32 else "auto",
            cp_comm="all_gather",
            heads_k_stride=stride,
        )
        with counter.phase("bwd"):
            out.sum().backward()
    return counter.as_dict()


BYTE_CASES = [
    (1, 4, 2, "zigzag", None, None, "float32"),
    (1, 4, 2, "zigzag", 1, None, "float32"),
    (2, 2, 2, "striped", None, None, "bfloat16"),
    (2, 2, 4, "contiguous", 1, None, "float32"),
    (2, 2, 1, "zigzag", None, None, "float32"),  # KV heads fewer than ranks: replicated
    (1, 4, 2, "doc_zigzag", 1, (5, 20, 7), "float32"),
]


@pytest.mark.parametrize(
    ("ulysses", "ring", "kv_heads", "layout", "stride", "documents", "dtype"), BYTE_CASES
)
def test_counted_gather_bytes_equal_the_formulas(
    pool, ulysses, ring, kv_heads, layout, stride, documents, dtype
) -> None:
    seq_len = 32
    per_rank = pool(4).run(
        count_gather_bytes,
        seq_len,
        kv_heads,
        ulysses,
        ring,
        layout,
        stride,
        documents,
        dtype,
        timeout=120,
    )
    config = CpProblem(seq_len=seq_len, heads=4, kv_heads=kv_heads, head_dim=8, batch=2, ulysses=ulysses, ring=ring, layout=layout, dtype=dtype, cp_comm="all_gather", heads_k_stride=stride).masked(MaskSpec(documents=documents)).require_feasible()
    volume = comm_volume(config)
    phases: tuple[tuple[Pass, str], ...] = (("forward", "fwd"), ("backward", "bwd"))
    for phase, key in phases:
        expected = {c.name: c.bytes_sent for c in volume.collectives(phase)}
        assert "ag_kv" in expected
        for counted in per_rank:
            assert counted.get(key, {}) == expected, (phase, counted)


def test_all_gather_cases_match_the_reference(pool) -> None:
    cases = [
        c
        for c in default_cases(4, masks=False, cp_comms=("all_gather",))
        if c.cp_comm == "all_gather" and c.kv_heads in (2, 1) and c.layout in ("zigzag", "balanced")
    ]
    assert {c.scheme for c in cases} == {"allgather", "usp_allgather"}
    records = [r for r in pool(4).run(run_cases_on_rank, cases, "cpu", timeout=300)[0] if r]
    assert len(records) == len(cases)
    for r in records:
        assert r["passed"], r["label"]
        assert r["max_error"] < TOLERANCE["float32"]


def test_recommend_gives_all_gather_settings_beside_the_winner() -> None:
    rec = recommend_mesh(RecommendRequest(heads=32, kv_heads=8, seq_len=32768, gpus=8, top=0))
    assert rec.winner is not None and not rec.winner.prediction.candidate.all_gather
    row = next(f for f in rec.frameworks if f.framework == "all-gather CP")
    assert "context_parallel_rotate_method allgather" in row.settings
    assert "llama3_flash_attn_varlen_func" in row.settings
    only = recommend_mesh(
        RecommendRequest(
            heads=32, kv_heads=8, seq_len=32768, gpus=8, cp_comms=("all_gather",), tp=1, top=0
        )
    )
    assert all(r.prediction.candidate.all_gather or r.prediction.candidate.ring == 1 for r in only.ranked)
