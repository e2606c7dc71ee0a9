"""The whole ranking on topology profiles: on the 2 x 4 PCIe node the hybrid meshes rank ahead
of pure Ulysses (its all-to-all crosses the switch and socket tiers); on NVLink the ranking is
today's. They monkeypatch nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cpbench.app.recommend import RecommendRequest, recommend_mesh
from cpbench.cli.main import app
from cpbench.config.constraints import AttentionShape
from cpbench.config.problem import MeshCandidate
from cpbench.model.cost.prediction import predict
from cpbench.model.formulas import comm_volume
from cpbench.model.hardware.loading import load_profile
from cpbench.model.topology import describe, place, ring_gather_time
from tests.golden import assert_same_document

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

LENGTHS = (32768, 65536, 131072)


def _times(profile: str, seq_len: int) -> dict[tuple[int, int], float]:
    hw = load_profile(profile)
    out = {}
    for u, r in ((8, 1), (4, 2), (2, 4), (1, 8)):
        c = MeshCandidate.for_shape(shape=AttentionShape(seq_len, 32, 8, 128), ulysses=u, ring=r, layout="zigzag", dtype="bfloat16", causal=True, kv_replication=None, phase="fwd")
        out[(u, r)] = predict(c, hw, 8).step_s
    return out


@pytest.mark.parametrize("seq_len", LENGTHS)
def test_pcie_2x4_ranks_hybrids_ahead_of_pure_ulysses(seq_len: int) -> None:
    """32/8 heads, hd 128, bf16, forward, 8 GPUs as 2 PCIe switches x 4: U=8's all-to-all
    pushes 4/7 of its bytes through a switch uplink shared by 4 GPUs; U=4 x R=2 and U=2 x R=4
    keep the all-to-all under one switch (at least 3% faster)."""
    t = _times("l40s-pcie-2x4", seq_len)
    assert t[(4, 2)] < 0.97 * t[(8, 1)]
    assert t[(2, 4)] < 0.97 * t[(8, 1)]


@pytest.mark.parametrize("seq_len", LENGTHS)
def test_nvlink_ranking_is_unchanged(seq_len: int) -> None:
    """A flat profile takes today's formulas: the NVLink node still ranks U=8 first and the
    times are those of the flat two-tier model (prediction.topology is None)."""
    t = _times("h100-sxm", seq_len)
    assert sorted(t, key=t.__getitem__) == [(8, 1), (4, 2), (2, 4), (1, 8)]
    c = MeshCandidate.for_shape(shape=AttentionShape(seq_len, 32, 8, 128), ulysses=8, ring=1, phase="fwd")
    assert getattr(predict(c, load_profile("h100-sxm"), 8), "topology") is None  # noqa: B009


def test_prediction_explains_the_tiers_the_all_to_all_crosses() -> None:
    c = MeshCandidate.for_shape(shape=AttentionShape(65536, 32, 8, 128), ulysses=8, ring=1, phase="fwd")
    topo = getattr(predict(c, load_profile("l40s-pcie-2x4"), 8), "topology")  # noqa: B009
    assert topo is not None
    text = describe(topo, 70e6, 0)
    assert "crosses pcie_switch, socket, bound by socket" in text


def test_recommend_on_the_pcie_profile_does_not_pick_pure_ulysses() -> None:
    rec = recommend_mesh(
        RecommendRequest(heads=32, kv_heads=8, seq_len=65536, gpus=8,
                         hardware="l40s-pcie-2x4", phase="fwd")
    )
    assert rec.winner is not None
    assert (rec.winner.prediction.candidate.ulysses, rec.winner.prediction.candidate.ring) != (8, 1)


def test_an_all_gather_is_priced_on_its_rings_tiers() -> None:
    """On a `[topology]` profile the all-gather scheme's K/V gather is priced on the levels its
    rings cross (`ring_gather_time`), with a level on each linear piece, not on the flat
    intra-node link: a 1x8 ring over two PCIe switches is bound by the socket."""
    profile = load_profile("l40s-pcie-2x4")
    candidate = MeshCandidate(seq_len=65536, heads=32, kv_heads=8, head_dim=128, ulysses=1,
                              ring=8, layout="zigzag", cp_comm="all_gather", phase="fwd")  # fmt: skip
    p = predict(candidate, profile, memory=False)
    gather = next(c for c in comm_volume(candidate).collectives("forward") if c.name == "ag_kv")
    one = ring_gather_time(place(1, 8, profile), gather.bytes_sent // gather.calls)
    assert one.bound_by == "socket"
    assert p.forward.ring_comm_s == pytest.approx(gather.calls * one.seconds, rel=1e-9)
    pieces = [t for t in p.comm_terms if t.phase == "forward" and t.kind == "all_to_all"]
    assert pieces and all(t.level is not None for t in pieces)
    flat = profile.link("intra_node").all_to_all.seconds(gather.bytes_sent // gather.calls, 1, 1)
    assert one.seconds > 1.5 * flat  # the flat link's price was the wrong one


def test_the_explanation_names_the_tier_that_bounds_each_collective() -> None:
    from cpbench.render.recommend.explanation import why_lines  # noqa: PLC0415

    profile = load_profile("l40s-pcie-2x4")
    # p2p exchanges (an all-gather's bounds: test_an_all_gather_is_priced_on_its_rings_tiers)
    rec = recommend_mesh(
        RecommendRequest(heads=32, kv_heads=8, seq_len=32768, hardware="l40s-pcie-2x4", top=0,
                         cp_comms=("p2p",))  # fmt: skip
    )
    assert rec.explanation is not None and rec.winner is not None
    tiers = {t.kind: t for t in profile.node_tiers()}
    for bound in rec.explanation.bounds:
        # each bound is a tier of the profile's topology (or its network), with its source
        assert bound.tier in tiers or bound.tier == "inter_node", bound
        if bound.tier in tiers:
            assert bound.name == tiers[bound.tier].name
            assert bound.source == tiers[bound.tier].cost(bound.kind).source
    assert rec.explanation.bounds
    text = " ".join(why_lines(rec.explanation))
    first = rec.explanation.bounds[0]
    assert f"bound by the {first.tier} tier ({first.name})" in " ".join(text.split())
    # a flat profile has no topology tier to name: the why says nothing more
    flat = recommend_mesh(RecommendRequest(heads=32, kv_heads=8, hardware="h100-sxm"))
    assert flat.explanation is not None
    assert "tier (" not in " ".join(why_lines(flat.explanation))


GOLDEN = Path(__file__).resolve().parent / "fixtures" / "placement_json.jsonl"
"""`cpbench recommend|plan ARGS --json` captured before the five placement models became one
(cpbench/model/topology.py; `{"args": [...], "json": {...}}` a line): flat and `[topology]`
profiles, a TP-strided mesh, 64 GPUs, a fabric. Only the inference on a `[topology]` profile
(l40s-pcie-2x4) was re-captured after: it used to ignore the topology; the recommend
answers when the pick became the likeliest fastest (issue 40: it was named by tie-breaks); and
the two `[topology]` recommend answers when the all-gather scheme's gather was priced on the
levels its rings cross (it was on the flat intra-node link: 4x4 all-gather won on l40s-pcie-2x4
at 0.753 s, the p2p USP at 0.763 s now wins)."""


@pytest.mark.parametrize(
    "case",
    [json.loads(line) for line in GOLDEN.read_text(encoding="utf-8").splitlines()],
    ids=lambda case: " ".join(case["args"][:2] + case["args"][-4:]),
)
def test_placement_answers_are_the_captured_ones(case: dict) -> None:
    result = CliRunner().invoke(app, [*case["args"], "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document.pop("schema_version") == 1  # the versioned --json shape, added since
    assert_same_document(document, case["json"])
