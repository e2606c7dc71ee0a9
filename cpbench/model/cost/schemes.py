"""The time of one phase of a CP attention layer for each scheme, and its linear comm terms.

The formulas: docs/design.md section 2, "The time of one phase". Pure Python."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from fractions import Fraction

from cpbench.config.problem import MeshCandidate
from cpbench.config.vocabulary import PASSES, Pass
from cpbench.model.cost.breakdown import CommTerm, PhaseTime, TierTraffic
from cpbench.model.cost.kernel import kernel_factor
from cpbench.model.cost.work import config_work, extra_calls, mask_step_stats, merge_bytes
from cpbench.model.flops import BACKWARD_FACTOR, flops_per_pair, plain_step_scaled
from cpbench.model.formulas import CollectiveKind, CommVolume
from cpbench.model.hardware.profile import HardwareProfile, LinkTier
from cpbench.model.topology import (
    CollectiveTime,
    Placement,
    TopologyPlacement,
    all_to_all_time,
    ring_gather_time,
    ring_hop_time,
)


@dataclass(frozen=True)
class Context:
    """What every part of one prediction needs."""

    config: MeshCandidate
    profile: HardwareProfile
    placement: Placement
    volume: CommVolume
    flops_per_s: float
    topology: TopologyPlacement | None = None
    kernel: str = ""
    """The kernel family that runs (its head-dim factor, `kernel.kernel_factor`)."""


def pass_flops_per_s(ctx: Context, phase: Pass) -> float:
    """The kernel's FLOP/s in one pass: the curve's (at head dim 128, causal) times the
    head-dim factor of the pass and mask (`cpbench.model.cost.kernel`)."""
    c = ctx.config
    factor = kernel_factor(ctx.kernel, ctx.profile.device_kind, c.head_dim, c.causal, phase)
    return ctx.flops_per_s * factor


def _phase_factor(phase: Pass) -> Fraction:
    return Fraction(1) if phase == "forward" else BACKWARD_FACTOR


def _step_merges(ctx: Context, phase: Pass) -> list[float]:
    """Memory-bound seconds of each ring step of a phase."""
    c = ctx.config
    first, later = (merge_bytes(c, phase, step) / ctx.profile.memory_bandwidth for step in (0, 1))
    return [first] + [later] * (c.ring_steps - 1)


@dataclass(frozen=True)
class _StepCost:
    """What sets one ring step's compute time, in pieces the calibration can refit."""

    seconds: float
    """Step compute time."""
    flops: float
    """FLOPs that set it (busiest rank, or the node's share when ranks share compute slots)."""
    overheads: float
    """Step overheads paid (1, or ranks / slots on a shared node)."""
    memory_s: float
    """Memory-bound seconds in it."""
    calls: float = 0.0
    """Kernel calls beyond one document's paid (`extra_calls`; x ranks / slots as overheads)."""


def _node_share(ctx: Context) -> float:
    """Ranks per compute slot on a node (> 1 only when more ranks than slots, e.g. CPU cores)."""
    slots = ctx.profile.compute_slots_per_node
    if slots is None:
        return 1.0
    ranks = min(ctx.placement.devices_per_node, ctx.config.world * ctx.placement.rank_stride)
    return max(1.0, ranks / slots)


