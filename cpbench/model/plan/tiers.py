"""Which link each of a plan's collectives crosses, and its cost. Pure Python.

The rank order and the tiers: docs/plan.md, "Tiers across nodes"."""

from __future__ import annotations

from dataclasses import dataclass, replace

from cpbench.model.hardware.network import Fabric, NetworkTier
from cpbench.model.hardware.profile import HardwareProfile, Links, LinkTierProfile
from cpbench.model.plan.memory import Parallelism


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
    """The tier a group of `size` members `stride` apart crosses (docs/plan.md)."""
    span = stride * size
    if size <= 1 or span <= per_node:
        return "node"
    if fabric.nvlink_domain is not None and span <= fabric.nvlink_domain:
        return "nvlink_domain"
    same_rail = stride % per_node == 0
    if fabric.rail_optimised and same_rail and span <= fabric.rail_group_nodes * per_node:
        return "rail"
    return "network"


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

    def describe(self) -> dict[str, str]:
        """group -> 'tier (link name)' for the groups that send."""
        return {g.group: f"{g.tier} ({g.link.name})" for g in self.groups if g.sends}


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
    intra = fabric.nvlink if fabric.nvlink_domain is not None and fabric.nvlink else (
        profile.intra_node)
    tiers = [group_tier(tp, ulysses, per_node, fabric), group_tier(tp * ulysses, ring, per_node,
                                                                  fabric)]
    inter = fabric.spine() if "network" in tiers else fabric.network
    inter = replace(inter, tier="inter_node")
    intra = replace(intra, tier="intra_node")
    return replace(profile, links=Links(intra, inter), devices_per_node=domain), domain
