"""The fast paths that let `recommend` answer at any scale (issue 39) give the answers of the
exact computations they replace, on many small cases.

- `ring_step_pairs` (closed form) equals the matrix of `chunk_pairs` (the range arithmetic it
  replaced), exactly (Fractions), for every global layout, causal and full, R up to 16;
- a `LayoutWork`'s aggregates (total, busiest rank, imbalance, overhead, own pairs, per-step
  busiest / mean) equal what the old code derived from the full step matrix: exactly for the
  Fractions, and exactly for the floats too (imbalance: the ranks' float pairs sum to the
  exact total, every partial sum a half-integer below 2^53), for every layout, causal and
  full, with documents and windows;
- `placement` equals the O(U*R) scan it replaced;
- `predict` of every candidate (every layout, p2p and all-gather, documents, windows, a GPU
  and a CPU profile, whose shared compute slots read the per-step means) equals, float for
  float, a prediction priced through the old path: the work as a full step matrix, the
  per-step stats from it, the placement by the scan.
"""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Any

import pytest

from cpbench.config import geometry
from cpbench.config.constraints import AttentionShape, check_mesh
from cpbench.config.masks import MaskSpec
from cpbench.config.problem import MeshCandidate
from cpbench.config.vocabulary import GLOBAL_LAYOUTS, LAYOUTS
from cpbench.errors import CpbenchError
from cpbench.model.cost import prediction, schemes, work
from cpbench.model.flops import (
    LayoutWork,
    imbalance,
    layout_work,
    ring_step_pairs,
)
from cpbench.model.formulas import comm_volume
from cpbench.model.hardware.loading import load_profile
from cpbench.model.topology import Placement, placement
from tests.flops_reference import chunk_pairs
from tests.geometry_reference import balance_score, balanced_shards

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

H100 = load_profile("h100-sxm")
CPU = load_profile("cpu-local")
RINGS = (1, 2, 3, 4, 5, 6, 8, 12, 16)


def chunk_matrix(seq_len: int, ring: int, layout: str, causal: bool) -> Any:
    return tuple(
        tuple(chunk_pairs(seq_len, ring, layout, j, (j - s) % ring, causal) for j in range(ring))
        for s in range(ring)
    )