@functools.lru_cache(maxsize=4096)
def _step_flops(config: MeshCandidate, phase: Pass) -> tuple[tuple[float, float], ...]:
    """(busiest rank, mean rank) FLOPs of each ring step of a pass: the exact pair counts
    times the FLOPs per pair, rounded once. Once per configuration and pass: they depend on
    neither the hardware nor the profile, and a calibration prices the same configurations
    thousands of times."""
    per_pair = flops_per_pair(config.shape, config.ulysses) * _phase_factor(phase)
    if config.plain_geometry:
        return plain_step_scaled(
            config.seq_len, config.ring, config.layout, config.causal, per_pair
        )
    num, den = per_pair.numerator, per_pair.denominator
    out: list[tuple[float, float]] = []
    previous: tuple[Fraction, Fraction] | None = None
    for stat in mask_step_stats(config):
        if stat is not previous:  # the closed forms repeat one (busiest, mean) over the steps
            busiest, mean = stat
            # float(x * per_pair), without normalising the product: one correctly rounded
            # division of the same rational
            pair = (
                busiest.numerator * num / (busiest.denominator * den),
                mean.numerator * num / (mean.denominator * den),
            )
            previous = stat
        out.append(pair)
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _mean_rank_flops(config: MeshCandidate, phase: Pass) -> float:
    """FLOPs of the mean rank in a pass: every pair the ranks compute (padding included) over
    the world (once per configuration and pass, as `_step_flops`)."""
    run_pairs = config_work(config).total
    return float(run_pairs * flops_per_pair(config.shape, 1) * _phase_factor(phase)) / config.world


def _step_costs(ctx: Context, phase: Pass, merges: list[float]) -> list[_StepCost]:
    """Compute time of each ring step: the busiest rank's kernel, overhead and memory-bound
    work; on a node with more ranks than compute slots, at least the mean rank's times
    ranks / slots (the slots are shared, so idle ranks lend theirs)."""
    overhead, share = ctx.profile.step_overhead_s, _node_share(ctx)
    per_call = ctx.profile.call_overhead_s
    rate = pass_flops_per_s(ctx, phase)
    flops = _step_flops(ctx.config, phase)
    calls = extra_calls(ctx.config) or ((0, 0.0),) * len(flops)
    costs: list[_StepCost] = []
    previous: tuple[float, ...] | None = None
    for (busiest_flops, mean_flops), merge, (busiest_calls, mean_calls) in zip(
        flops, merges, calls, strict=True
    ):
        # the mean matters only on a shared node; a step like the last costs what it did
        key = (busiest_flops, mean_flops if share > 1 else 0.0, merge, busiest_calls, mean_calls)
        if key == previous:
            costs.append(costs[-1])
            continue
        previous = key
        alone = busiest_flops / rate + overhead + merge + busiest_calls * per_call
        shared = share * (mean_flops / rate + overhead + merge + mean_calls * per_call)
        if share > 1 and shared > alone:
            costs.append(
                _StepCost(shared, share * mean_flops, share, share * merge, share * mean_calls)
            )
        else:
            costs.append(_StepCost(alone, busiest_flops, 1.0, merge, busiest_calls))
    return costs


def phase_time(ctx: Context, phase: Pass) -> tuple[PhaseTime, tuple[CommTerm, ...]]:
    """The breakdown of one phase and the linear pieces of its communication."""
    if ctx.config.all_gather:
        return _gather_phase_time(ctx, phase)
    c = ctx.config
    merges = _step_merges(ctx, phase)
    costs = _step_costs(ctx, phase, merges)
    computes = [cost.seconds for cost in costs]
    ulysses_s, ulysses_terms = _ulysses_time(ctx, phase)
    ring_total, ring_comm, overlappable, ring_terms = _ring_time(ctx, phase, computes)
    slowest = sum(computes)
    balanced = _node_share(ctx) * (
        _mean_rank_flops(c, phase) / pass_flops_per_s(ctx, phase)
        + c.ring_steps * ctx.profile.step_overhead_s
        + sum(merges)
        + sum(mean for _, mean in extra_calls(c)) * ctx.profile.call_overhead_s
    )
    timing = PhaseTime.priced(
        phase, ulysses_s + ring_total, balanced, slowest, ulysses_s, ring_comm,
        sum(cost.memory_s for cost in costs), overlappable, sum(cost.flops for cost in costs),
        sum(cost.overheads for cost in costs), sum(cost.calls for cost in costs),
    )  # fmt: skip
    return timing, ulysses_terms + ring_terms


