"""Why the winner wins, as facts (`cpbench.app.recommend.types.Explanation`)."""

from __future__ import annotations

from collections.abc import Sequence

from cpbench.app.recommend.types import (
    Balance,
    CandidateFacts,
    Explanation,
    GatherFacts,
    LayoutFacts,
    LinkUse,
    MaskFacts,
    RankedCandidate,
    TierBound,
    layout_label,
    rank_key,
)
from cpbench.model.cost.prediction import Prediction
from cpbench.model.formulas import gather_bytes_sent
from cpbench.model.hardware.profile import HardwareProfile
from cpbench.model.memory import memory_estimate


def facts(r: RankedCandidate) -> CandidateFacts:
    """The numbers of `r` an explanation cites."""
    p, t = r.prediction, r.prediction.phase_time
    return CandidateFacts(
        r.label, r.time_s, t.comm_s, t.exposed_comm_s, p.memory_bytes, p.max_seq_len,
        gathered_bytes(p), t.steps,
    )


def explain(
    ranked: Sequence[RankedCandidate], profile: HardwareProfile, tie_break: str = ""
) -> Explanation:
    """The facts of why the winner wins (comm per tier, imbalance, memory, margin; the
    tie-break that picked it among the candidates it ties with)."""
    best = ranked[0]
    p = best.prediction
    c = p.candidate
    others = [r for r in ranked[1:] if _mesh_of(r.prediction) != _mesh_of(p)]
    ties = tuple(
        layout_label(r.prediction)
        for r in ranked[1:]
        if r not in others and rank_key(r)[0] == rank_key(best)[0]
    )
    second = others[0] if others else None
    return Explanation(
        winner=facts(best),
        measured=best.measured_s is not None,
        phase=p.candidate.phase,
        runner_up=facts(second) if second else None,
        margin=second.time_s / best.time_s - 1 if second else None,
        same_mesh_ties=ties,
        all_gather=c.all_gather,
        placement=p.placement,
        links=tuple(
            LinkUse(i.total_bytes, i.kind, profile.link(i.tier).name) for i in p.traffic
        ),
        balance=_balance_of(p),
        layout=c.layout,
        mask_label=c.mask.label,
        work_imbalance=p.work_imbalance,
        imbalance_s=p.phase_time.imbalance_s,
        heads_per_rank=c.heads_per_rank,
        kv_heads_per_rank=c.kv_heads_per_rank,
        kv_replication=c.replication,
        kernel_seq_len=p.kernel_seq_len,
        attention_tflops=p.attention_tflops,
        curve_note=p.curve_note,
        memory_capacity_bytes=p.memory_capacity_bytes,
        mask=mask_facts(ranked),
        gather=gather_facts(ranked),
        tie_break=tie_break,
        bounds=tier_bounds(p, profile),
    )


def tier_bounds(p: Prediction, profile: HardwareProfile) -> tuple[TierBound, ...]:
    """The tiers whose bandwidth prices the prediction's collectives (its comm terms with
    bytes: on a topology the bounding node tier, else the link tier), once per kind and tier."""
    out: dict[tuple[str, str], TierBound] = {}
    for t in p.comm_terms:
        if t.bytes <= 0:
            continue
        if t.level is not None:
            node_tier = profile.node_tiers()[t.level]
            cost = node_tier.cost(t.kind)
            bound = TierBound(t.kind, node_tier.kind, node_tier.name, cost.source)
        else:
            link = profile.link(t.tier)
            bound = TierBound(t.kind, t.tier, link.name, link.cost(t.kind).source)
        out.setdefault((t.kind, bound.tier), bound)
    return tuple(out.values())


def _balance_of(p: Prediction) -> Balance:
    c = p.candidate
    if not p.candidate.causal:
        return "no_mask"
    if c.ring == 1:
        return "ulysses" if c.mask.plain else "ulysses_any_mask"
    if not c.mask.plain:
        return "masked"
    return "balanced" if p.work_imbalance <= 1.01 else "imbalanced"


