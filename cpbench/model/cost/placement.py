"""Where the CP groups of a U x R mesh sit on nodes, and which link tier each collective uses.

The flat-node rules: docs/design.md section 2, "Topology and uncertainty of predictions"."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from cpbench.config.problem import check_positive_int
from cpbench.model.hardware.profile import LinkTier


@dataclass(frozen=True)
class Placement:
    """Where the CP groups of a U x R mesh sit and which link tier each collective uses (the
    facts; `cpbench.render.recommend.explanation.placement_text` words them)."""

    ulysses: int
    """U."""
    ring: int
    """R."""
    devices_per_node: int
    """G: devices (ranks) per node."""
    rank_stride: int
    """Global ranks between consecutive CP ranks (TP in Megatron's order, else 1)."""
    nodes: int
    """Nodes the CP group spans."""
    ulysses_tier: LinkTier
    """Tier of the all-to-all: inter_node when a Ulysses group spans nodes."""
    ulysses_peers_in_node: int
    """k: members of the worst Ulysses group on one node (itself included); k = U inside."""
    ring_tier: LinkTier
    """Tier pacing the ring: inter_node when any hop crosses a node boundary."""
    ring_crossing_hops: int
    """Hops of the worst ring group (out of R) that cross a node boundary."""

    @property
    def ulysses_inter_fraction(self) -> Fraction:
        """Share of a rank's all-to-all bytes sent to other nodes: (U - k) / (U - 1)."""
        if self.ulysses == 1:
            return Fraction(0)
        return Fraction(self.ulysses - self.ulysses_peers_in_node, self.ulysses - 1)


def placement(ulysses: int, ring: int, devices_per_node: int, rank_stride: int = 1) -> Placement:
    """Placement of a U x R mesh on nodes of `devices_per_node` devices."""
    for name, value in (
        ("ulysses", ulysses), ("ring", ring), ("devices per node", devices_per_node),
        ("rank stride", rank_stride),
    ):  # fmt: skip
        check_positive_int(name, value)

    def node(cp_rank: int) -> int:
        return cp_rank * rank_stride // devices_per_node

    world = ulysses * ring
    peers = ulysses
    for j in range(ring):
        nodes = [node(j * ulysses + u) for u in range(ulysses)]
        peers = min(peers, min(nodes.count(n) for n in set(nodes)))
    crossing = 0
    if ring > 1:
        for u in range(ulysses):
            hops = sum(
                node(j * ulysses + u) != node(((j + 1) % ring) * ulysses + u) for j in range(ring)
            )
            crossing = max(crossing, hops)
    return Placement(
        ulysses, ring, devices_per_node, rank_stride, node(world - 1) - node(0) + 1,
        "intra_node" if peers == ulysses else "inter_node", peers,
        "inter_node" if crossing else "intra_node", crossing,
    )  # fmt: skip