def _ulysses_time(ctx: Context, phase: Pass) -> tuple[float, tuple[CommTerm, ...]]:
    """Exposed all-to-all time of a phase and its linear pieces."""
    total, terms = 0.0, []
    for collective in ctx.volume.collectives(phase):
        if collective.kind != "all_to_all":
            continue
        seconds, pieces = _all_to_all_call(ctx, phase, collective.bytes_sent)
        total += seconds
        terms.extend(pieces)
    return total, tuple(terms)


def _all_to_all_call(ctx: Context, phase: Pass, bytes_sent: int) -> tuple[float, list[CommTerm]]:
    """One all-to-all call: inside a node, or split between the tiers (the slower part sets
    the time, the inter-node latency is paid once)."""
    place, profile = ctx.placement, ctx.profile
    if ctx.topology is not None:  # the slowest crossed tier of the node topology bounds it
        timed = all_to_all_time(ctx.topology, bytes_sent)
        return timed.seconds, _level_terms(ctx.topology, timed, "all_to_all", phase)
    intra = profile.intra_node
    if place.ulysses_tier == "intra_node":
        term = CommTerm("intra_node", "all_to_all", phase, 1, bytes_sent)
        return intra.all_to_all.seconds(bytes_sent), [term]
    inter = profile.inter_node
    inter_bytes = float(bytes_sent * place.ulysses_inter_fraction)
    intra_bytes = bytes_sent - inter_bytes
    inter_scaled = inter_bytes * inter.devices_per_nic
    intra_s = intra_bytes / intra.all_to_all.busbw
    inter_s = inter_scaled / inter.all_to_all.busbw
    seconds = inter.all_to_all.latency_s + max(intra_s, inter_s)
    if inter_s >= intra_s:
        return seconds, [CommTerm("inter_node", "all_to_all", phase, 1, inter_scaled)]
    return seconds, [
        CommTerm("inter_node", "all_to_all", phase, 1, 0.0),
        CommTerm("intra_node", "all_to_all", phase, 0, intra_bytes),
    ]


def _ring_time(
    ctx: Context, phase: Pass, computes: list[float]
) -> tuple[float, float, float, tuple[CommTerm, ...]]:
    """(ring stage time, serialised hop time, overlappable time, linear pieces)."""
    k = ctx.config.ring_steps
    if ctx.config.ring == 1 or k == 1:
        return computes[0], 0.0, 0.0, ()
    per_call = {c.name: c.bytes_per_call for c in ctx.volume.collectives(phase)}
    kv, dkv = per_call.get("p2p_kv", 0), per_call.get("p2p_dkv", 0)  # zeros without a ring
    total = comm = hidden = 0.0
    terms: list[CommTerm] = []
    hops: dict[int, tuple[float, list[CommTerm]]] = {}  # one hop time per size, not per step
    exposed = 1 - ctx.profile.overlap
    # The next step's K/V, and (from step 2) the dK/dV accumulator posted after step s-1: the
    # own chunk's gradient stays home, so the first accumulator leaves after step 1. Steps
    # 2..k-2 carry the same bytes: one hop size, timed once; a step whose compute repeats the
    # last adds what it added (the same float additions, in the same order).
    bounds = sorted((0, 1, 2, k - 1, k))  # k >= 2: the bytes in flight change at 2 and k - 1
    for first, stop in itertools.pairwise(bounds):
        if first >= stop:
            continue
        in_flight = (kv if first < k - 1 else 0) + (dkv if first >= 2 else 0)
        if in_flight == 0:
            for compute in computes[first:stop]:
                total += compute
            continue
        if in_flight not in hops:
            pieces: list[CommTerm] = []
            hops[in_flight] = (_hop(ctx, phase, in_flight, pieces), pieces)
        hop, pieces = hops[in_flight]
        terms.extend(pieces * (stop - first))
        last, low, step_total = None, 0.0, 0.0
        for compute in computes[first:stop]:
            if compute != last:
                last, low = compute, min(compute, hop)
                step_total = max(compute, hop) + exposed * low
            comm += hop
            hidden += low
            total += step_total
    if dkv:
        home = _hop(ctx, phase, dkv, terms)  # the last dK/dV hop goes home, exposed
        total += home
        comm += home
    return total, comm, hidden, tuple(terms)


