"""The topology functions of cpbench.model.topology, on the shipped profiles (no cost model)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import pytest

from cpbench.config.problem import CpProblem
from cpbench.errors import CpbenchError
from cpbench.model.hardware.loading import load_profile
from cpbench.model.hardware.profile import HardwareProfile
from cpbench.model.inference_cost import price_decode, price_prefill
from cpbench.model.topology import (
    TopologyPlacement,
    all_to_all_time,
    group_link,
    levels,
    meet_level,
    place,
    ring_gather_time,
    ring_hop_time,
    tiers_from_matrix,
)

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

MB = 1e6


def test_flat_profile_all_to_all_is_todays_formula() -> None:
    """One island: latency + bytes a rank sends / busbw, exactly (NVLink unchanged)."""
    h100 = load_profile("h100-sxm")
    p = place(8, 1, h100)
    t = all_to_all_time(p, 70 * MB)
    expected = h100.intra_node.all_to_all.seconds(70 * MB)
    assert t.seconds == pytest.approx(expected, rel=1e-12)
    hop = ring_hop_time(place(1, 8, h100), 50 * MB)
    assert hop.seconds == pytest.approx(h100.intra_node.send_recv.seconds(50 * MB), rel=1e-12)


def test_two_switch_levels_and_meet() -> None:
    prof = load_profile("l40s-pcie-2x4")
    lv = levels(prof)
    assert [(x.kind, x.island, x.below) for x in lv] == [
        ("pcie_switch", 4, 1), ("socket", 8, 4), ("network", 8, 8)
    ]
    assert (meet_level(0, 3, lv), meet_level(3, 4, lv), meet_level(0, 8, lv)) == (0, 1, 2)


def test_all_to_all_over_8_pcie_gpus_is_bound_by_the_switch_uplink() -> None:
    """U=8: 4 of a rank's 7 peers sit behind the other switch; the 4 GPUs of a switch share
    its uplink: (4 ranks x 4/7 x S) / (4 x busbw_socket) = 4/7 S / busbw_socket."""
    prof = load_profile("l40s-pcie-2x4")
    socket = prof.node_tiers()[1].all_to_all
    size = 70 * MB
    t = all_to_all_time(place(8, 1, prof), size)
    assert t.bound_by == "socket"
    assert t.seconds == pytest.approx(socket.latency_s + 4 / 7 * size / socket.busbw, rel=1e-9)
    inside = all_to_all_time(place(4, 2, prof), size)  # groups of 4 stay under one switch
    assert [lt.kind for lt in inside.levels] == ["pcie_switch"]
    assert inside.seconds < 0.5 * t.seconds


def test_ring_hop_pays_the_crossed_tier_shared_by_the_crossers() -> None:
    prof = load_profile("l40s-pcie-2x4")
    switch, socket = (t.send_recv for t in prof.node_tiers())
    size = 60 * MB
    pure = ring_hop_time(place(1, 8, prof), size)  # 1 hop per switch crosses: full uplink
    assert pure.seconds == pytest.approx(
        socket.latency_s + max(size / switch.busbw, size / (4 * socket.busbw)), rel=1e-9
    )
    strided = ring_hop_time(place(2, 4, prof), size)  # rings {0,2,4,6},{1,3,5,7}: 2 cross
    assert strided.bound_by == "socket"
    assert strided.seconds == pytest.approx(socket.latency_s + 2 * size / (4 * socket.busbw))
    assert strided.seconds > pure.seconds


def test_ring_gather_pays_the_crossed_tier_shared_by_the_ring() -> None:
    """The all-gather CP scheme's K/V gather: each ring rank sends S / (R - 1) to every other
    member of its ring. R = 8 over 2 switches: per switch, 4 ranks x 4 peers across x S/7 over
    the 4 GPUs' uplink, 4/7 S / busbw_socket (the all-to-all of U = 8, the same flows). Rings
    {0,2,4,6} and {1,3,5,7} (U = 2): 4 ranks x 2 across x S/3 over it, 2/3 S / busbw_socket."""
    prof = load_profile("l40s-pcie-2x4")
    socket = prof.node_tiers()[1].all_to_all
    size = 70 * MB
    whole = ring_gather_time(place(1, 8, prof), size)
    assert whole.bound_by == "socket"
    assert whole.seconds == pytest.approx(socket.latency_s + 4 / 7 * size / socket.busbw)
    assert whole.seconds == pytest.approx(all_to_all_time(place(8, 1, prof), size).seconds)
    strided = ring_gather_time(place(2, 4, prof), size)
    assert strided.seconds == pytest.approx(socket.latency_s + 2 / 3 * size / socket.busbw)
    # U = 4 keeps each Ulysses group under a switch, so every ring of 2 crosses the socket
    assert ring_gather_time(place(4, 2, prof), size).bound_by == "socket"
    assert ring_gather_time(place(8, 1, prof), size).seconds == 0.0  # no ring: no gather


@dataclass(frozen=True)
class Export:
    """How to run a placement with each framework."""

    cuda_visible_devices: str
    """Devices in CP-rank order for one node (CUDA_VISIBLE_DEVICES), e.g. '0,4,1,5,2,6,3,7'."""
    yunchang_use_ulysses_low: bool
    """yunchang's `set_seq_parallel_pg(..., use_ulysses_low=...)` in the identity order."""
    megatron_hierarchical_sizes: tuple[int, int]
    """Megatron-Core's `hierarchical_context_parallel_sizes` (a2a group innermost): [U, R]."""
    note: str
    """One sentence: what to set."""


