"""The one placement model: which link tier a group of ranks crosses on a profile's levels (its
node tiers, a flat node being one, then the network; or a plan's fabric) and what it costs.

The rules: docs/design.md section 2, "The topology's arithmetic"; the fabrics: docs/plan.md."""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Literal, get_args

from cpbench.config.problem import check_choice, check_positive_int
from cpbench.model.formulas import CollectiveKind
from cpbench.model.hardware.network import Fabric, NetworkTier
from cpbench.model.hardware.profile import (
    HardwareProfile,
    LinkCost,
    Links,
    LinkTier,
    LinkTierProfile,
    TierKind,
)

if TYPE_CHECKING:
    from cpbench.model.plan.memory import Parallelism

PlacementOrder = Literal["ulysses_low", "ring_low"]
"""How CP ranks map to devices: Ulysses groups consecutive (ulysses_low) or rings (ring_low)."""
PLACEMENT_ORDERS: tuple[PlacementOrder, ...] = get_args(PlacementOrder)


# ------------------------------------------------------------------------------- levels


@dataclass(frozen=True)
class Level:
    """One level of the placement's topology: a node tier, or the network between nodes."""

    kind: TierKind
    """What joins its islands."""
    island: int
    """Devices per island (the node for the network level: islands of it are whole nodes)."""
    below: int
    """Devices per island of the level below (1 for the innermost), whose uplinks it prices."""
    name: str
    """The technology."""
    all_to_all: LinkCost
    """All-to-all cost across it (busbw per device of a lower island sending at once)."""
    send_recv: LinkCost
    """Send/recv cost across it."""
    peer_to_peer: bool
    """Whether GPU peer-to-peer works across it."""
    devices_per_link: int = 1
    """Devices sharing one link of the profile's cost (the network: a NIC's devices_per_nic;
    its costs here are per device, the NIC's busbw over this)."""

    def cost(self, kind: CollectiveKind) -> LinkCost:
        """The LinkCost of a collective kind."""
        return self.all_to_all if kind == "all_to_all" else self.send_recv


def levels(profile: HardwareProfile, devices_per_node: int | None = None) -> tuple[Level, ...]:
    """The node tiers (clipped to `devices_per_node`, the last one the node) and the network
    level (per-device busbw = the NIC's busbw / devices sharing it)."""
    per_node = devices_per_node or profile.devices_per_node
    out: list[Level] = []
    for tier in profile.node_tiers():
        last = tier.island >= per_node or per_node % tier.island != 0
        below = out[-1].island if out else 1
        out.append(Level(tier.kind, per_node if last else tier.island, below, tier.name,
                         tier.all_to_all, tier.send_recv, tier.peer_to_peer))
        if last:
            break
    else:
        out[-1] = replace(out[-1], island=per_node)
    nic = profile.inter_node
    share = nic.devices_per_nic
    a2a, sr = (LinkCost(c.latency_s, c.busbw / share, c.source) for c in (nic.all_to_all,
                                                                           nic.send_recv))
    out.append(Level("network", per_node, per_node, nic.name, a2a, sr, True, share))
    return tuple(out)


def meet_level(a: int, b: int, tiers: Sequence[Level]) -> int:
    """Index of the smallest level whose island holds devices a and b (len - 1: the network)."""
    for index, level in enumerate(tiers[:-1]):
        if a // level.island == b // level.island:
            return index
    return len(tiers) - 1


def holding(size: int, stride: int, islands: Sequence[int]) -> int:
    """Index of the first island size that holds a group of `size` members `stride` apart
    (its span, stride x size, aligned); len(islands) when none does (the network)."""
    span = stride * size
    return next((i for i, n in enumerate(islands) if size <= 1 or span <= n), len(islands))


def group_link(
    profile: HardwareProfile, size: int, stride: int = 1, devices_per_node: int | None = None
) -> tuple[LinkTier, LinkTierProfile]:
    """The tier a group of `size` ranks `stride` apart crosses and the link its collectives are
    priced on: a flat profile's link of that tier; on a `[topology]` the group's own link, the
    latency and busbw that give its all-to-all and ring hop times on the levels."""
    tiers = levels(profile, devices_per_node)
    crossed = holding(size, stride, [lv.island for lv in tiers[:-1]])
    tier: LinkTier = "inter_node" if crossed == len(tiers) - 1 else "intra_node"
    if profile.topology is None or size <= 1:
        return tier, profile.link(tier)
    return tier, _group_link(tier, tiers, size, stride)