def _level_terms(
    placement: TopologyPlacement, timed: CollectiveTime, kind: CollectiveKind, phase: Pass
) -> list[CommTerm]:
    """The linear pieces of one collective on a topology: the latency of the highest level it
    crosses and the bandwidth time of its bounding level (their sum is `timed.seconds`)."""
    if timed.bounding < 0:
        return []
    tier: LinkTier = "inter_node" if timed.crosses_network else "intra_node"

    def term(index: int, messages: int, nbytes: float) -> CommTerm:
        level = placement.tiers[index]
        if level.kind == "network":  # the profile's inter_node link: bytes x NIC sharing
            return CommTerm("inter_node", kind, phase, messages, nbytes * level.devices_per_link)
        return CommTerm(tier, kind, phase, messages, nbytes, level=index)

    top, bound = len(timed.levels) - 1, timed.bounding
    per_device = timed.levels[bound].seconds * placement.tiers[bound].cost(kind).busbw
    return [term(top, 1, 0.0), term(bound, 0, per_device)]


def _hop(ctx: Context, phase: Pass, nbytes: int, terms: list[CommTerm]) -> float:
    """One ring exchange of `nbytes` per rank, its linear pieces added to `terms`: on a topology
    the slowest hop's crossed tier (`topology.ring_hop_time`), else the ring tier's send/recv."""
    if ctx.topology is not None:
        timed = ring_hop_time(ctx.topology, nbytes)
        terms.extend(_level_terms(ctx.topology, timed, "send_recv", phase))
        return timed.seconds
    seconds, term = _ring_tier_call(ctx, "send_recv", phase, nbytes)
    terms.append(term)
    return seconds


def _ring_tier_call(
    ctx: Context, kind: CollectiveKind, phase: Pass, nbytes: int
) -> tuple[float, CommTerm]:
    """One call of `nbytes` per rank on the ring axis' tier (the NIC shared as for the ring): a
    hop on its send/recv cost, an all-gather or reduce-scatter on its all-to-all cost."""
    tier = ctx.placement.ring_tier
    link = ctx.profile.link(tier)
    seconds = link.cost(kind).seconds(nbytes, 1, link.devices_per_nic)
    return seconds, CommTerm(tier, kind, phase, 1, float(nbytes * link.devices_per_nic))


def _gather_call(ctx: Context, phase: Pass, nbytes: int) -> tuple[float, list[CommTerm]]:
    """One all-gather or reduce-scatter of `nbytes` per rank over the ring axis, with its linear
    pieces: on a topology every ring group at once over the levels it crosses
    (`topology.ring_gather_time`), else the ring tier's all-to-all cost."""
    if ctx.topology is not None:
        timed = ring_gather_time(ctx.topology, nbytes)
        return timed.seconds, _level_terms(ctx.topology, timed, "all_to_all", phase)
    seconds, term = _ring_tier_call(ctx, "all_to_all", phase, nbytes)
    return seconds, [term]


