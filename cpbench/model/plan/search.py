"""The plan search: every TP x CP (U x R, layout) x PP x DP x recompute, ranked by step time.

The three steps, the bound and the ranking key: docs/plan.md, "Search". Pure Python."""

from __future__ import annotations

import functools
import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from cpbench.config.bench import factorizations
from cpbench.config.block_counts import CountingTooCostly, counting_budget
from cpbench.config.constraints import AttentionShape, check_mesh, seq_divisor
from cpbench.config.problem import MeshCandidate
from cpbench.config.vocabulary import Pass
from cpbench.errors import CpbenchError
from cpbench.model.cost.prediction import Prediction, predict
from cpbench.model.cost.work import merge_bytes
from cpbench.model.flops import flops_per_pair, mask_pairs, phase_factor
from cpbench.model.hardware.network import Fabric
from cpbench.model.hardware.profile import HardwareProfile
from cpbench.model.plan.framework import FrameworkAttention, framework_attention, linear_speedup
from cpbench.model.plan.memory import (
    RECOMPUTES,
    Parallelism,
    Recompute,
    StageMemory,
    attention_buffer_bytes,
    fits_margin,
    peak_stage,
    plan_memory,
)
from cpbench.model.plan.options import PlanOptions
from cpbench.model.plan.step import MatmulEfficiency, StepTime, step_time_of_layer
from cpbench.model.plan.transformer import ModelSpec
from cpbench.model.topology import PlanTiers, attention_profile, plan_tiers
from cpbench.units import GIB

MAX_SEQ_LEN = 2**40
"""Bisection ceiling of the longest sequence."""
PLAN_LAYOUTS: tuple[str, ...] = ("zigzag", "striped", "contiguous")
"""Ring layouts a plan compares (one causal sequence per sample), in order of preference among
equal attention times: zigzag first (Megatron and torchtitan run it)."""
RANK_DIGITS = 4
"""Significant digits of the step time in the ranking (then memory, then enumeration order)."""


def rank_seconds(seconds: float) -> float:
    """A step time as the ranking compares it: `RANK_DIGITS` significant digits."""
    return float(f"{seconds:.{RANK_DIGITS}g}")


@dataclass(frozen=True)
class Plan:
    """A feasible plan: layout, attention prediction, memory and step time."""

    par: Parallelism
    """TP x CP x PP x DP, recompute, ZeRO."""
    attention: Prediction
    """One layer's attention for one micro-batch."""
    stages: tuple[StageMemory, ...]
    """Memory of the stages that can set the peak."""
    time: StepTime
    """Step time by part."""
    max_seq_len: int
    """Longest L (a multiple of the mesh's divisor) this plan holds in memory."""
    tiers: PlanTiers | None = None
    """The tier and link each group's collectives cross."""
    max_seq_len_safe: int = 0
    """Longest L whose tensors stay within SAFE_MEMORY_FRACTION of the device memory."""

    @property
    def peak(self) -> StageMemory:
        """The stage of the largest total."""
        return peak_stage(self.stages)


@dataclass(frozen=True)
class PlanRejection:
    """A plan that cannot run, with the rule or the overflowing component."""

    label: str
    """`TP t CP UxR PP p DP d` (or the part of it the rule is about), with the recompute."""
    kind: str
    """tp, pp, batch, mesh, framework or memory."""
    rule: str
    """The rule with the numbers."""
    total_bytes: float | None = None
    """Peak bytes per rank (memory rejections)."""
    max_seq_len: int | None = None
    """Longest L it would hold (memory rejections)."""