def _mesh_of(p: Prediction) -> tuple[int, int, bool]:
    return (p.candidate.ulysses, p.candidate.ring, p.candidate.all_gather)


def _p2p_rings(ranked: Sequence[RankedCandidate]) -> list[RankedCandidate]:
    """The candidates whose ring axis passes K/V around the ring (R > 1, no all-gather)."""
    candidates = [(r, r.prediction.candidate) for r in ranked]
    return [r for r, c in candidates if c.ring > 1 and not c.all_gather]


def _layout_facts(p: Prediction) -> LayoutFacts:
    return LayoutFacts(
        p.candidate.layout, p.work_imbalance, p.slowest_ring_rank, p.ring_steps, p.padding,
        p.padding_fraction,
    )


def mask_facts(ranked: Sequence[RankedCandidate]) -> MaskFacts | None:
    """Every layout's work on the fastest ring mesh under a document or window mask
    (imbalance, padding, ring steps); None without such a mask or a ring candidate."""
    mask = ranked[0].prediction.candidate.mask
    rings = _p2p_rings(ranked)
    if mask.plain or not mask.causal or not rings:
        return None
    best = rings[0].prediction
    layouts: dict[str, LayoutFacts] = {}
    for r in rings:
        if _mesh_of(r.prediction) == _mesh_of(best):
            layouts.setdefault(r.prediction.candidate.layout, _layout_facts(r.prediction))
    docs = len(mask.documents) if mask.documents is not None and len(mask.documents) > 1 else 0
    return MaskFacts(
        best.candidate.ulysses, best.candidate.ring, best is ranked[0].prediction,
        facts(rings[0]) if ranked[0].prediction.candidate.ring == 1 else None,
        _layout_facts(best), layouts, docs, mask.window,
    )


def gathered_bytes(p: Prediction) -> int:
    """Bytes of gathered K/V a rank holds in the forward (0 unless the ring axis gathers)."""
    return sum(i.bytes for i in memory_estimate(p.candidate).items if i.name == "kv_gathered")


def gather_facts(ranked: Sequence[RankedCandidate]) -> GatherFacts | None:
    """The all-gather's exposed gathers against the ring's hidden hops and Ulysses, and its
    memory (the gathered K/V); None when no all-gather candidate was ranked."""
    gathers = [r for r in ranked if r.prediction.candidate.all_gather]
    if not gathers:
        return None
    rings = _p2p_rings(ranked)
    ag = gathers[0]
    c = ag.prediction.candidate
    same = [r for r in rings if _mesh_of(r.prediction)[:2] == (c.ulysses, c.ring)]
    pure_ag = [r for r in gathers if r.prediction.candidate.ulysses == 1]
    pure_ring = [r for r in rings if r.prediction.candidate.ulysses == 1]
    strided = sorted(
        (r for r in gathers if r.prediction.candidate.gathers > 1),
        key=lambda r: -r.prediction.candidate.gathers,
    )
    pairs = [
        (facts(st), facts(wh), st.prediction.candidate.gather_stride)
        for st in strided
        for wh in gathers
        if wh.prediction.candidate.gathers == 1
        and _mesh_of(wh.prediction) == _mesh_of(st.prediction)
        and wh.prediction.candidate.layout == st.prediction.candidate.layout
    ]
    ulysses = [r for r in ranked if r.prediction.candidate.ring == 1]
    return GatherFacts(
        best=facts(ag),
        kv_heads_per_rank=c.kv_heads_per_rank,
        received_bytes=gather_bytes_sent(c, "forward"),
        gathers=c.gathers,
        stride=c.gather_stride,
        ring=facts(same[0]) if same else None,
        pure=(
            (facts(pure_ag[0]), facts(pure_ring[0]))
            if pure_ag and pure_ring and c.ulysses > 1
            else None
        ),
        strided=pairs[0] if pairs else None,
        fastest_ulysses=facts(ulysses[0]) if ulysses else None,
    )