def export(placement: TopologyPlacement) -> Export:
    """CUDA_VISIBLE_DEVICES, yunchang and Megatron settings of this placement."""
    per_node = placement.tiers[-1].island
    first = [d % per_node for d in placement.devices[: min(len(placement.devices), per_node)]]
    visible = ",".join(str(d) for d in first)
    low = placement.order == "ulysses_low"
    if low:
        note = (
            f"default rank order: Ulysses groups of {placement.ulysses} consecutive ranks "
            f"(yunchang use_ulysses_low=True; Megatron hierarchical_context_parallel_sizes "
            f"[{placement.ulysses}, {placement.ring}])"
        )
    else:
        note = (
            f"rings of {placement.ring} consecutive devices: yunchang use_ulysses_low=False, or "
            f"CUDA_VISIBLE_DEVICES={visible} with use_ulysses_low=True / Megatron "
            f"hierarchical_context_parallel_sizes [{placement.ulysses}, {placement.ring}]"
        )
    return Export(visible, low, (placement.ulysses, placement.ring), note)


def comm_seconds(
    placement: TopologyPlacement,
    all_to_all_calls: Sequence[float],
    hop_bytes: float,
    hops: int,
) -> float:
    """Serialised communication of a candidate: its all-to-all calls (bytes per rank each)
    plus `hops` ring exchanges of `hop_bytes`."""
    total = sum(all_to_all_time(placement, b).seconds for b in all_to_all_calls)
    return total + hops * ring_hop_time(placement, hop_bytes).seconds


def choose_placement(
    ulysses: int,
    ring: int,
    profile: HardwareProfile,
    all_to_all_calls: Sequence[float],
    hop_bytes: float,
    hops: int,
    devices_per_node: int | None = None,
    rank_stride: int = 1,
) -> TopologyPlacement:
    """The order with the least communication (`comm_seconds`); ulysses_low unless ring_low
    is faster by more than 1%: what cpbench runs without reordering the devices."""
    low = place(ulysses, ring, profile, devices_per_node, rank_stride, "ulysses_low")
    if ulysses == 1 or ring == 1:
        return low
    alt = place(ulysses, ring, profile, devices_per_node, rank_stride, "ring_low")
    t_low = comm_seconds(low, all_to_all_calls, hop_bytes, hops)
    t_alt = comm_seconds(alt, all_to_all_calls, hop_bytes, hops)
    return alt if t_alt < 0.99 * t_low else low


def test_placement_orders_and_export() -> None:
    prof = load_profile("l40s-pcie-2x4")
    low = place(2, 4, prof)
    alt = place(2, 4, prof, order="ring_low")
    assert low.devices == tuple(range(8))
    assert alt.ring_group(0) == (0, 1, 2, 3) and alt.ulysses_group(0) == (0, 4)
    assert export(alt).cuda_visible_devices == "0,4,1,5,2,6,3,7"
    assert not export(alt).yunchang_use_ulysses_low
    assert export(low).megatron_hierarchical_sizes == (2, 4)
    with pytest.raises(CpbenchError, match="placement order 'x'"):
        place(2, 4, prof, order="x")  # type: ignore[arg-type]


def test_choose_placement_keeps_the_all_to_all_inside_a_switch() -> None:
    prof = load_profile("l40s-pcie-2x4")
    big_a2a = choose_placement(4, 2, prof, [200 * MB] * 4, 1 * MB, 1)
    assert big_a2a.order == "ulysses_low"
    big_ring = choose_placement(4, 2, prof, [1 * MB], 400 * MB, 6)
    assert big_ring.order == "ring_low"


