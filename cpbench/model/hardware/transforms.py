"""Copies of a hardware profile with some numbers changed (calibration, probing, what-ifs)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar

from cpbench.errors import CpbenchError
from cpbench.model.formulas import CollectiveKind
from cpbench.model.hardware.profile import (
    EfficiencyCurve,
    HardwareProfile,
    LinkCost,
    LinkTier,
    LinkTierProfile,
    NodeTopology,
    TopologyTier,
    collective_kind,
    kernel_family,
)

Link = TypeVar("Link", LinkTierProfile, TopologyTier)


def with_cost(link: Link, kind: CollectiveKind, cost: LinkCost) -> Link:
    """A copy of a link tier or a topology tier with the cost of one collective kind set."""
    changes: dict[str, Any] = {collective_kind(kind): cost}
    return replace(link, **changes)


def with_link_cost(
    profile: HardwareProfile, tier: LinkTier, kind: CollectiveKind, cost: LinkCost
) -> HardwareProfile:
    """A copy of the profile with one (tier, kind) LinkCost replaced."""
    return with_table(profile, "links", **{tier: with_cost(profile.link(tier), kind, cost)})


def with_tier_cost(
    profile: HardwareProfile, index: int, kind: CollectiveKind, cost: LinkCost
) -> HardwareProfile:
    """A copy of a profile with a `[topology]` with one node tier's (index into
    `node_tiers()`) LinkCost of one collective kind replaced."""
    if profile.topology is None or not 0 <= index < len(profile.topology.tiers):
        raise CpbenchError(f"profile {profile.name!r} has no topology tier {index}")
    tiers = list(profile.topology.tiers)
    tiers[index] = with_cost(tiers[index], kind, cost)
    return replace(profile, topology=replace(profile.topology, tiers=tuple(tiers)))


def with_curve(profile: HardwareProfile, family: str, curve: EfficiencyCurve) -> HardwareProfile:
    """A copy of the profile with the curve of one kernel family set (the default family's is
    `efficiency`)."""
    return with_table(profile, "kernels", **{kernel_family(family): curve})


def with_default_kernel(profile: HardwareProfile, family: str) -> HardwareProfile:
    """A copy whose default family (the one `efficiency` holds and `auto` runs) is `family`,
    its curve the new one's (or the old default's, when it has none)."""
    known = kernel_family(family)
    if known == profile.default_kernel:
        return profile
    source = f"{known} made the default (was {profile.default_kernel})"
    return with_table(profile, "kernels", default=known, source=source,
                      **{known: profile.curve(known)})


def with_topology(profile: HardwareProfile, topology: NodeTopology | None) -> HardwareProfile:
    """A copy with the node topology set (None: a flat node); CpbenchError when the outermost
    island is not the node or the islands do not nest."""
    if topology is not None:
        sizes = [t.island for t in topology.tiers]
        if not sizes or sizes[-1] != profile.devices_per_node:
            raise CpbenchError(
                f"topology islands {sizes}: the outermost must be the node "
                f"({profile.devices_per_node} devices per node)"
            )
        for below, above in zip(sizes, sizes[1:], strict=False):
            if above <= below or above % below:
                raise CpbenchError(
                    f"topology islands {sizes} do not nest: {above} is not a larger multiple "
                    f"of {below}"
                )
    return replace(profile, topology=topology)


def with_table(profile: HardwareProfile, table: str, **changes: Any) -> HardwareProfile:
    """A copy with fields of one of the profile's tables changed, e.g. `with_table(p,
    "overheads", overlap=0.5)`, `with_table(p, "peaks", bfloat16=900.0)`."""
    tables: dict[str, Any] = {table: replace(getattr(profile, table), **changes)}
    return replace(profile, **tables)