@dataclass(frozen=True)
class SearchSpace(PlanOptions):
    """What one search ranges over and prices with: the options plus the resolved model,
    profile and GPUs (`cpbench.app.plan` fills it from a request)."""

    model: ModelSpec
    profile: HardwareProfile
    gpus: int
    """GPUs in total."""
    gpus_per_node: int
    """GPUs per node."""
    seq_len: int
    """L: tokens per sequence."""
    global_batch: int
    """Sequences per optimizer step."""
    efficiency: MatmulEfficiency
    """GEMM efficiency."""
    reserve_bytes: float = 0.0
    """Runtime reserve per GPU."""
    fabric: Fabric | None = None
    """How the nodes are wired (None: the profile's inter-node link, no rails or domains)."""
    documents: tuple[int, ...] | None = None
    """Lengths of the documents packed into every sequence (summing to `seq_len`; None: one
    causal sequence): attention is priced under their document mask."""

    @property
    def attention(self) -> FrameworkAttention:
        """The framework's attention."""
        return framework_attention(self.framework)

    @property
    def factor(self) -> float:
        """The attention factor used."""
        return self.attention_factor if self.attention_factor is not None else self.attention.factor

    @property
    def linear_speedup(self) -> float:
        """GEMM rate of the linears over bf16."""
        return linear_speedup(self.linears)

    @property
    def scores_materialised(self) -> bool:
        """Whether the attention kernel stores the scores (einsum)."""
        return self.profile.kernel_for(self.kernel, self.dtype) == "einsum"

    @property
    def recomputes(self) -> tuple[Recompute, ...]:
        """The recompute levels searched."""
        if self.recompute is not None:
            return (self.recompute,)
        return RECOMPUTES if self.scores_materialised else ("none", "full")

    @property
    def prunes(self) -> bool:
        """Whether plans that cannot rank are left unpriced."""
        return self.keep > 0 and not self.exhaustive


@dataclass
class SearchCounts:
    """How many plans each step saw (what the streamed ranking counts instead of keeping)."""

    enumerated: int = 0
    """Plans (TP, CP, PP, U x R, recompute) with a feasible mesh."""
    rejected_by_rule: int = 0
    """Factorisations a rule rejects (TP, PP, batch, mesh)."""
    rejected_by_memory: int = 0
    """Plans over the device memory."""
    feasible: int = 0
    """Plans that fit (priced or not)."""
    priced: int = 0
    """Plans whose step was priced."""
    meshes_priced: int = 0
    """(TP, U, R) attention predictions run (3 layouts each at most)."""

    @property
    def pruned(self) -> int:
        """Plans that fit but were not priced: their bound could not rank."""
        return self.feasible - self.priced


@dataclass(frozen=True)
class SearchResult:
    """The ranked plans and the rejections kept."""

    feasible: tuple[Plan, ...]
    """The best `keep` plans (every one with keep = 0), fastest first."""
    shortest_cp: Plan | None
    """The fastest plan of the smallest CP that fits."""
    rejected: tuple[PlanRejection, ...]
    """Rule rejections (every one) and the memory rejections closest to fitting."""
    counts: SearchCounts