@pytest.mark.parametrize("layout", GLOBAL_LAYOUTS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("ring", RINGS)
def test_ring_step_pairs_equals_the_chunk_pairs_matrix(
    layout: str, causal: bool, ring: int
) -> None:
    for seq_len in (2 * ring, 2 * ring * 3, 2 * ring * 7):
        assert ring_step_pairs(seq_len, ring, layout, causal) == chunk_matrix(
            seq_len, ring, layout, causal
        )


def old_aggregates(w: LayoutWork, steps: Any) -> dict[str, Any]:
    """What the old LayoutWork computed from its step matrix."""
    ring = w.ring
    ranks = tuple(sum((step[j] for step in steps), Fraction(0)) for j in range(ring))
    total = sum(ranks, Fraction(0))
    useful = total if w.mask_total is None else w.mask_total
    return {
        "steps": len(steps),
        "ring_rank_pairs": ranks,
        "total": total,
        "imbalance": imbalance([float(p) for p in ranks]),
        "overhead": float(max(ranks) / (useful / ring)) if useful else 1.0,
        "slowest_ring_rank": ranks.index(max(ranks)),
        "max_ring_rank_pairs": max(ranks),
        "own_pairs": tuple(steps[0][j] if steps else Fraction(0) for j in range(ring)),
        "step_max_pairs": tuple(max(step) for step in steps),
        "step_mean_pairs": tuple(sum(step, Fraction(0)) / ring for step in steps),
        "busiest_step_sum": sum((max(step) for step in steps), Fraction(0)),
        "padding_fraction": float((total - useful) / useful) if useful else 0.0,
    }


def new_aggregates(w: LayoutWork) -> dict[str, Any]:
    return {
        "steps": w.steps,
        "ring_rank_pairs": w.ring_rank_pairs,
        "total": w.total,
        "imbalance": w.imbalance,
        "overhead": w.overhead,
        "slowest_ring_rank": w.slowest_ring_rank,
        "max_ring_rank_pairs": w.max_ring_rank_pairs,
        "own_pairs": tuple(w.own_pairs(j) for j in range(w.ring)),
        "step_max_pairs": w.step_max_pairs,
        "step_mean_pairs": tuple(mean for _, mean in w.step_stats),
        "busiest_step_sum": w.busiest_step_sum,
        "padding_fraction": w.padding_fraction,
    }


MASKS: tuple[dict[str, Any], ...] = (
    {"causal": True},
    {"causal": False},
    {"causal": True, "window": 5},
    {"causal": True, "documents": "docs"},
    {"causal": True, "documents": "docs", "window": 3},
)


def documents_for(seq_len: int) -> tuple[int, ...]:
    """Uneven documents filling `seq_len` (lengths 1, 5, 2, 9, ... cut at the end)."""
    docs, total = [], 0
    for length in itertools.cycle((1, 5, 2, 9, 17, 3)):
        if total >= seq_len:
            break
        docs.append(min(length, seq_len - total))
        total += docs[-1]
    return tuple(docs)


def candidate(
    seq_len: int, ulysses: int, ring: int, layout: str, mask: dict[str, Any], **more: Any
) -> MeshCandidate:
    fields = dict(mask)
    if fields.get("documents") == "docs":
        fields["documents"] = documents_for(seq_len)
    return MeshCandidate(
        seq_len=seq_len,
        batch=1,
        heads=4,
        kv_heads=2,
        head_dim=64,
        ulysses=ulysses,
        ring=ring,
        layout=layout,
        **fields,
        **more,
    )


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mask", MASKS, ids=lambda m: "-".join(f"{k}={v}" for k, v in m.items()))
@pytest.mark.parametrize("ring", RINGS)
def test_layout_work_aggregates_equal_the_step_matrix(
    layout: str, mask: dict[str, Any], ring: int
) -> None:
    checked = 0
    for seq_len, ulysses in ((4 * ring * 6, 1), (4 * ring * 6, 2), (4 * ring * 5, 4)):
        try:
            w = layout_work(candidate(seq_len, ulysses, ring, layout, mask))
        except CpbenchError:
            continue
        steps = chunk_matrix(seq_len, ring, layout, w.causal) if w.plain else w.step_pairs
        if w.plain:
            assert w.step_pairs == steps
        assert new_aggregates(w) == old_aggregates(w, steps)
        checked += 1
    assert checked


def scan_placement(ulysses: int, ring: int, per_node: int, stride: int = 1) -> Placement:
    """The O(U * R) scan `placement` replaced."""

    def node(cp_rank: int) -> int:
        return cp_rank * stride // per_node

    peers = ulysses
    for j in range(ring):
        nodes = [node(j * ulysses + u) for u in range(ulysses)]
        peers = min(peers, min(nodes.count(n) for n in set(nodes)))
    crossing = 0
    if ring > 1:
        for u in range(ulysses):
            hops = sum(
                node(j * ulysses + u) != node(((j + 1) % ring) * ulysses + u) for j in range(ring)
            )
            crossing = max(crossing, hops)
    return Placement(
        ulysses, ring, per_node, stride, node(ulysses * ring - 1) - node(0) + 1,
        "intra_node" if peers == ulysses else "inter_node", peers,
        "inter_node" if crossing else "intra_node", crossing,
    )  # fmt: skip


def test_placement_equals_the_scan() -> None:
    for ulysses, ring, per_node, stride in itertools.product(
        (1, 2, 3, 4, 6, 8, 16), (1, 2, 3, 4, 5, 8, 12, 32), (1, 2, 3, 4, 6, 8, 16), (1, 2, 3, 4)
    ):
        assert placement(ulysses, ring, per_node, stride) == scan_placement(
            ulysses, ring, per_node, stride
        ), (ulysses, ring, per_node, stride)


def matrix_work(config: Any) -> LayoutWork:
    """The old path: every work a full step matrix (the plain ones from chunk_pairs)."""
    w = layout_work(config)
    if not w.plain:
        return w
    steps = chunk_matrix(w.seq_len, w.ring, w.layout, w.causal)
    return LayoutWork(w.seq_len, w.ulysses, w.ring, w.layout, w.causal, steps, w.mask)


def matrix_step_stats(config: Any) -> Any:
    steps = matrix_work(config).step_pairs
    return tuple((max(step), sum(step, Fraction(0)) / config.ring) for step in steps)


def slow_step_flops(config: Any, phase: Any) -> Any:
    per_pair = schemes.flops_per_pair(config.shape, config.ulysses) * schemes._phase_factor(phase)
    return tuple(
        (float(busiest * per_pair), float(mean * per_pair))
        for busiest, mean in matrix_step_stats(config)
    )


def slow_merges(ctx: Any, phase: Any) -> list[float]:
    c = ctx.config
    bandwidth = ctx.profile.memory_bandwidth
    return [work.merge_bytes(c, phase, s) / bandwidth for s in range(c.ring_steps)]


def slow_step_costs(ctx: Any, phase: Any, merges: list[float]) -> list[Any]:
    """The per-step loop as it was: one cost per step, each priced."""
    overhead, share = ctx.profile.step_overhead_s, schemes._node_share(ctx)
    per_call = ctx.profile.call_overhead_s
    rate = schemes.pass_flops_per_s(ctx, phase)
    flops = schemes._step_flops(ctx.config, phase)
    calls = work.extra_calls(ctx.config) or ((0, 0.0),) * len(flops)
    costs = []
    for (busiest_flops, mean_flops), merge, (busiest_calls, mean_calls) in zip(
        flops, merges, calls, strict=True
    ):
        alone = busiest_flops / rate + overhead + merge + busiest_calls * per_call
        shared = share * (mean_flops / rate + overhead + merge + mean_calls * per_call)
        if share > 1 and shared > alone:
            costs.append(
                schemes._StepCost(
                    shared, share * mean_flops, share, share * merge, share * mean_calls
                )
            )
        else:
            costs.append(schemes._StepCost(alone, busiest_flops, 1.0, merge, busiest_calls))
    return costs


def slow_ring_time(ctx: Any, phase: Any, computes: list[float]) -> Any:
    """The ring loop as it was: every hop timed."""
    k = ctx.config.ring_steps
    if ctx.config.ring == 1 or k == 1:
        return computes[0], 0.0, 0.0, ()
    per_call = {c.name: c.bytes_per_call for c in ctx.volume.collectives(phase)}
    kv, dkv = per_call.get("p2p_kv", 0), per_call.get("p2p_dkv", 0)
    overlap = ctx.profile.overlap
    total = comm = hidden = 0.0
    terms: list[Any] = []
    for s, compute in enumerate(computes):
        in_flight = (kv if s < k - 1 else 0) + (dkv if s >= 2 else 0)
        if in_flight == 0:
            total += compute
            continue
        hop = schemes._hop(ctx, phase, in_flight, terms)
        comm += hop
        hidden += min(compute, hop)
        total += max(compute, hop) + (1 - overlap) * min(compute, hop)
    if dkv:
        home = schemes._hop(ctx, phase, dkv, terms)
        total += home
        comm += home
    return total, comm, hidden, tuple(terms)


CACHED = (
    work.config_work, schemes._step_flops, schemes._mean_rank_flops, work.step_pair_stats,
    placement, comm_volume,
)


def clear_caches() -> None:
    for cached in CACHED:
        cached.cache_clear()


def candidates() -> list[tuple[MeshCandidate, Any, int]]:
    out = []
    shape_heads = AttentionShape(96, 4, 2, 64, 1)
    for ring, ulysses in (
        (1, 1),
        (2, 1),
        (2, 2),
        (3, 1),
        (4, 2),
        (6, 1),
        (8, 1),
        (12, 1),
        (16, 1),
        (4, 4),
    ):
        for layout, mask in itertools.product(LAYOUTS, MASKS):
            for seq_len in (4 * 48, 48 * ring):
                c = candidate(seq_len, ulysses, ring, layout, mask)
                shape = AttentionShape(seq_len, shape_heads.heads, shape_heads.kv_heads, 64, 1)
                if not check_mesh(shape, ulysses, ring, layout).ok:
                    continue
                try:
                    c.require_feasible()
                except CpbenchError:
                    continue
                comms: list[dict[str, Any]] = [{}]
                if ring > 1:
                    comms.append({"cp_comm": "all_gather"})
                for comm in comms:
                    more = candidate(seq_len, ulysses, ring, layout, mask, **comm)
                    out.append((more, H100, 8))
                    out.append((more, CPU, 4))
                break
    return out


def test_predictions_equal_the_old_path(monkeypatch: pytest.MonkeyPatch) -> None:
    cases = candidates()
    assert len(cases) > 300
    clear_caches()
    fast = []
    for config, profile, per_node in cases:
        try:
            fast.append(prediction.predict(config, profile, per_node, memory=False))
        except CpbenchError as exc:
            fast.append(str(exc))  # type: ignore[arg-type]
    monkeypatch.setattr(work, "config_work", matrix_work)
    monkeypatch.setattr(schemes, "config_work", matrix_work)
    monkeypatch.setattr(prediction, "config_work", matrix_work)
    monkeypatch.setattr(schemes, "_step_flops", slow_step_flops)
    monkeypatch.setattr(schemes, "_step_merges", slow_merges)
    monkeypatch.setattr(schemes, "_step_costs", slow_step_costs)
    monkeypatch.setattr(schemes, "_ring_time", slow_ring_time)
    monkeypatch.setattr(prediction, "placement", scan_placement)
    clear_caches()
    slow = []
    for config, profile, per_node in cases:
        try:
            slow.append(prediction.predict(config, profile, per_node, memory=False))
        except CpbenchError as exc:
            slow.append(str(exc))  # type: ignore[arg-type]
    clear_caches()
    for (config, profile, _), a, b in zip(cases, fast, slow, strict=True):
        assert a == b, (config, profile.name)
    assert sum(1 for c, _, _ in cases if c.ring >= 8 and c.layout in GLOBAL_LAYOUTS) > 20


def every_threshold_balanced(mask: Any, seq_len: int, ring: int) -> Any:
    """`_best_balanced` as it was: every threshold built and scored, duplicates included."""
    shard = seq_len // ring
    thresholds = sorted({seq_len + 1, shard, max(shard // 2, 1), max(shard // 4, 1), 2 * ring})
    best = None
    for long_doc in thresholds:
        shards = balanced_shards(mask, seq_len, ring, long_doc)
        schedule = geometry._schedule(mask, shards, ring)
        score = (balance_score(schedule), schedule.steps)
        if best is None or score < best[0]:
            best = (score, shards)
    assert best is not None
    return best[1]


@pytest.mark.parametrize("ring", (2, 3, 4, 8))
def test_balanced_builds_each_distinct_candidate_once(ring: int) -> None:
    for seq_len in (48 * ring, 400 * ring):
        for docs in (
            documents_for(seq_len),
            (seq_len // 2, seq_len // 4, seq_len // 4),
            (1,) * (seq_len - 40 * ring) + (40 * ring,),
        ):
            for window in (None, 7):
                mask = MaskSpec(documents=docs, window=window)
                packing = geometry.pack(mask, seq_len, 1, ring, "balanced")
                assert packing.shards == every_threshold_balanced(mask, seq_len, ring)