def _gather_phase_time(ctx: Context, phase: Pass) -> tuple[PhaseTime, tuple[CommTerm, ...]]:
    """One phase of the all-gather scheme: G strides of equal work, the first gather behind
    the own chunk of stride 0 only, each later gather (and backward each reduce-scatter but
    the last) in flight during a stride's worth of compute, the last reduce-scatter exposed."""
    c, profile = ctx.config, ctx.profile
    work = config_work(c)
    per_pair = float(flops_per_pair(c.shape, c.ulysses) * _phase_factor(phase))
    merges = sum(_step_merges(ctx, phase))
    strides = c.gathers
    overheads = strides * c.ring_steps
    share = _node_share(ctx)
    slowest_pairs = float(work.max_ring_rank_pairs)
    mean_pairs = float(work.total) / c.ring
    rate = pass_flops_per_s(ctx, phase)
    calls = extra_calls(c)
    busiest_calls = sum(b for b, _ in calls)
    mean_calls = sum(m for _, m in calls)
    alone = slowest_pairs * per_pair / rate + overheads * profile.step_overhead_s
    alone += merges + busiest_calls * profile.call_overhead_s
    balanced = share * (mean_pairs * per_pair / rate + overheads * profile.step_overhead_s + merges
                        + mean_calls * profile.call_overhead_s)  # fmt: skip
    shared = share > 1 and balanced > alone
    compute = balanced if shared else alone
    slowest_flops = share * mean_pairs if shared else slowest_pairs
    per_stride = compute / strides
    own_pairs = work.own_pairs(work.slowest_ring_rank)
    own_share = float(own_pairs / work.max_ring_rank_pairs) if own_pairs else 0.0
    own = per_stride * own_share  # the own chunk of stride 0: computed while it is gathered
    named = {c.name: c for c in ctx.volume.collectives(phase)}
    gather_bytes, rs_bytes = (
        named[n].bytes_sent // named[n].calls if n in named else 0 for n in ("ag_kv", "rs_dkv")
    )
    gather_s, gather_terms = _gather_call(ctx, phase, gather_bytes)
    terms = gather_terms * strides
    overlap = profile.overlap
    # the first gather travels while the own chunk of stride 0 is computed on, then waits
    total = max(own, gather_s) + (1 - overlap) * min(own, gather_s)
    comm = gather_s * strides
    hidden = min(own, gather_s)
    rs_s = 0.0
    if rs_bytes:
        rs_s, rs_terms = _gather_call(ctx, phase, rs_bytes)
        terms += rs_terms * strides
        comm += rs_s * strides
    # Forward (allgather.py): stride g + 1's gather is posted after stride g's own chunk and
    # waited for after its own, so it travels behind the rest of stride g and the own chunk of
    # stride g + 1 (one stride); the rest of the last stride has nothing in flight. Backward:
    # stride g (for g = 0 its rest) holds stride g - 1's reduce-scatter, posted after it and
    # waited for after stride g, and stride g + 1's gather.
    short = strides - 1 if phase == "forward" else 0  # the window less the own chunk
    for g in range(strides):
        work_s = per_stride - own if g == short else per_stride
        in_flight = (gather_s if g + 1 < strides else 0.0) + (rs_s if g >= 1 else 0.0)
        if in_flight == 0:
            total += work_s
            continue
        hidden += min(work_s, in_flight)
        total += max(work_s, in_flight) + (1 - overlap) * min(work_s, in_flight)
    total += rs_s  # the last stride's dK/dV goes home exposed
    ulysses_s, ulysses_terms = _ulysses_time(ctx, phase)
    total += ulysses_s
    timing = PhaseTime.priced(
        phase, total, balanced, compute, ulysses_s, comm, merges, hidden,
        slowest_flops * per_pair, float(overheads) * (share if shared else 1.0),
        share * mean_calls if shared else float(busiest_calls),
    )  # fmt: skip
    return timing, ulysses_terms + tuple(terms)


def tier_traffic(ctx: Context) -> tuple[TierTraffic, ...]:
    """Bytes per rank per (tier, kind), forward and backward."""
    place = ctx.placement
    per_phase: dict[tuple[LinkTier, CollectiveKind], list[int]] = {}
    for index, phase in enumerate(PASSES):
        for stage in ctx.volume.stages(phase):
            sent = stage.bytes_sent
            # the all-gather stage is priced on the all-to-all link cost
            kind: CollectiveKind = "send_recv" if stage.stage == "ring" else "all_to_all"
            split: dict[LinkTier, int] = {place.ring_tier: sent}
            if stage.stage == "ulysses":
                inter = int(sent * place.ulysses_inter_fraction)
                split = {"inter_node": inter, "intra_node": sent - inter}
            for tier, value in split.items():
                if value:
                    per_phase.setdefault((tier, kind), [0, 0])[index] += value
    return tuple(
        TierTraffic(tier, kind, fwd, bwd) for (tier, kind), (fwd, bwd) in sorted(per_phase.items())
    )