class _Mesh:
    """One (TP, U, R) mesh: its feasible layouts, buffers, attention bound and (priced on
    demand) its fastest layout."""

    def __init__(self, space: SearchSpace, tp: int, ulysses: int, ring: int) -> None:
        m = space.model
        self.space, self.tp, self.ulysses, self.ring = space, tp, ulysses, ring
        self.shape = AttentionShape(space.seq_len, m.heads // tp, m.kv_heads // tp, m.head_dim,
                                    space.micro_batch)
        impl = space.attention
        layouts = impl.layouts if ring > 1 else impl.layouts[:1]
        kernel = space.kernel if space.kernel != "auto" else impl.kernel
        self.candidates: list[MeshCandidate] = []
        self.reason, self.kind = "", "mesh"
        if ulysses > 1 and not impl.ulysses or ring > 1 and not impl.ring:
            axis = f"Ulysses (U = {ulysses})" if ulysses > 1 and not impl.ulysses else (
                f"a ring (R = {ring})")
            self.reason, self.kind = f"{impl.framework} cannot run {axis}", "framework"
            layouts = ()
        for layout in layouts:
            feasibility = check_mesh(self.shape, ulysses, ring, layout)
            if not feasibility.ok:
                self.reason = self.reason or (feasibility.reason or "infeasible")
                continue
            self.candidates.append(MeshCandidate.for_shape(
                self.shape, ulysses=ulysses, ring=ring, layout=layout, dtype=space.dtype,
                kernel=kernel, cp_comm=impl.cp_comm if ring > 1 else "p2p",
                documents=space.documents,
            ))
        self.buffers = {c.layout: attention_buffer_bytes(c) for c in self.candidates}

    @property
    def ok(self) -> bool:
        """Whether any layout is feasible."""
        return bool(self.candidates)

    @property
    def smallest(self) -> tuple[str, int]:
        """The layout of the fewest buffer bytes (the first among equals) and its bytes."""
        layout = min(self.buffers, key=lambda k: (self.buffers[k], _layout_rank(k)))
        return layout, self.buffers[layout]

    @functools.cached_property
    def bound_s(self) -> tuple[float, float]:
        """Lower bounds of one layer's attention forward and backward seconds (min over the
        feasible layouts; docs/plan.md, step 3)."""
        profile = self.space.profile
        return (min(_phase_bound(c, profile, "forward") for c in self.candidates),
                min(_phase_bound(c, profile, "backward") for c in self.candidates))

    @property
    def is_priced(self) -> bool:
        """Whether `priced` has run (a cached_property keeps its value in the instance)."""
        return "priced" in self.__dict__

    @functools.cached_property
    def priced(self) -> tuple[Prediction, int] | None:
        """The fastest layout's prediction (zigzag first among 4-digit ties) and its buffers;
        None when packed documents make every layout's exact counts over the counting budget
        (`reason` says so)."""
        if not self.candidates:
            raise CpbenchError(f"no feasible layout to price: {self.reason}")
        s = self.space
        profile, per_node = attention_profile(s.profile, s.gpus_per_node, self.tp, self.ulysses,
                                              self.ring, s.fabric)
        predictions = []
        for c in self.candidates:
            try:
                with counting_budget():
                    predictions.append(predict(c, profile, per_node, rank_stride=self.tp))
            except CountingTooCostly as refused:
                self.reason = f"{c.layout} {refused.rule}"
        if not predictions:
            return None
        best = min(predictions,
                   key=lambda p: (rank_seconds(p.step_s), _layout_rank(p.candidate.layout)))
        return best, self.buffers[best.candidate.layout]


def _layout_rank(layout: str) -> int:
    return PLAN_LAYOUTS.index(layout) if layout in PLAN_LAYOUTS else len(PLAN_LAYOUTS)


def _phase_bound(candidate: MeshCandidate, profile: HardwareProfile, phase: Pass) -> float:
    """The balanced compute of one phase: the layer's attention FLOPs / ranks at the kernel
    efficiency of the ring shard, plus the overhead and fp32 merges of every ring step; the
    cost model's phase time is at least this (docs/plan.md, "Search")."""
    family = profile.kernel_for(candidate.kernel, candidate.dtype)
    curve = profile.curve(family if profile.has_curve(family) else profile.default_kernel)
    rate = profile.peak_flops(candidate.dtype) * curve.at(candidate.ring_shard)
    shape = AttentionShape(candidate.seq_len, candidate.heads, candidate.kv_heads,
                           candidate.head_dim, candidate.batch)
    # the mask's pairs (L^2 / 2 for one causal sequence, less under packed documents): the
    # cost model's ranks compute at least these (exact counts, padding included) between them
    pairs = mask_pairs(candidate.mask, candidate.seq_len)
    flops = float(flops_per_pair(shape, 1) * pairs * phase_factor(phase)) / candidate.world
    steps = candidate.ring_steps
    # merge_bytes is the same at every step from 1 on (step 0 of the forward merges nothing)
    merges = merge_bytes(candidate, phase, 0) + (steps - 1) * merge_bytes(candidate, phase, 1)
    return flops / rate + steps * profile.step_overhead_s + merges / profile.memory_bandwidth