@functools.lru_cache(maxsize=256)
def _group_link(tier: LinkTier, tiers: tuple[Level, ...], size: int, stride: int
                ) -> LinkTierProfile:
    """`_time` of one group in closed form (O(size) per level, not size^2 flows): an island of
    the level below holding n members sends n (size - n) / (size - 1) of a rank's all-to-all
    bytes, and one ring hop, across each level; one byte's slowest level gives the busbw."""
    top, a2a, hop = 0, 0.0, 0.0
    for t, level in enumerate(tiers):
        counts = Counter(k * stride // level.below for k in range(size)).values()
        if len(counts) == 1:
            break
        top, cap = t, level.below
        a2a = max(a2a, max(n * (size - n) for n in counts) / (size - 1) / (
            level.all_to_all.busbw * cap))
        hop = max(hop, 1 / (level.send_recv.busbw * cap))
    high = tiers[top]
    source = f"the topology's time of {size} ranks, {high.name} the highest level"
    return LinkTierProfile(tier, high.name, LinkCost(high.all_to_all.latency_s, 1 / a2a, source),
                           LinkCost(high.send_recv.latency_s, 1 / hop, source))


# ---------------------------------------------------------------------------- placement


@dataclass(frozen=True)
class TopologyPlacement:
    """Which device each CP rank of a U x R mesh runs on, on a profile's levels."""

    ulysses: int
    """U."""
    ring: int
    """R."""
    order: PlacementOrder
    """ulysses_low or ring_low."""
    rank_stride: int
    """Global ranks between consecutive CP slots (TP in Megatron's order)."""
    devices: tuple[int, ...]
    """Global device of CP rank p (p = j*U + u)."""
    tiers: tuple[Level, ...]
    """The levels it is priced on."""

    def ulysses_group(self, j: int) -> tuple[int, ...]:
        """Devices of the Ulysses group of ring index j."""
        return tuple(self.devices[j * self.ulysses + u] for u in range(self.ulysses))

    def ring_group(self, u: int) -> tuple[int, ...]:
        """Devices of the ring of Ulysses index u, in ring order."""
        return tuple(self.devices[j * self.ulysses + u] for j in range(self.ring))


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


@functools.lru_cache(maxsize=4096)
def placement(ulysses: int, ring: int, devices_per_node: int, rank_stride: int = 1) -> Placement:
    """Placement of a U x R mesh on nodes of `devices_per_node` devices (cached: a fit
    prices the same meshes thousands of times)."""
    for name, value in zip(("ulysses", "ring", "devices per node", "rank stride"),
                           (ulysses, ring, devices_per_node, rank_stride), strict=True):
        check_positive_int(name, value)

    def node(cp_rank: int) -> int:
        return cp_rank * rank_stride // devices_per_node

    world = ulysses * ring
    # A Ulysses group's node counts depend only on where it starts within a node, which
    # repeats every `period` ring ranks: O(G) groups, not R.
    period = devices_per_node // math.gcd(ulysses * rank_stride, devices_per_node)
    peers = ulysses
    for j in range(min(ring, period)):
        peers = min(peers, *Counter(node(j * ulysses + u) for u in range(ulysses)).values())
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


def place(
    ulysses: int,
    ring: int,
    profile: HardwareProfile,
    devices_per_node: int | None = None,
    rank_stride: int = 1,
    order: PlacementOrder = "ulysses_low",
) -> TopologyPlacement:
    """The placement of a U x R mesh in one order; CpbenchError on a bad size or order."""
    for label, value in (("ulysses", ulysses), ("ring", ring), ("rank stride", rank_stride)):
        check_positive_int(label, value)
    check_choice("placement order", order, PLACEMENT_ORDERS)
    devices = []
    for p in range(ulysses * ring):
        j, u = divmod(p, ulysses)
        slot = p if order == "ulysses_low" else u * ring + j
        devices.append(slot * rank_stride)
    return TopologyPlacement(
        ulysses, ring, order, rank_stride, tuple(devices), levels(profile, devices_per_node)
    )


# -------------------------------------------------------------------------------- costs


@dataclass(frozen=True)
class LevelTime:
    """The part of one collective that crosses one level."""

    kind: TierKind
    """The level."""
    name: str
    """Its technology."""
    bytes_per_rank: float
    """Bytes the busiest rank sends across it."""
    seconds: float
    """Bandwidth time of the busiest island's uplink at this level."""


@dataclass(frozen=True)
class CollectiveTime:
    """One collective call on a placement: latency + the slowest crossed level's time."""

    seconds: float
    """Latency of the highest crossed level + the bounding level's bandwidth time."""
    latency_s: float
    """The latency paid."""
    levels: tuple[LevelTime, ...]
    """Every level crossed, innermost first."""
    bounding: int
    """Index into `levels` of the level that sets the time (-1 when nothing is sent)."""

    @property
    def bound_by(self) -> str:
        """The kind of the bounding level ('' when nothing is sent)."""
        return self.levels[self.bounding].kind if self.bounding >= 0 else ""

    @property
    def crosses_network(self) -> bool:
        """Whether any byte leaves the node."""
        return any(lt.kind == "network" and lt.bytes_per_rank > 0 for lt in self.levels)


def _time(
    tiers: Sequence[Level], kind: CollectiveKind, flows: Sequence[tuple[int, int, float]]
) -> CollectiveTime:
    """Concurrent flows (source device, destination device, bytes): per level, the bytes that
    leave each lower island across it over that island's uplink capacity; the worst island
    and level set the time, the highest crossed level's latency is paid once."""
    leaving: dict[tuple[int, int], float] = {}
    per_rank: dict[tuple[int, int], float] = {}
    top = -1
    for src, dst, nbytes in flows:
        if nbytes <= 0 or src == dst:
            continue
        m = meet_level(src, dst, tiers)
        top = max(top, m)
        for t in range(m + 1):
            key = (t, src // tiers[t].below)  # the island whose uplink at level t it leaves
            leaving[key] = leaving.get(key, 0.0) + nbytes
            per_rank[(t, src)] = per_rank.get((t, src), 0.0) + nbytes
    if top < 0:
        return CollectiveTime(0.0, 0.0, (), -1)
    out: list[LevelTime] = []
    for t in range(top + 1):
        level = tiers[t]
        cap = level.cost(kind).busbw * level.below
        seconds = max((v for (lt, _), v in leaving.items() if lt == t), default=0.0) / cap
        busiest = max((v for (lt, _), v in per_rank.items() if lt == t), default=0.0)
        out.append(LevelTime(level.kind, level.name, busiest, seconds))
    bounding = max(range(len(out)), key=lambda i: (out[i].seconds, -i))
    latency = tiers[top].cost(kind).latency_s
    return CollectiveTime(latency + out[bounding].seconds, latency, tuple(out), bounding)


def all_to_all_time(placement: TopologyPlacement, bytes_sent: float) -> CollectiveTime:
    """One all-to-all over every Ulysses group at once; `bytes_sent` per rank, own part
    excluded (formulas.py's counting)."""
    groups = [placement.ulysses_group(j) for j in range(placement.ring)]
    return _group_exchange(placement, groups, bytes_sent)


def ring_gather_time(placement: TopologyPlacement, bytes_sent: float) -> CollectiveTime:
    """One all-gather (or reduce-scatter) over every ring group at once, the all-gather CP
    scheme's K/V gather (dK/dV reduce-scatter); `bytes_sent` per rank, own part excluded
    (formulas.py's counting). Priced on the all-to-all cost, as on a flat profile."""
    groups = [placement.ring_group(u) for u in range(placement.ulysses)]
    return _group_exchange(placement, groups, bytes_sent)


def _group_exchange(
    placement: TopologyPlacement, groups: Sequence[tuple[int, ...]], bytes_sent: float
) -> CollectiveTime:
    """Every member of each group (all of one size) sends an equal share of `bytes_sent` to
    every other member, all groups at once."""
    size = len(groups[0])
    if size == 1 or bytes_sent <= 0:
        return CollectiveTime(0.0, 0.0, (), -1)
    share = bytes_sent / (size - 1)
    flows = [(a, b, share) for group in groups for a in group for b in group if a != b]
    return _time(placement.tiers, "all_to_all", flows)


def ring_hop_time(placement: TopologyPlacement, hop_bytes: float) -> CollectiveTime:
    """One ring exchange of every ring at once: each rank sends `hop_bytes` to its successor;
    the slowest hop paces the step."""
    r = placement.ring
    if r == 1 or hop_bytes <= 0:
        return CollectiveTime(0.0, 0.0, (), -1)
    flows: list[tuple[int, int, float]] = []
    for u in range(placement.ulysses):
        group = placement.ring_group(u)
        flows.extend((group[j], group[(j + 1) % r], hop_bytes) for j in range(r))
    return _time(placement.tiers, "send_recv", flows)


def describe(placement: TopologyPlacement, a2a_bytes: float, hop_bytes: float) -> str:
    """Which tiers the all-to-all and the ring cross, and what bounds each (one sentence)."""
    parts = []
    if placement.ulysses > 1:
        a2a = _route(all_to_all_time(placement, a2a_bytes), "bound by")
        parts.append(f"the all-to-all over {placement.ulysses} ranks {a2a}")
    if placement.ring > 1:
        hop = _route(ring_hop_time(placement, hop_bytes), "its slowest hop bound by")
        parts.append(f"the ring of {placement.ring} {hop}")
    if not parts:
        return "a single rank: no communication"
    no_p2p = [lv.kind for lv in placement.tiers if not lv.peer_to_peer]
    tail = f"; no GPU peer-to-peer across {', '.join(no_p2p)}" if no_p2p else ""
    return f"{placement.order} placement: " + "; ".join(parts) + tail


def _route(collective: CollectiveTime, bound: str) -> str:
    """'crosses <levels>, <bound> <the bounding level> (<its rate per rank>)'."""
    lt = collective.levels[collective.bounding]
    rate = lt.bytes_per_rank / lt.seconds / 1e9 if lt.seconds > 0 else math.inf
    crossed = ", ".join(level.kind for level in collective.levels)
    return f"crosses {crossed}, {bound} {collective.bound_by} ({rate:.1f} GB/s per rank, GB = 1e9 bytes)"


# ---------------------------------------------------------------------- plan fabric


def profile_fabric(profile: HardwareProfile) -> Fabric:
    """The fabric of a profile alone: nodes on its inter-node link, no rails, no domain."""
    return Fabric("profile", profile.inter_node.name, profile.inter_node, rail_optimised=False,
                  rail_group_nodes=1, source=f"the {profile.name} profile's inter_node link")


@dataclass(frozen=True)
class GroupTier:
    """One group's tier and link."""

    group: str
    """tp, ulysses, ring, dp or pp."""
    size: int
    """Members."""
    stride: int
    """Global ranks between consecutive members."""
    tier: NetworkTier
    """The outermost tier its traffic crosses."""
    link: LinkTierProfile
    """The link it is priced on."""

    @property
    def sends(self) -> bool:
        """Whether the group communicates at all (size > 1)."""
        return self.size > 1


def group_tier(stride: int, size: int, per_node: int, fabric: Fabric) -> NetworkTier:
    """The tier a group of `size` members `stride` apart crosses (docs/plan.md): the first of
    the node, the fabric's NVLink domain and (same-rail traffic on a rail-optimised fabric) the
    rail group that holds its span, else the network."""
    islands: list[tuple[NetworkTier, int]] = [("node", per_node)]
    if fabric.nvlink_domain is not None:
        islands.append(("nvlink_domain", fabric.nvlink_domain))
    if fabric.rail_optimised and stride % per_node == 0:
        islands.append(("rail", fabric.rail_group_nodes * per_node))
    index = holding(size, stride, [n for _, n in islands])
    return islands[index][0] if index < len(islands) else "network"


def tier_link(tier: NetworkTier, profile: HardwareProfile, fabric: Fabric) -> LinkTierProfile:
    """The link of a tier: the profile's node link, the domain's NVLink, the NIC (through one
    leaf on a rail) or the NIC through the spine."""
    if tier == "node":
        return profile.intra_node
    if tier == "nvlink_domain" and fabric.nvlink is not None:
        return fabric.nvlink
    if tier == "rail":
        return fabric.network
    return fabric.spine()


@dataclass(frozen=True)
class PlanTiers:
    """The tier of each group of a plan."""

    groups: tuple[GroupTier, ...]
    """tp, ulysses, ring, dp, pp."""
    fabric: Fabric
    """The fabric they are on."""

    def of(self, group: str) -> GroupTier:
        """One group's tier."""
        return next(g for g in self.groups if g.group == group)


def plan_tiers(par: Parallelism, profile: HardwareProfile, per_node: int,
               fabric: Fabric | None = None) -> PlanTiers:
    """Every group's tier and link on a fabric (None: the profile's inter-node link)."""
    fab = fabric or profile_fabric(profile)
    t, u, r, c, d = par.tp, par.ulysses, par.ring, par.cp, par.dp
    shapes = (("tp", 1, t), ("ulysses", t, u), ("ring", t * u, r), ("dp", t, c * d),
              ("pp", t * c * d, par.pp))
    groups = []
    for name, stride, size in shapes:
        tier = group_tier(stride, size, per_node, fab)
        groups.append(GroupTier(name, size, stride, tier, tier_link(tier, profile, fab)))
    return PlanTiers(tuple(groups), fab)


def attention_profile(profile: HardwareProfile, per_node: int, tp: int, ulysses: int, ring: int,
                      fabric: Fabric | None) -> tuple[HardwareProfile, int]:
    """The profile and GPUs per 'node' the cost model prices the CP attention with: the NVLink
    domain as the node (its NVLink as the intra-node link) when the fabric has one, and as the
    inter-node link the one the CP group's cross-domain traffic takes (a rail or the spine)."""
    if fabric is None:
        return profile, per_node
    domain = fabric.nvlink_domain or per_node
    intra = tier_link("node" if fabric.nvlink_domain is None else "nvlink_domain", profile, fabric)
    tiers = [group_tier(tp, ulysses, per_node, fabric), group_tier(tp * ulysses, ring, per_node,
                                                                  fabric)]
    inter = tier_link("network" if "network" in tiers else "rail", profile, fabric)
    links = Links(replace(intra, tier="intra_node"), replace(inter, tier="inter_node"))
    return replace(profile, links=links, devices_per_node=domain), domain


# ---------------------------------------------------------------------------- detection


_CELL_LEVEL: dict[str, int] = {"NV": 0, "PIX": 1, "PXB": 1, "PHB": 2, "NODE": 3, "SYS": 4}
_LEVEL_KIND: tuple[TierKind, ...] = ("nvlink", "pcie_switch", "host_bridge", "numa_node", "socket")


@dataclass(frozen=True)
class DetectedTier:
    """A tier read from the interconnect matrix."""

    kind: TierKind
    """What joins the islands."""
    islands: tuple[tuple[int, ...], ...]
    """Devices (matrix order) of each island at this tier."""
    peer_to_peer: bool
    """Whether peer-to-peer was reported OK between every pair meeting at this tier."""


def _find_root(parent: list[int], x: int) -> int:
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


def tiers_from_matrix(
    matrix: Sequence[Sequence[str]], p2p: Sequence[Sequence[bool]] | None = None
) -> tuple[DetectedTier, ...]:
    """Islands per tier from `nvidia-smi topo -m` cells (NV#, PIX, PXB, PHB, NODE, SYS): at each
    tier the groups of devices joined by cells at or below it (connected components), only the
    tiers that merge islands; `p2p[a][b]` (NVML's P2P read status) marks tiers without it."""
    n = len(matrix)
    out: list[DetectedTier] = []
    previous: tuple[tuple[int, ...], ...] = tuple((i,) for i in range(n))
    for level, kind in enumerate(_LEVEL_KIND):
        parent = list(range(n))
        for a in range(n):
            for b in range(n):
                cell = str(matrix[a][b]).upper()
                key = "NV" if cell.startswith("NV") else cell
                if a != b and _CELL_LEVEL.get(key, 5) <= level:
                    parent[_find_root(parent, a)] = _find_root(parent, b)
        groups: dict[int, list[int]] = {}
        for i in range(n):
            groups.setdefault(_find_root(parent, i), []).append(i)
        islands = tuple(sorted(tuple(g) for g in groups.values()))
        if len(islands) == len(previous):
            continue
        ok = True
        if p2p is not None:
            ok = all(
                p2p[a][b]
                for island in islands
                for a in island
                for b in island
                if a != b and not any(a in p and b in p for p in previous)
            )
        out.append(DetectedTier(kind, islands, ok))
        previous = islands
    return tuple(out)
