"""A plan across nodes prices each collective on the tier it crosses and says which: TP in the
node, Ulysses inside the fastest domain, the ring across, DP and PP furthest (a 2-node and a
64-node case, rails and an NVL72 domain)."""

from __future__ import annotations

import pytest

from cpbench.app.plan import PlanRequest, PlanResult, plan_report, plan_training
from cpbench.model.hardware.loading import load_profile
from cpbench.model.hardware.network import FABRICS, load_fabric
from cpbench.model.plan.memory import Parallelism
from cpbench.model.plan.search import Plan
from cpbench.model.topology import group_tier, plan_tiers

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)


def _find(result: PlanResult, ulysses: int, ring: int) -> Plan:
    return next(p for p in result.feasible if (p.par.ulysses, p.par.ring) == (ulysses, ring))


def _terms(p: Plan, tier: str, kind: str) -> float:
    """Bytes of the attention's linear comm pieces on one tier and kind."""
    return sum(t.bytes for t in p.attention.comm_terms if t.tier == tier and t.kind == kind)


@pytest.fixture(scope="module")
def two_nodes() -> PlanResult:
    return plan_training(PlanRequest("llama3-8b", 262144, 16, 8, tp=1, cp=16, pp=1, keep=0,
                            fabric="hgx-rail"))


def test_two_nodes_ulysses_inside_the_node_ring_across(two_nodes: PlanResult) -> None:
    p = _find(two_nodes, 8, 2)
    assert p.tiers is not None
    assert p.tiers.of("ulysses").tier == "node"
    # ring members 8 ranks apart: GPU k of both nodes, the same rail
    assert p.tiers.of("ring").tier == "rail"
    place = p.attention.placement
    assert (place.ulysses_tier, place.ring_tier, place.nodes) == ("intra_node", "inter_node", 2)
    # the all-to-all stays on NVLink, every ring hop crosses the NIC
    assert _terms(p, "inter_node", "all_to_all") == 0 < _terms(p, "intra_node", "all_to_all")
    assert _terms(p, "inter_node", "send_recv") > 0 == _terms(p, "intra_node", "send_recv")
    tiers = plan_report(two_nodes).model_dump(mode="json")["feasible"]
    row = next(r for r in tiers if (r["ulysses"], r["ring"]) == (8, 2))["tiers"]
    assert row["ulysses"]["tier"] == "node" and row["ring"]["tier"] == "rail"
    assert row["attention"] == {"ulysses_all_to_all": "intra_node", "ring_hops": "inter_node",
                                "ring_crossing_hops": 2, "nodes": 2}


def test_two_nodes_ulysses_across_nodes_pays_the_nic(two_nodes: PlanResult) -> None:
    across = _find(two_nodes, 16, 1)
    inside = _find(two_nodes, 8, 2)
    assert across.tiers is not None and across.tiers.of("ulysses").tier == "network"
    assert across.attention.placement.ulysses_tier == "inter_node"
    assert _terms(across, "inter_node", "all_to_all") > 0
    # a 16-way all-to-all over two nodes sends half its bytes over the NIC: slower than
    # keeping it in the node and ringing across
    assert across.attention.step_s > inside.attention.step_s


@pytest.fixture(scope="module")
def sixty_four_nodes() -> PlanResult:
    return plan_training(PlanRequest("llama3-70b", 1048576, 512, 8, tp=8, pp=1, keep=0,
                            recompute="full", fabric="hgx-rail"))


def test_sixty_four_nodes_tiers(sixty_four_nodes: PlanResult) -> None:
    r = sixty_four_nodes
    over_rail = _find(r, 1, 64)  # CP 64 x TP 8 = 512 GPUs: 64 nodes, two 32-node rail groups
    assert over_rail.tiers is not None
    assert over_rail.tiers.of("tp").tier == "node"
    assert over_rail.tiers.of("ring").tier == "network"
    within = next(p for p in r.feasible if (p.par.ulysses, p.par.ring, p.par.dp) == (1, 32, 2))
    assert within.tiers is not None
    assert within.tiers.of("ring").tier == "rail"  # 32 nodes: one rail group
    assert within.tiers.of("dp").tier == "network"  # DP x CP = 64 ranks 8 apart: 64 nodes
    assert within.attention.placement.nodes == 32
    ulysses = next(p for p in r.feasible if (p.par.ulysses, p.par.ring) == (8, 8))
    assert ulysses.tiers is not None
    # U 8 at stride TP 8: GPU k of 8 nodes, one rail (TP fills the node, so Ulysses leaves it)
    assert ulysses.tiers.of("ulysses").tier == "rail"
    assert ulysses.attention.placement.ulysses_tier == "inter_node"
    # members of different local indices on two nodes cross rails: through the spine
    assert group_tier(4, 4, 8, load_fabric("hgx-rail")) == "network"
    # without rail wiring (roce-clos) every cross-node group goes through the spine
    assert group_tier(8, 8, 8, load_fabric("roce-clos")) == "network"


def test_a_slower_spine_slows_only_what_crosses_it() -> None:
    """An oversubscribed spine (factor 0.5) slows the ring of 64 nodes, not the one of 32."""
    from dataclasses import replace  # noqa: PLC0415

    from cpbench.model.hardware import network  # noqa: PLC0415

    profile = load_profile("h100-sxm")
    rail = load_fabric("hgx-rail")
    half = replace(rail, spine_factor=0.5)
    par64 = Parallelism(8, 1, 64, 1, 1)
    par32 = Parallelism(8, 1, 32, 1, 2)
    for par, slower in ((par64, True), (par32, False)):
        a = plan_tiers(par, profile, 8, rail).of("ring").link.send_recv.busbw
        b = plan_tiers(par, profile, 8, half).of("ring").link.send_recv.busbw
        assert (b < a) is slower
        if slower:
            assert b == pytest.approx(0.5 * a)
    assert set(network.FABRICS) == set(FABRICS)


def test_nvl72_domain_keeps_a_cross_node_group_on_nvlink() -> None:
    fabric = load_fabric("nvl72")
    assert fabric.nvlink_domain == 72
    # 4 GPUs per node: a group of 8 members 4 apart spans 8 nodes but one NVLink domain
    assert group_tier(4, 8, 4, fabric) == "nvlink_domain"
    assert group_tier(4, 32, 4, fabric) == "rail"  # 128 GPUs: beyond the rack, GPU k of each
    assert group_tier(2, 64, 4, fabric) == "network"  # beyond the rack across rails
    r = plan_training(
        PlanRequest("llama3-8b", 262144, 64, 4, tp=4, cp=16, pp=1, keep=0, fabric="nvl72")
    )
    p = _find(r, 8, 2)
    assert p.tiers is not None and p.tiers.of("ulysses").tier == "nvlink_domain"
    assert p.tiers.of("ring").tier == "nvlink_domain"
    # priced as one 72-GPU 'node' on NVLink 5: nothing crosses the NIC
    assert p.attention.placement.ulysses_tier == "intra_node"
    assert _terms(p, "inter_node", "all_to_all") == 0 == _terms(p, "inter_node", "send_recv")
    flat = plan_training(PlanRequest("llama3-8b", 262144, 64, 4, tp=4, cp=16, pp=1, keep=0))
    q = _find(flat, 8, 2)
    assert q.tiers is not None and q.tiers.of("ulysses").tier == "network"
    assert q.attention.step_s > p.attention.step_s
