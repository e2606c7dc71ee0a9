"""Megatron-Core's dynamic-CP scheduler (`--dynamic-context-parallel`, `default_dynamic_cp`:
`next_hdp_group_packing_aware` of megatron/core/datasets/data_schedule_utils.py, branch dev at
d48bd6b) reproduced, its groups priced like cpbench's. docs/dynamic-cp.md. Pure Python."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from cpbench.errors import CpbenchError
from cpbench.model.dynamic.schedule import (
    GroupedMicroBatch,
    GroupScheme,
    PolicyPlan,
    SequenceCosts,
    priced_group,
)

CAP_DELTA = 0.05
"""`_DYNAMIC_CP_WORKLOAD_CAP_DELTA`: a micro-batch's rank load may reach 1.05 x its tallest
sequence x the tokens per rank."""
MEGATRON_SCHEME: GroupScheme = "ring"
"""What Megatron's CP groups run here: TransformerEngine's p2p ring over THD (each sequence
split over all of the group's ranks)."""


def megatron_degree(length: int, tokens_per_rank: int, min_cp: int = 1) -> int:
    """`dcp_gpus_needed`: the next power of two of s / C (at least 1), at least min_cp."""
    return max(min_cp, 1 << max(0, math.ceil(math.log2(length / tokens_per_rank))))


@dataclass
class _Batch:
    """One micro-batch being built: per rank its sequence ids and load (s^2 / cp summed); per
    group (in creation order) its ranks, degree and tokens per rank."""

    world: int
    ids: list[list[int]] = field(init=False)
    load: list[float] = field(init=False)
    lengths: list[list[int]] = field(init=False)
    groups: list[list[int]] = field(default_factory=list)
    degree: list[int] = field(default_factory=list)
    packed: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ids = [[] for _ in range(self.world)]
        self.load = [0.0] * self.world
        self.lengths = [[] for _ in range(self.world)]

    def free(self) -> list[int]:
        owned = {r for g in self.groups for r in g}
        return [r for r in range(self.world) if r not in owned]

    def place(self, group: int, sequence: int, length: int) -> None:
        c = self.degree[group]
        self.packed[group] += length / c
        for r in self.groups[group]:
            self.ids[r].append(sequence)
            self.lengths[r].append(length)
            self.load[r] += length * length / c

    def open(self, ranks: list[int], degree: int) -> int:
        self.groups.append(ranks)
        self.degree.append(degree)
        self.packed.append(0.0)
        return len(self.groups) - 1

    def expand_once(self) -> bool:
        """Double the first smallest group that can widen into the empty tail (its load now
        s^2 / 2c), the later groups shifted right: `fill_empty_gpus_once`."""
        empty = [r for r in range(self.world) if not self.lengths[r]]
        smallest = min(self.degree)
        wider = min(2 * smallest, self.world)
        extra = wider - smallest
        for g, ranks in enumerate(self.groups):
            start, end = ranks[0], ranks[-1]
            if self.degree[g] != smallest or end + 1 > empty[0] or end + extra >= self.world:
                continue
            if empty[0] - 1 + extra >= self.world:  # the later groups would shift past the end
                raise CpbenchError(
                    f"Megatron's rule cannot schedule this batch on {self.world} ranks: "
                    f"widening a group of {smallest} to {wider} moves the groups after it past "
                    f"the last rank (fill_empty_gpus_once indexes past the world there; it "
                    f"does not happen on a power-of-two world)"
                )
            moved = range(end + 1, empty[0])  # later groups' ranks, shifted by `extra`
            shifted = [(self.ids[r], self.lengths[r], self.load[r]) for r in moved]
            for r in range(start, end + extra + 1):
                self.ids[r], self.lengths[r] = list(self.ids[end]), list(self.lengths[end])
                self.load[r] = sum(s * s / wider for s in self.lengths[end])
            for k, (ids, lengths, load) in enumerate(shifted):
                r = end + extra + 1 + k
                self.ids[r], self.lengths[r], self.load[r] = ids, lengths, load
            self.degree[g] = wider
            self.groups = [
                list(range(start, end + extra + 1)) if h == g
                else [r + extra for r in other] if other[0] > end else other
                for h, other in enumerate(self.groups)
            ]  # fmt: skip
            return True
        return False


def _next_micro_batch(
    items: list[tuple[int, int]], world: int, tokens_per_rank: int, min_cp: int
) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """One micro-batch of (id, length) items sorted longest first: (ids per rank, leftovers)."""
    tall = items[0][1]
    cap = tall * tokens_per_rank * (1 + CAP_DELTA)
    batch = _Batch(world)
    first_degree = megatron_degree(tall, tokens_per_rank, min_cp)
    if first_degree > world:
        raise CpbenchError(
            f"Megatron's rule gives a sequence of {tall:,} tokens CP {first_degree} (the power "
            f"of two of {tall:,} / {tokens_per_rank:,}), more than the {world} ranks"
        )
    batch.place(batch.open(list(range(first_degree)), first_degree), *items[0])
    of_degree: dict[int, list[int]] = {first_degree: [0]}  # group indices in creation order

    def joinable(g: int) -> float:
        """The longest sequence group g still takes (its tokens and the cap)."""
        c = batch.degree[g]
        return min((tokens_per_rank - batch.packed[g]) * c,
                   math.sqrt(max(0.0, cap - batch.load[batch.groups[g][0]]) * c))  # fmt: skip

    takes = [joinable(0)]
    leftovers = []
    free, longest_joinable = batch.free(), math.inf
    peak_now = max(batch.load)
    for sequence, length in items[1:]:
        if not free and length > longest_joinable + 1:  # no group has room for it: a leftover
            leftovers.append((sequence, length))
            continue
        best: tuple[float, int | None, list[int] | None, int] | None = None
        c = megatron_degree(length, tokens_per_rank, min_cp)
        # the peak rank load after a placement: Megatron takes the max over every rank; a
        # group's ranks hold one list (one load), so it is max(the peak now, theirs + cost)
        while c <= world:
            cost = length * length / c
            for g in of_degree.get(c, ()):  # join a group of exactly this degree
                if batch.packed[g] + length / c > tokens_per_rank:
                    continue
                peak = max(peak_now, batch.load[batch.groups[g][0]] + cost)
                if peak <= cap and (best is None or peak < best[0]):
                    best = (peak, g, None, c)
            # or open one on the lowest-loaded free ranks: every free rank's load is 0 (no
            # sequence yet), so Megatron's stable sort by load keeps them in rank order
            if len(free) >= c:
                peak = max(peak_now, cost)
                if peak <= cap and (best is None or peak < best[0]):
                    best = (peak, None, free[:c], c)
            c *= 2
        if best is None:
            leftovers.append((sequence, length))
            continue
        _, group, new_ranks, c = best
        if group is None:
            group = batch.open(new_ranks or [], c)
            of_degree.setdefault(c, []).append(group)
            takes.append(0.0)
            free = batch.free()
        batch.place(group, sequence, length)
        takes[group] = joinable(group)
        peak_now = max(peak_now, batch.load[batch.groups[group][0]])
        if not free:  # the longest sequence any group still takes
            longest_joinable = max(takes)
    while any(not lengths for lengths in batch.lengths):
        if not batch.expand_once():  # no group can widen: the whole world, greedily
            chosen_ids, rest, per_rank = [], [], 0.0
            for sequence, length in items:
                if per_rank + length / world <= tokens_per_rank:
                    chosen_ids.append(sequence)
                    per_rank += length / world
                else:
                    rest.append((sequence, length))
            return [list(chosen_ids) for _ in range(world)], rest
    return batch.ids, leftovers


def megatron_schedule(
    lengths: Sequence[int], world: int, tokens_per_rank: int, min_cp: int = 1
) -> list[list[list[int]]]:
    """Megatron's schedule: per micro-batch, per DPxCP rank, the sequence ids it packs (a CP
    group is a run of consecutive ranks with the same list). Without VPP alignment."""
    items = sorted(enumerate(lengths), key=lambda item: item[1], reverse=True)  # stable
    schedule = []
    while items:
        ids, items = _next_micro_batch(items, world, tokens_per_rank, min_cp)
        schedule.append(ids)
    return schedule


def megatron_plan(costs: SequenceCosts) -> PolicyPlan:
    """The schedule's groups (runs of ranks with one list) priced as rings of their degree."""
    w = costs.problem
    micro_batches = [
        GroupedMicroBatch(tuple(
            priced_group(costs, len(list(run)), MEGATRON_SCHEME, ids)
            for ids, run in itertools.groupby(ranks)
        ))
        for ranks in megatron_schedule(w.lengths, w.world, w.tokens_per_rank)
    ]  # fmt: skip
    return PolicyPlan("megatron", tuple(micro_batches), w.world)
