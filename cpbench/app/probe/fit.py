"""What a probe measured, in nccl-tests terms, and the link lines fitted to it (`fit_links`).

The fit and the tier a measurement is attributed to: docs/probe.md, "The fit and the profile"."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cpbench.app.probe.plan import CommTest, KernelTest
from cpbench.model.calibrate import solve_relative
from cpbench.model.calibrate.stats import rms
from cpbench.model.formulas import CollectiveKind
from cpbench.model.hardware.profile import HardwareProfile, TierKind
from cpbench.model.topology import all_to_all_time, place, ring_hop_time


@dataclass(frozen=True)
class CommMeasurement:
    """One timed collective, in nccl-tests terms."""

    test: CommTest
    seconds: float
    """Time per call: median over repetitions of the max over ranks."""
    repetitions: int
    algbw: float
    """size / time, bytes/s."""
    busbw: float
    """algbw x busbw_factor ((n-1)/n all-to-all, 1 send/recv), bytes/s."""
    tier: str
    """The topology tier it is attributed to (the highest its collective crosses)."""


@dataclass(frozen=True)
class LinkFit:
    """The least-squares line of one tier and collective kind."""

    tier: str
    """Topology tier kind (the node's one island on a flat profile)."""
    level: int
    """Index of the tier in the profile's node tiers (innermost 0)."""
    kind: CollectiveKind
    latency_s: float
    """Fitted latency (intercept), seconds."""
    busbw: float
    """Fitted busbw (1 / slope), bytes/s."""
    prior_latency_s: float
    prior_busbw: float
    points: int
    residual: float
    """RMS relative error of the line on its points."""
    sizes: tuple[int, int]
    """Smallest and largest size fitted (bytes)."""


@dataclass(frozen=True)
class KernelMeasurement:
    """One timed kernel shape."""

    test: KernelTest
    seconds: float
    """Median time of one call (max over the computing ranks)."""
    repetitions: int
    flops: float
    """FLOPs of one call (`cpbench.model.flops` convention, causal)."""
    efficiency: float
    """flops / (peak x seconds), against the prior's peak of the dtype."""

    @property
    def tflops(self) -> float:
        """Achieved TFLOP/s (1e12 FLOP/s)."""
        return self.flops / self.seconds / 1e12


def attribution(prior: HardwareProfile, test: CommTest) -> tuple[int, str, float]:
    """(tier index, tier kind, effective bytes): the highest tier the collective crosses in
    the ulysses_low placement and the bytes per device across it, so that the time on it is
    latency + effective bytes / busbw (`cpbench.model.topology`)."""
    placement = place(test.ulysses, test.ring, prior, prior.devices_per_node)
    if test.kind == "all_to_all":
        t = all_to_all_time(placement, test.bytes_sent)
    else:
        t = ring_hop_time(placement, test.bytes_sent)
    top = len(t.levels) - 1
    level = placement.tiers[top]
    return top, tier_kind(prior, top), t.levels[top].seconds * level.cost(test.kind).busbw


def tier_kind(prior: HardwareProfile, level: int) -> TierKind:
    """The kind of a node tier as the written profile names it: a flat CPU node's one
    island is a NUMA node (the local ranks share one memory)."""
    if prior.topology is None and prior.device_kind == "cpu":
        return "numa_node"
    return prior.node_tiers()[level].kind


def fit_links(
    prior: HardwareProfile, measurements: Sequence[tuple[CommTest, float]]
) -> tuple[LinkFit, ...]:
    """One line per (tier, kind): time = latency + bytes / busbw, least squares on relative
    residuals (`solve_relative`, the calibration's solver), unknowns scaled by the prior."""
    groups: dict[tuple[int, str, CollectiveKind], list[tuple[CommTest, float, float]]] = {}
    for test, seconds in measurements:
        level, kind_name, effective = attribution(prior, test)
        groups.setdefault((level, kind_name, test.kind), []).append((test, effective, seconds))
    fits = []
    tiers = prior.node_tiers()
    for (level, tier_name, kind), rows in sorted(groups.items()):
        old = tiers[level].cost(kind)
        design = np.array([[1.0, effective] for _, effective, _ in rows])
        target = np.array([seconds for *_, seconds in rows])
        prior_x = np.array([max(old.latency_s, 1e-7), 1.0 / old.busbw])
        latency, inverse = solve_relative(design, target, prior_x)
        residual = rms(
            [(float(design[i] @ [latency, inverse]) - t) / t for i, t in enumerate(target)]
        )
        sizes = [t.size_bytes for t, _, _ in rows]
        fits.append(
            LinkFit(
                tier_name, level, kind, float(latency), float(1.0 / inverse), old.latency_s,
                old.busbw, len(rows), residual, (min(sizes), max(sizes)),
            )  # fmt: skip
        )
    return tuple(fits)