def _divisors(n: int, only: int | None = None) -> list[int]:
    """The divisors of `n` (only `only`, when given and one of them)."""
    return [k for k in range(1, n + 1) if n % k == 0 and only in (None, k)]


def tp_rule(model: ModelSpec, tp: int, per_node: int) -> str | None:
    """Why a TP size cannot run, or None."""
    if tp > per_node or per_node % tp:
        return (f"TP {tp} must divide the {per_node} GPUs of a node: tensor parallelism stays "
                f"inside a node (its collectives run on every layer)")
    if model.heads % tp or model.kv_heads % tp:
        return (f"TP {tp} must divide heads ({model.heads}) and KV heads ({model.kv_heads}): "
                f"each TP rank gets heads / TP of each")
    return None


_Over = tuple[Parallelism, StageMemory, float]
"""A memory rejection kept: the plan, its busiest stage and its attention buffers per token."""


@dataclass(order=True)
class _Ranked:
    """A priced plan in the ranking heap (key: time, memory, enumeration order)."""

    key: tuple[float, float, int]
    plan: Plan = field(compare=False)


class PlanSearch:
    """One search's state: the space, the mesh cache, the heaps and the counts."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        self.capacity = space.profile.memory_bytes
        self.counts = SearchCounts()
        self._meshes: dict[tuple[int, int, int], _Mesh] = {}
        self.unpriced: list[PlanRejection] = []
        """Plans that fit but whose mesh's packed documents are over the counting budget."""

    def mesh(self, tp: int, ulysses: int, ring: int) -> _Mesh:
        """The cached mesh of (TP, U, R)."""
        key = (tp, ulysses, ring)
        if key not in self._meshes:
            self._meshes[key] = _Mesh(self.space, tp, ulysses, ring)
        return self._meshes[key]

    def memory(self, par: Parallelism, seq_len: int, buffers_per_token: float
               ) -> tuple[StageMemory, ...]:
        """The stages of a plan at `seq_len` with the attention buffers scaled to it."""
        s = self.space
        return plan_memory(s.model, par, seq_len, buffers_per_token * seq_len, s.dtype,
                           s.scores_materialised, s.reserve_bytes)

    def fits(self, stages: tuple[StageMemory, ...], margin: str | None = None) -> bool:
        """Whether the busiest stage fits under the space's margin (or `margin`)."""
        return fits_margin(peak_stage(stages), self.capacity, margin or self.space.memory_margin)

    def step_time(self, par: Parallelism, forward_s: float, backward_s: float,
                  tiers: PlanTiers | None = None) -> StepTime:
        """The step of a plan whose layer's attention the cost model prices at `forward_s` and
        `backward_s` (times the framework's factor)."""
        s = self.space
        tiers = tiers or plan_tiers(par, s.profile, s.gpus_per_node, s.fabric)
        return step_time_of_layer(s.model, par, s.seq_len, forward_s * s.factor,
                                  backward_s * s.factor, s.profile, s.gpus_per_node, s.dtype,
                                  s.efficiency, s.linear_speedup, tiers, s.documents)

    def max_seq_len(self, par: Parallelism, buffers_per_token: float,
                    margin: str | None = None) -> int:
        """Longest L, a multiple of the mesh's divisor, whose peak fits the margin
        (bisection)."""
        q = seq_divisor(par.ulysses, par.ring, par.layout)

        def fits(k: int) -> bool:
            return self.fits(self.memory(par, k * q, buffers_per_token), margin)

        if not fits(1):
            return 0
        lo, hi = 1, 2
        while fits(hi) and hi * q < MAX_SEQ_LEN:
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo * q

    # ---------------------------------------------------------------------- enumeration

    def _factorisations(self, rejected: list[PlanRejection]
                        ) -> Iterator[tuple[int, int, int, int, int]]:
        """(tp, cp, pp, dp, micro-batches) of every factorisation the rules allow."""
        s, model = self.space, self.space.model
        for tp in _divisors(s.gpus, s.tp):
            rule = tp_rule(model, tp, s.gpus_per_node)
            if rule:
                rejected.append(PlanRejection(f"TP {tp}", "tp", rule))
                continue
            for cp in _divisors(s.gpus // tp, s.cp):
                for pp in _divisors(s.gpus // (tp * cp), s.pp):
                    dp = s.gpus // (tp * cp * pp)
                    label = f"TP {tp} CP {cp} PP {pp} DP {dp}"
                    if model.layers % pp and not (s.uneven_pp and pp <= model.layers):
                        rejected.append(PlanRejection(
                            label, "pp",
                            f"PP {pp} must divide the {model.layers} layers (layers / PP per "
                            f"stage)",
                        ))
                        continue
                    per_step = dp * s.micro_batch
                    if s.global_batch % per_step:
                        rejected.append(PlanRejection(
                            label, "batch",
                            f"global batch ({s.global_batch}) must be a multiple of DP {dp} x "
                            f"micro-batch {s.micro_batch} = {per_step}",
                        ))
                        continue
                    yield tp, cp, pp, dp, s.global_batch // per_step

    def _memory_rejection(self, par: Parallelism, peak: StageMemory, per_token: float
                          ) -> PlanRejection:
        big = peak.largest
        stage = "" if peak.stage == "only" else f" on the {peak.stage} pipeline stage"
        longest = self.max_seq_len(par, per_token)
        return PlanRejection(
            f"{par.label()} {par.recompute}", "memory",
            f"{big.name} {big.bytes / GIB:.1f} GiB of {self.capacity / GIB:.1f} GiB "
            f"(total {peak.total / GIB:.1f} GiB{stage}) at CP {par.cp} with {par.recompute} "
            f"recompute; it holds L <= {longest}",
            peak.total, longest,
        )

    # --------------------------------------------------------------------------- search

    def run(self) -> SearchResult:
        """Enumerate, reject by memory, bound, price best-first (docs/plan.md, "Search")."""
        s, counts = self.space, self.counts
        rules: list[PlanRejection] = []
        over: list[tuple[tuple[float, int], _Over]] = []  # memory rejections kept
        queue: list[tuple[float, int, Parallelism]] = []  # (bound key, order, plan)
        order = 0
        smallest_cp: int | None = None
        for tp, cp, pp, dp, micro_batches in self._factorisations(rules):
            for ulysses, ring in factorizations(cp):
                mesh = self.mesh(tp, ulysses, ring)
                if not mesh.ok:
                    rules.append(PlanRejection(f"TP {tp} CP {ulysses}x{ring} PP {pp} DP {dp}",
                                               mesh.kind, mesh.reason))
                    continue
                layout, buffers = mesh.smallest
                per_token = buffers / s.seq_len
                for recompute in s.recomputes:
                    order += 1
                    counts.enumerated += 1
                    par = Parallelism(tp, ulysses, ring, pp, dp, s.micro_batch, micro_batches,
                                      recompute, s.zero, layout,
                                      uneven_stages=s.uneven_pp and bool(s.model.layers % pp))
                    stages = self.memory(par, s.seq_len, per_token)
                    peak = peak_stage(stages)
                    if not self.fits(stages):
                        counts.rejected_by_memory += 1
                        _keep_smallest(over, s.keep, (-peak.total, -order), (par, peak, per_token))
                        continue
                    counts.feasible += 1
                    smallest_cp = cp if smallest_cp is None else min(smallest_cp, cp)
                    bound = self.step_time(par, *mesh.bound_s)
                    key = rank_seconds(bound.total_s)
                    if s.rank_by == "max_seq_len":  # longest first: a negative length leads
                        key = -float(self.max_seq_len(par, per_token, "safe"))
                    queue.append((key, order, par))
        ranked, shortest = self._price(queue, smallest_cp, over)
        rules += self.unpriced
        counts.rejected_by_rule = len(rules)
        plans = tuple(self._finish(r.plan) for r in sorted(ranked))
        shortest_plan = None
        if shortest is not None:
            shortest_plan = next((p for p in plans if p.par == shortest.plan.par), None)
            shortest_plan = shortest_plan or self._finish(shortest.plan)
        closest_first = sorted(over, key=lambda kept: kept[0], reverse=True)
        memory = tuple(self._memory_rejection(*rejected) for _, rejected in closest_first)
        return SearchResult(plans, shortest_plan, tuple(rules) + memory, counts)

    def _price(self, queue: list[tuple[float, int, Parallelism]], smallest_cp: int | None,
               over: list[tuple[tuple[float, int], _Over]]
               ) -> tuple[list[_Ranked], _Ranked | None]:
        """Price best-first; returns the ranked heap (negated keys) and the best plan of the
        smallest CP."""
        s, counts = self.space, self.counts
        heapq.heapify(queue)
        worst: list[tuple[tuple[float, float, int], _Ranked]] = []  # max-heap of the top k
        shortest: _Ranked | None = None
        keep = s.keep if s.prunes else 0
        while queue:
            bound_key, order, par = heapq.heappop(queue)
            full = keep and len(worst) >= keep
            kth = -worst[0][0][0] if full else None
            cannot_rank = kth is not None and bound_key > kth
            if cannot_rank and (par.cp != smallest_cp or (
                    shortest is not None and bound_key > shortest.key[0])):
                continue
            mesh = self.mesh(par.tp, par.ulysses, par.ring)
            if not mesh.is_priced:
                counts.meshes_priced += 1
            if mesh.priced is None:  # packed documents too costly to count on this mesh
                counts.feasible -= 1
                self.unpriced.append(PlanRejection(f"{par.label()} {par.recompute}", "mesh",
                                                   mesh.reason))
                continue
            prediction, buffers = mesh.priced
            par = replace(par, layout=prediction.candidate.layout)
            per_token = buffers / s.seq_len
            stages = self.memory(par, s.seq_len, per_token)
            peak = peak_stage(stages)
            if not self.fits(stages):  # a layout of more buffers than the smallest won
                counts.feasible -= 1
                counts.rejected_by_memory += 1
                _keep_smallest(over, s.keep, (-peak.total, -order), (par, peak, per_token))
                continue
            counts.priced += 1
            tiers = plan_tiers(par, s.profile, s.gpus_per_node, s.fabric)
            time = self.step_time(par, prediction.forward.total_s, prediction.backward.total_s,
                                  tiers)
            key = ((rank_seconds(time.total_s), peak.total, order) if s.rank_by == "step"
                   else (bound_key, rank_seconds(time.total_s), order))
            item = _Ranked(key, Plan(par, prediction, stages, time, 0, tiers))
            if par.cp == smallest_cp and (shortest is None or item < shortest):
                shortest = item
            _keep_smallest(worst, keep, _negate(item.key), item)
        return [r for _, r in worst], shortest

    def _finish(self, plan: Plan) -> Plan:
        """The plan with its longest sequences (bisection, for the plans kept only)."""
        per_token = attention_buffer_bytes(plan.attention.candidate) / self.space.seq_len
        return replace(plan, max_seq_len=self.max_seq_len(plan.par, per_token),
                       max_seq_len_safe=self.max_seq_len(plan.par, per_token, "safe"))


def _negate(key: tuple[float, float, int]) -> tuple[float, float, int]:
    return (-key[0], -key[1], -key[2])


def _keep_smallest(heap: list[tuple[Any, Any]], keep: int, negated_key: Any, item: Any) -> None:
    """Keep the `keep` items of the smallest keys (every item when `keep` <= 0): a heap on the
    negated key, whose top is the largest key kept (the latest among equals), replaced by
    anything smaller."""
    if keep <= 0:
        heap.append((negated_key, item))
    elif len(heap) < keep:
        heapq.heappush(heap, (negated_key, item))
    elif negated_key > heap[0][0]:
        heapq.heapreplace(heap, (negated_key, item))


def search(space: SearchSpace) -> SearchResult:
    """Search a space (docs/plan.md, "Search")."""
    return PlanSearch(space).run()
