"""A batch of whole sequences scheduled into micro-batches of CP groups, priced on a profile:
the types, the pack pricing (`SequenceCosts`), static CP and cpbench's scheduler.
docs/dynamic-cp.md. Pure Python."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Literal, get_args

import numpy as np

from cpbench.config.problem import MeshCandidate
from cpbench.config.vocabulary import PASSES, Dtype
from cpbench.errors import CpbenchError
from cpbench.model.cost.prediction import predict
from cpbench.model.cost.work import extra_calls
from cpbench.model.hardware.profile import HardwareProfile

Policy = Literal["static", "megatron", "cpbench"]
POLICIES: tuple[Policy, ...] = get_args(Policy)
GroupScheme = Literal["ring", "ulysses", "allgather"]
"""What a group of g ranks runs: a zigzag ring (1 x g, p2p), Ulysses (g x 1) or the all-gather
ring (1 x g)."""
GROUP_SCHEMES: tuple[GroupScheme, ...] = get_args(GroupScheme)
GRID_POINTS = 24
"""Lengths at which a degree's sequence time is predicted (geometric from the smallest padded
length to the longest sequence); between them it is interpolated linearly."""


@dataclass(frozen=True)
class DynamicProblem:
    """What is scheduled: the batch, the machine's ranks and the per-rank token budget."""

    lengths: tuple[int, ...]
    """Sequence lengths of one global batch (whole sequences)."""
    world: int
    """W: ranks the batch is spread over (data x context parallel)."""
    tokens_per_rank: int
    """C: the most tokens a rank holds in one micro-batch (Megatron's
    --max-seqlen-per-dp-cp-rank): a sequence of s tokens needs ceil(s / C) ranks."""
    heads: int
    """Query heads of the attention layer."""
    kv_heads: int
    """Key/value heads (GQA when fewer than heads)."""
    head_dim: int
    """Channels per head."""
    dtype: Dtype = "bfloat16"
    """Element type of the attention."""
    static_cp: int | None = None
    """The static policy's CP degree (None: `static_degree` picks it)."""

    def __post_init__(self) -> None:
        if not self.lengths:
            raise CpbenchError("the batch holds no sequence")
        if self.world < 1 or self.tokens_per_rank < 1:
            raise CpbenchError(
                f"world ({self.world}) and tokens per rank ({self.tokens_per_rank}) must be >= 1"
            )
        longest = max(self.lengths)
        if longest > self.world * self.tokens_per_rank:
            raise CpbenchError(
                f"a sequence of {longest:,} tokens needs ceil({longest:,} / "
                f"{self.tokens_per_rank:,}) = {self.min_degree(longest):,} ranks of "
                f"{self.tokens_per_rank:,} tokens, more than the {self.world:,} there are"
            )
        if self.static_cp is not None and (
            self.static_cp < 1 or self.world % self.static_cp
            or self.static_cp * self.tokens_per_rank < longest
        ):  # fmt: skip
            raise CpbenchError(
                f"static CP ({self.static_cp}) must divide the world ({self.world}) and hold "
                f"the longest sequence: {self.static_cp} x {self.tokens_per_rank:,} tokens >= "
                f"{longest:,}"
            )

    def min_degree(self, length: int) -> int:
        """The fewest ranks that hold a sequence: ceil(s / C)."""
        return -(-length // self.tokens_per_rank)

    @property
    def static_degree(self) -> int:
        """The static policy's CP: `static_cp`, else the least power of two that holds the
        longest sequence and divides the world, else the least divisor of the world that
        holds it (a world that is no power of two)."""
        if self.static_cp is not None:
            return self.static_cp
        least = self.min_degree(max(self.lengths))
        divisors = [d for d in range(least, self.world + 1) if self.world % d == 0]
        powers = [d for d in divisors if d & (d - 1) == 0]
        return (powers or divisors)[0]


@dataclass(frozen=True)
class CpGroup:
    """g ranks running a pack of whole sequences as one packed sequence."""

    degree: int
    scheme: GroupScheme
    sequences: tuple[int, ...]
    """Indices into the problem's lengths."""
    tokens: int
    predicted_s: float
    """Predicted seconds of the pack's attention step (fwd+bwd, one layer)."""


@dataclass(frozen=True)
class GroupedMicroBatch:
    """One micro-batch: the ranks split into groups; it lasts as long as its slowest group."""

    groups: tuple[CpGroup, ...]

    @property
    def time_s(self) -> float:
        return max(g.predicted_s for g in self.groups)

    @property
    def ranks(self) -> int:
        return sum(g.degree for g in self.groups)


@dataclass(frozen=True)
class PolicyPlan:
    """A policy's schedule of the batch and its predicted step."""

    policy: Policy
    micro_batches: tuple[GroupedMicroBatch, ...]
    world: int

    @property
    def step_s(self) -> float:
        """Predicted attention seconds of the step: the micro-batches in turn, each its
        slowest group."""
        return sum(mb.time_s for mb in self.micro_batches)

    @property
    def busy_share(self) -> float:
        """Rank-seconds of work / (W x step): 1 - the ranks' idle share."""
        busy = sum(g.degree * g.predicted_s for mb in self.micro_batches for g in mb.groups)
        return busy / (self.world * self.step_s) if self.step_s > 0 else 1.0

    @property
    def degrees(self) -> dict[int, int]:
        """Sequences per CP degree."""
        counts = Counter(
            g.degree for mb in self.micro_batches for g in mb.groups for _ in g.sequences
        )
        return dict(sorted(counts.items()))


@dataclass
class SequenceCosts:
    """Predicted seconds of one sequence alone on g ranks under a scheme, from `predict` at
    `GRID_POINTS` lengths per (degree, scheme), interpolated. A pack's time is the sum of its
    sequences' times less the fixed part (step overheads and latencies, `fixed`) paid once
    per pack rather than once per sequence: exact for the model's compute (additive over
    documents under a document-balanced layout) and its overheads, approximate where a
    pack's steps mix compute-bound and bandwidth-bound documents (docs/dynamic-cp.md gives
    the measured error against `predict` of whole packs)."""

    problem: DynamicProblem
    profile: HardwareProfile
    _grids: dict[tuple[int, str], tuple[list[int], list[float]]] = field(default_factory=dict)
    _by_sequence: dict[tuple[int, str], np.ndarray] = field(default_factory=dict)
    _fixed: dict[tuple[int, str], float] = field(default_factory=dict)

    def _problem(self, degree: int, scheme: GroupScheme, length: int) -> MeshCandidate:
        w = self.problem
        mesh = {"ulysses": (degree, 1), "ring": (1, degree), "allgather": (1, degree)}[scheme]
        return MeshCandidate(
            seq_len=length, heads=w.heads, kv_heads=w.kv_heads, head_dim=w.head_dim,
            dtype=w.dtype, ulysses=mesh[0], ring=mesh[1],
            layout="contiguous" if scheme == "ulysses" or degree == 1 else "zigzag",
            cp_comm="all_gather" if scheme == "allgather" else "p2p",
        )  # fmt: skip

    def runs(self, degree: int, scheme: GroupScheme) -> bool:
        """Whether the scheme runs at this degree (Ulysses needs the heads to split)."""
        if degree == 1:
            return scheme == "ring"
        try:
            self._problem(degree, scheme, self.padded(degree, scheme, 2 * degree)).require_feasible()
        except CpbenchError:
            return False
        return True

    @staticmethod
    def padded(degree: int, scheme: GroupScheme, length: int) -> int:
        """The length a sequence runs at: a multiple of g (Ulysses) or 2g (a zigzag ring)."""
        unit = degree if scheme == "ulysses" else 2 * degree
        return -(-length // unit) * unit if degree > 1 else length

    def _grid(self, degree: int, scheme: GroupScheme) -> tuple[list[int], list[float]]:
        key = (degree, scheme)
        if key not in self._grids:
            low = self.padded(degree, scheme, 1)
            high = max(self.padded(degree, scheme, max(self.problem.lengths)), low)
            ratio = (high / low) ** (1 / (GRID_POINTS - 1)) if high > low else 1.0
            points = sorted({self.padded(degree, scheme, round(low * ratio**i))
                             for i in range(GRID_POINTS)} | {low, high})  # fmt: skip
            # where ranks share compute slots (CPU cores), the other groups of the micro-batch
            # run beside this one: priced as spread over the whole world (rank stride W / g)
            shared = self.profile.compute_slots_per_node is not None
            stride = max(1, self.problem.world // degree) if shared else 1
            times = [predict(self._problem(degree, scheme, s), self.profile, rank_stride=stride,
                             memory=False).step_s for s in points]  # fmt: skip
            self._grids[key] = (points, times)
        return self._grids[key]

    def times(self, degree: int, scheme: GroupScheme) -> np.ndarray:
        """Seconds of each of the problem's sequences alone on the group (by index)."""
        key = (degree, scheme)
        if key not in self._by_sequence:
            points, times = self._grid(degree, scheme)
            padded = np.asarray([self.padded(degree, scheme, s) for s in self.problem.lengths],
                                dtype=np.float64)
            self._by_sequence[key] = np.interp(padded, points, times)
        return self._by_sequence[key]

    def fixed(self, degree: int, scheme: GroupScheme) -> float:
        """The part of a sequence's time a pack pays once: the shortest sequence's time, less
        what each further sequence adds in kernel calls (`call_s`)."""
        if (degree, scheme) not in self._fixed:
            shortest = self._grid(degree, scheme)[1][0]
            self._fixed[degree, scheme] = shortest - self.call_s(degree, scheme)
        return self._fixed[degree, scheme]

    def call_s(self, degree: int, scheme: GroupScheme) -> float:
        """Seconds (fwd+bwd) one more sequence adds to a pack in kernel calls: the calls a
        third document adds to a group's schedule of two (`work.extra_calls`, each document
        cut over all g ranks; one document alone runs coalesced calls) at the profile's call
        overhead, x ranks / slots where ranks share compute slots and the mean rank's calls
        set the step."""
        if not self.profile.call_overhead_s:
            return 0.0
        unit = 8 * self.padded(degree, scheme, 1)
        totals = []
        for n in (2, 3):
            pack = self._problem(degree, scheme, n * unit)
            layout = "doc_zigzag" if pack.layout == "zigzag" else pack.layout
            calls = extra_calls(replace(pack, layout=layout, documents=(unit,) * n))
            totals.append((sum(b for b, _ in calls), sum(m for _, m in calls)))
        busiest, mean = totals[1][0] - totals[0][0], totals[1][1] - totals[0][1]
        slots = self.profile.compute_slots_per_node
        share = 1.0
        if slots is not None:
            share = max(1.0, min(self.profile.devices_per_node, self.problem.world) / slots)
        return len(PASSES) * max(busiest, share * mean) * self.profile.call_overhead_s


def priced_group(costs: SequenceCosts, degree: int, scheme: GroupScheme, ids: Sequence[int]) -> CpGroup:
    """The sequences `ids` as one group: its tokens and its pack's price (`SequenceCosts`)."""
    fixed = costs.fixed(degree, scheme)
    seconds = fixed + float((costs.times(degree, scheme)[list(ids)] - fixed).sum())
    tokens = sum(costs.problem.lengths[i] for i in ids)
    return CpGroup(degree, scheme, tuple(ids), tokens, seconds)


# ----------------------------------------------------------------------------- static CP


def static_packs(lengths: Sequence[int], capacity: int, dp: int) -> list[list[int]]:
    """Megatron's DpBalancedScheduler: the sequences in their order packed first-fit into packs
    of at most `capacity` tokens; while the packs are no multiple of dp, the last sequence of
    the last pack holding more than one becomes a pack of its own."""
    packs: list[list[int]] = [[]]
    held = 0
    for i, s in enumerate(lengths):
        if packs[-1] and held + s > capacity:
            packs.append([])
            held = 0
        packs[-1].append(i)
        held += s
    last = len(packs) - 1
    while len(packs) % dp:
        while last >= 0 and len(packs[last]) <= 1:
            last -= 1
        if last < 0:
            raise CpbenchError(
                f"static CP: {len(lengths)} sequence(s) cannot fill a multiple of dp ({dp}) "
                f"packs (Megatron's dp_balanced asserts there); a larger --static-cp leaves "
                f"fewer data-parallel packs to fill"
            )
        packs.append([packs[last].pop()])
    return packs


def static_plan(costs: SequenceCosts) -> PolicyPlan:
    """Static CP (Megatron's DpBalancedScheduler, one degree for every pack, `static_packs`),
    the packs dealt dp = W / cp to a micro-batch, each pack on a zigzag ring of cp ranks
    (TransformerEngine's THD layout: every sequence split over all cp ranks)."""
    w = costs.problem
    cp = w.static_degree
    dp = w.world // cp
    packs = static_packs(w.lengths, cp * w.tokens_per_rank, dp)
    micro_batches = [
        GroupedMicroBatch(tuple(priced_group(costs, cp, "ring", p) for p in packs[i : i + dp]))
        for i in range(0, len(packs), dp)
    ]
    return PolicyPlan("static", tuple(micro_batches), w.world)


# ----------------------------------------------------------------------------- cpbench


def _schemes(costs: SequenceCosts, degree: int) -> tuple[GroupScheme, ...]:
    return tuple(s for s in GROUP_SCHEMES if costs.runs(degree, s))


@cache
def _degree_candidates(minimum: int, world: int) -> tuple[int, ...]:
    """Degrees the scheduler tries for a micro-batch's longest sequence: its minimum and the
    next two (any integer, not only powers of two), twice and four times it, and the next
    power of two, those the world holds; 1 and 2 for one that fits a rank."""
    if minimum == 1:  # a micro-batch of sequences that each fit one rank: CP 1 or 2
        return tuple(d for d in (1, 2) if d <= world)
    power = 1 << (minimum - 1).bit_length()
    tried = {minimum, minimum + 1, minimum + 2, 2 * minimum, 4 * minimum, power}
    return tuple(sorted(d for d in tried if d <= world))


@dataclass
class _Tables:
    """The scheduler's arrays over sequence ids: lengths, minimum degrees, and per degree (made
    when first asked for) the schemes that run there and each sequence's seconds under each."""

    costs: SequenceCosts
    lengths: np.ndarray = field(init=False)
    min_degree: np.ndarray = field(init=False)
    _best: dict[int, tuple[list[GroupScheme], np.ndarray]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.lengths = np.asarray(self.costs.problem.lengths, dtype=np.int64)
        self.min_degree = -(-self.lengths // self.costs.problem.tokens_per_rank)

    def at(self, degree: int) -> tuple[list[GroupScheme], np.ndarray]:
        """(the schemes that run at `degree`, seconds [scheme, sequence])."""
        if degree not in self._best:
            schemes = list(_schemes(self.costs, degree))
            self._best[degree] = (
                schemes, np.stack([self.costs.times(degree, s) for s in schemes]))
        return self._best[degree]

    def best_scheme(self, degree: int, sequence: int) -> GroupScheme:
        schemes, seconds = self.at(degree)
        return schemes[int(np.argmin(seconds[:, sequence]))]

    def own_seconds(self) -> np.ndarray:
        """Each sequence's seconds alone at its minimum degree, fastest scheme."""
        out = np.empty(len(self.lengths))
        for degree in np.unique(self.min_degree):
            mine = self.min_degree == degree
            out[mine] = self.at(int(degree))[1][:, mine].min(axis=0)
        return out


OPENER_DEGREES = 3
"""`_fill` tries a group at its opener's minimum degree and the next ones, this many in all:
one more rank holds C more tokens, which can turn a group that memory fills before time into
one that works the whole micro-batch."""


TOKEN_BOUND = 0.9
"""A group holding more than this share of its ranks' tokens and ending before this share of
the micro-batch is memory-bound: `_fill` tries it wider."""


@dataclass
class _Pool:
    """The sequences `_fill` may still place, by length ascending: their ids, lengths and
    seconds alone at their minimum degree, and which are still free (a sequence leaves by its
    position; no array is rebuilt)."""

    ids: np.ndarray
    lengths: np.ndarray
    own: np.ndarray
    free: np.ndarray
    _extra: dict[tuple[int, str], np.ndarray] = field(default_factory=dict)

    @classmethod
    def of(cls, tables: _Tables, own: np.ndarray, ids: np.ndarray) -> _Pool:
        return cls(ids, tables.lengths[ids], own[ids], np.ones(len(ids), dtype=bool))

    def extra(self, costs: SequenceCosts, degree: int, scheme: GroupScheme) -> np.ndarray:
        """Seconds each sequence adds to a pack on (degree, scheme): its time less `fixed`."""
        key = (degree, scheme)
        if key not in self._extra:
            seconds = costs.times(degree, scheme)[self.ids]
            self._extra[key] = seconds - costs.fixed(degree, scheme)
        return self._extra[key]

    def left(self) -> np.ndarray:
        return self.ids[self.free]


def _pack(
    costs: SequenceCosts, tables: _Tables, pool: _Pool, opener: int, degree: int,
    budget_s: float,
) -> tuple[CpGroup, list[int]]:  # fmt: skip
    """A group of `degree` ranks opened by the pool's sequence at position `opener` and filled
    with the longest free ones that still fit in tokens and in time (first fit decreasing);
    the positions it took."""
    first = int(pool.ids[opener])
    scheme = tables.best_scheme(degree, first)
    extra = pool.extra(costs, degree, scheme)
    capacity = degree * costs.problem.tokens_per_rank
    # the opener pays its whole time, each further sequence its extra seconds
    spent = float(extra[opener]) + costs.fixed(degree, scheme)
    taken, held = [opener], int(pool.lengths[opener])
    free = pool.free.copy()
    free[opener] = False
    end = len(free)
    while True:
        room = (
            free[:end] & (pool.lengths[:end] <= capacity - held) & (extra[:end] <= budget_s - spent)
        )
        fits = np.flatnonzero(room)
        if not len(fits):
            break
        j = int(fits[-1])
        taken.append(j)
        free[j] = False
        held += int(pool.lengths[j])
        spent += float(extra[j])
        if extra[j] >= 0:  # the room only shrank: nothing longer than j fits any more
            end = j
    group = priced_group(costs, degree, scheme, [int(pool.ids[j]) for j in taken])
    return group, taken


def _fill(
    costs: SequenceCosts, tables: _Tables, own: np.ndarray, work: np.ndarray, ids: np.ndarray,
    budget_s: float, free: int,
) -> tuple[list[CpGroup], np.ndarray]:  # fmt: skip
    """Groups of the `free` ranks, each opened by the longest sequence that fits the ranks at
    its minimum degree within `budget_s`, at that degree or, where memory bounds the group
    (`TOKEN_BOUND`), the one of `OPENER_DEGREES` from it whose group does the most single-rank
    work (`work`) per rank (`_pack`); `ids` by length ascending, what is left is returned."""
    capacity = costs.problem.tokens_per_rank
    pool = _Pool.of(tables, own, ids)
    groups: list[CpGroup] = []
    end = len(ids)
    while free > 0:
        fits = np.flatnonzero(pool.free[:end] & (pool.lengths[:end] <= free * capacity) & (
            pool.own[:end] <= budget_s))  # fmt: skip
        if not len(fits):
            break
        opener = end = int(fits[-1])  # fewer free ranks: no longer sequence opens one now
        first = int(ids[opener])
        lowest = int(tables.min_degree[first])
        group, taken = _pack(costs, tables, pool, opener, lowest, budget_s)
        best = (float(work[list(group.sequences)].sum()) / lowest, group, taken)
        # memory full before time: a rank more may hold work for the rest of the micro-batch
        if group.tokens > TOKEN_BOUND * lowest * capacity and group.predicted_s < (
            TOKEN_BOUND * budget_s
        ):
            for degree in range(lowest + 1, min(lowest + OPENER_DEGREES, free + 1)):
                group, taken = _pack(costs, tables, pool, opener, degree, budget_s)
                per_rank = float(work[list(group.sequences)].sum()) / degree
                if group.predicted_s <= budget_s and per_rank > best[0]:
                    best = (per_rank, group, taken)
        groups.append(best[1])
        pool.free[best[2]] = False
        free -= best[1].degree
    return groups, pool.left()


WIDEN_LIMIT = 4
"""`_widen` widens a group to at most this many times its longest sequence's minimum degree."""


def _widen(costs: SequenceCosts, groups: list[CpGroup], free: int) -> list[CpGroup]:
    """The micro-batch's idle ranks given, one at a time, to its slowest group while that
    shortens it (any degree, its fastest scheme there): a micro-batch lasts as long as its
    slowest group, and a rank left idle shortens nothing."""
    w = costs.problem
    groups = list(groups)
    while free > 0:
        slowest = max(range(len(groups)), key=lambda i: groups[i].predicted_s)
        group = groups[slowest]
        degree = group.degree + 1
        longest = max(w.lengths[i] for i in group.sequences)
        if degree > WIDEN_LIMIT * w.min_degree(longest):
            break
        wider = fastest_group(costs, degree, group.sequences)
        if wider.predicted_s >= group.predicted_s:
            break
        groups[slowest] = wider
        free -= 1
    return groups


def greedy_plan(costs: SequenceCosts) -> PolicyPlan:
    """cpbench's greedy scheduler: each micro-batch is paced by its longest remaining sequence, at the
    degree (any integer from its minimum) that completes the most single-rank work per second
    of the micro-batch once the other ranks are filled (`_fill`) with groups that end within
    that time and the ranks still idle widen its slowest groups (`_widen`); each group runs
    the scheme the model prices fastest for it. docs/dynamic-cp.md says why and what it
    costs."""
    w = costs.problem
    tables = _Tables(costs)
    own = tables.own_seconds()
    work = costs.times(1, "ring")  # single-rank seconds: what a micro-batch completes
    pool = np.argsort(tables.lengths, kind="stable")
    micro_batches: list[GroupedMicroBatch] = []
    while len(pool):
        lead_id = int(pool[-1])
        best: tuple[float, list[CpGroup], np.ndarray] | None = None
        for degree in _degree_candidates(int(tables.min_degree[lead_id]), w.world):
            scheme = tables.best_scheme(degree, lead_id)
            lead = priced_group(costs, degree, scheme, [lead_id])
            groups, left = _fill(costs, tables, own, work, pool[:-1], lead.predicted_s,
                                 w.world - degree)  # fmt: skip
            groups = [lead, *groups]
            groups = _widen(costs, groups, w.world - sum(g.degree for g in groups))
            done = [i for g in groups for i in g.sequences]
            rate = float(work[done].sum()) / max(g.predicted_s for g in groups)
            if best is None or rate > best[0]:
                best = (rate, groups, left)
        assert best is not None  # the minimum degree always runs (Workload checks it fits)
        micro_batches.append(GroupedMicroBatch(tuple(best[1])))
        pool = best[2]
    return PolicyPlan("cpbench", tuple(micro_batches), w.world)


def fastest_group(costs: SequenceCosts, degree: int, ids: Sequence[int]) -> CpGroup:
    """The sequences `ids` as one group of `degree` ranks on the scheme priced fastest there."""
    options = [priced_group(costs, degree, s, ids) for s in _schemes(costs, degree)]
    return min(options, key=lambda g: g.predicted_s)


def reschemed(costs: SequenceCosts, plan: PolicyPlan) -> PolicyPlan:
    """A plan's schedule with each group on the scheme the model prices fastest at its degree
    (Megatron's groups all run the p2p ring), as cpbench's."""
    return PolicyPlan("cpbench", tuple(
        GroupedMicroBatch(tuple(fastest_group(costs, g.degree, g.sequences) for g in mb.groups))
        for mb in plan.micro_batches
    ), plan.world)  # fmt: skip
