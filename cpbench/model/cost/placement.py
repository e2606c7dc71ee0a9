"""Where the CP groups of a U x R mesh sit on nodes, and which link tier each collective uses.

The flat-node rules: docs/design.md section 2, "Topology and uncertainty of predictions"."""

from __future__ import annotations

import math
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
    # A Ulysses group's node counts depend only on where it starts within a node, which
    # repeats every `period` ring ranks: O(G) groups, not R.
    period = devices_per_node // math.gcd(ulysses * rank_stride, devices_per_node)
    peers = ulysses
    for j in range(min(ring, period)):
        nodes = [node(j * ulysses + u) for u in range(ulysses)]
        peers = min(peers, min(nodes.count(n) for n in set(nodes)))
    crossing = 0
    if ring > 1:
        for u in range(ulysses):
            # a ring group's nodes never decrease along it: every hop changes node when a hop
            # spans a node or more, else as many hops change as nodes it passes; the hop back
            # to the start changes node when any other does
            if ulysses * rank_stride >= devices_per_node:
                changes = ring - 1
            else:
                changes = node((ring - 1) * ulysses + u) - node(u)
            crossing = max(crossing, changes + (1 if changes else 0))
    return Placement(
        ulysses, ring, devices_per_node, rank_stride, node(world - 1) - node(0) + 1,
        "intra_node" if peers == ulysses else "inter_node", peers,
        "inter_node" if crossing else "intra_node", crossing,
    )  # fmt: skip
