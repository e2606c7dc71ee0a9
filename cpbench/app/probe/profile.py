"""The profile a probe writes (`measured_profile`): the prior with the measured links, topology
tiers and kernel curve replaced, each replaced number's source saying so: docs/probe.md,
"The fit and the profile"."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from cpbench.app.probe.fit import KernelMeasurement, LinkFit, tier_kind
from cpbench.config.vocabulary import Phase
from cpbench.model.formulas import CollectiveKind
from cpbench.model.hardware.profile import EfficiencyCurve, HardwareProfile, LinkCost, NodeTopology
from cpbench.model.hardware.transforms import with_cost, with_curve, with_link_cost, with_topology
from cpbench.units import format_bytes


def measured_profile(
    prior: HardwareProfile,
    fits: Sequence[LinkFit],
    kernels: Sequence[KernelMeasurement],
    family: str,
    dtype: str,
    phase: Phase,
    stamp: str,
    name: str | None = None,
) -> tuple[HardwareProfile, list[str]]:
    """The prior with the fitted links and the measured kernel curve (efficiency against the
    prior's peak of `dtype`, written to `family`); `stamp` is '<date>, <machine>' for the
    sources. Notes say what was clipped."""
    notes: list[str] = []
    profile = prior
    tiers = list(prior.node_tiers())
    for fit in fits:
        cost = LinkCost(
            fit.latency_s,
            fit.busbw,
            f"measured by cpbench probe {stamp}: {fit.kind} over {fit.points} sizes "
            f"{format_bytes(fit.sizes[0], '.3g')} - {format_bytes(fit.sizes[1], '.3g')}, median "
            f"of repetitions, max over ranks, least-squares latency + bytes / busbw",
            fit.residual,
        )
        tiers[fit.level] = with_cost(tiers[fit.level], fit.kind, cost)
    kinds: tuple[CollectiveKind, ...] = ("all_to_all", "send_recv")
    for kind in kinds:
        measured = [f for f in fits if f.kind == kind]
        if measured:  # the flat view of the node: its outermost measured tier
            top = max(measured, key=lambda f: f.level)
            profile = with_link_cost(profile, "intra_node", kind, tiers[top.level].cost(kind))
    if prior.topology is None:
        # the flat node's one tier (prior.node_tiers()) with the measured costs
        island = replace(tiers[0], kind=tier_kind(prior, 0))
        topology = NodeTopology((island,), f"one island (a flat node): cpbench probe {stamp}")
    else:
        topology = NodeTopology(
            tuple(tiers), f"{prior.topology.source}; tiers measured by cpbench probe {stamp}"
        )
    profile = with_topology(profile, topology)
    if kernels:
        by_len: dict[int, list[KernelMeasurement]] = {}
        for m in kernels:
            by_len.setdefault(m.test.seq_len, []).append(m)
        values = []
        peak = prior.peak_flops(dtype)
        for n, ms in sorted(by_len.items()):
            eff = sum(m.flops for m in ms) / (peak * sum(m.seconds for m in ms))
            if eff > 1.0:
                notes.append(
                    f"measured kernel efficiency {eff:.2f} at L/R={n} exceeds the prior's peak: "
                    f"clipped to 1 (the peak of the prior is too low)"
                )
            values.append(min(1.0, eff))
        curve = EfficiencyCurve(
            tuple(sorted(by_len)),
            tuple(values),
            f"measured by cpbench probe {stamp}: {family}, causal, {phase}, median call (max over "
            f"the ranks computing at once); efficiency = causal attention FLOPs (2*B*h*n^2*d_h forward, "
            f"x3.5 fwd+bwd) / (peak x time)",
        )
        profile = with_curve(profile, family, curve)
    profile = replace(
        profile,
        name=name or f"{prior.name}-probe",
        description=f"{prior.description} (links and kernel measured by cpbench probe {stamp})",
        origin="probe",
    )
    return profile, notes