def test_islands_from_the_topo_matrix() -> None:
    """2 switches x 4 on 2 sockets with NVLink pairs: nvlink pairs, switches, sockets."""
    matrix = []
    for a in range(8):
        row = []
        for b in range(8):
            if a == b:
                row.append("X")
            elif a // 2 == b // 2:
                row.append("NV4")
            elif a // 4 == b // 4:
                row.append("PIX")
            else:
                row.append("SYS")
        matrix.append(row)
    p2p = [[(a // 4 == b // 4) for b in range(8)] for a in range(8)]
    tiers = tiers_from_matrix(matrix, p2p)
    assert [(t.kind, len(t.islands), t.peer_to_peer) for t in tiers] == [
        ("nvlink", 4, True), ("pcie_switch", 2, True), ("socket", 1, False)
    ]
    assert tiers[1].islands == ((0, 1, 2, 3), (4, 5, 6, 7))


@pytest.mark.parametrize("name", ["h100-sxm", "l40s-pcie", "cpu-local"])
def test_group_link_on_a_flat_profile_is_the_tier_it_crosses(name: str) -> None:
    """A flat profile is one node tier plus the network: W ranks fit the node or cross it, and
    are priced on that tier's link of the profile, as the inference always was."""
    prof = load_profile(name)
    per_node = prof.devices_per_node
    for world in (1, 2, per_node, per_node + 1, 2 * per_node):
        tier, link = group_link(prof, world)
        assert tier == ("intra_node" if world <= per_node else "inter_node")
        assert link is prof.link(tier)


def test_group_link_on_a_topology_is_the_groups_level_time() -> None:
    """l40s-pcie-2x4: 4 ranks stay on one PCIe switch (its costs, not the intra_node link's);
    8 cross the socket, whose uplink carries 4 ranks x 4/7 of their bytes at 4 x 5 GB/s, so an
    all-to-all runs at 1 / max(1 / 20, (16/7) / 20) = 8.75 GB/s per rank, its latency the
    socket's; a ring hop (one per island crosses) stays at the switch's 22 GB/s."""
    prof = load_profile("l40s-pcie-2x4")
    switch, socket = prof.node_tiers()
    tier, four = group_link(prof, 4)
    assert tier == "intra_node"
    assert (four.all_to_all.busbw, four.send_recv.busbw) == (switch.all_to_all.busbw,
                                                             switch.send_recv.busbw)
    assert four.all_to_all.busbw != prof.intra_node.all_to_all.busbw  # the tier, not the node
    tier, eight = group_link(prof, 8)
    assert tier == "intra_node"
    assert eight.all_to_all.busbw == pytest.approx(8.75e9, rel=1e-12)
    assert eight.all_to_all.latency_s == socket.all_to_all.latency_s
    assert eight.send_recv.busbw == pytest.approx(22e9, rel=1e-12)
    assert group_link(prof, 16)[0] == "inter_node"


@pytest.mark.parametrize("name", ["l40s-pcie-2x4", "l40s-pcie-2x4-nop2p", "a100-pcie-4"])
def test_group_link_is_the_training_models_time(name: str) -> None:
    """The group's link (closed form per island) gives the times `all_to_all_time` and
    `ring_hop_time` sum flow by flow, at any size and stride, aligned or not, across nodes."""
    prof = load_profile(name)
    for size in (2, 3, 4, 6, 8, 12, 16, 24):
        for stride in (1, 2, 3):
            link = group_link(prof, size, stride)[1]
            for nbytes in (1 * MB, 70 * MB):
                a2a = all_to_all_time(place(size, 1, prof, rank_stride=stride), nbytes)
                hop = ring_hop_time(place(1, size, prof, rank_stride=stride), nbytes)
                assert link.all_to_all.seconds(nbytes) == pytest.approx(a2a.seconds, rel=1e-12)
                assert link.send_recv.seconds(nbytes) == pytest.approx(hop.seconds, rel=1e-12)


def test_inference_prices_the_topology_it_runs_on() -> None:
    """The inference read only the node size (world_link_tier): on l40s-pcie-2x4 a Ulysses
    prefill or a decode over 8 ranks paid the intra_node link's 16 GB/s though it crosses the
    socket's 5 GB/s links; priced on the topology, its exchange takes 16 / 8.75 as long."""
    prof = load_profile("l40s-pcie-2x4")
    flat = replace(prof, topology=None)  # what the inference priced before
    problem = CpProblem(seq_len=69632, heads=32, kv_heads=8, head_dim=128)
    now = price_prefill("ulysses", 65536, 4096, problem, 8, prof)
    before = price_prefill("ulysses", 65536, 4096, problem, 8, flat)
    assert now.compute_s == before.compute_s
    assert now.exposed_comm_s > before.exposed_comm_s
    sent = now.bytes_sent
    link = group_link(prof, 8)[1].all_to_all
    assert now.exposed_comm_s == pytest.approx(
        link.seconds(sent["a2a_q"] + sent["a2a_kv"], calls=2) + link.seconds(sent["a2a_out"]))
    bandwidth = now.exposed_comm_s - 3 * link.latency_s
    assert bandwidth == pytest.approx(
        (before.exposed_comm_s - 3 * prof.intra_node.all_to_all.latency_s) * 16 / 8.75)
    decode, decode_before = (price_decode(131072, problem, 8, p) for p in (prof, flat))
    assert decode.comm_s == pytest.approx(link.seconds(sum(decode.bytes_sent.values()), calls=2))
    assert decode.comm_s != decode_before.comm_s  # small messages: the latencies differ
    assert price_prefill("ulysses", 65536, 4096, problem, 4, prof).exposed_comm_s < (
        price_prefill("ulysses", 65536, 4096, problem, 4, flat).exposed_comm_s)  # one switch
