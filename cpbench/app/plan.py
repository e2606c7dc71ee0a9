"""Application service of `cpbench plan`: does a whole model fit at a sequence length on the
GPUs given, with which parallelism, and how long does a step take: docs/plan.md."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, fields, replace

from cpbench.app.plan_schema import (
    AttentionTiers,
    DocumentsSummary,
    FeasiblePlan,
    GroupLinkEntry,
    MemoryComponentEntry,
    PlanFramework,
    PlanInputs,
    PlanReport,
    RejectedPlan,
    SearchSummary,
    ShortestCp,
)
from cpbench.app.recommend.frameworks import cp_comm_type, framework_table
from cpbench.app.recommend.report import attributes
from cpbench.app.recommend.types import DEFAULT_HARDWARE, FrameworkSetting
from cpbench.config.documents import resolve_documents
from cpbench.config.problem import check_positive_int
from cpbench.config.vocabulary import canonical_dtype
from cpbench.errors import CpbenchError
from cpbench.model.hardware.loading import load_profile
from cpbench.model.hardware.network import load_fabric
from cpbench.model.hardware.profile import HardwareProfile
from cpbench.model.plan.framework import framework_attention
from cpbench.model.plan.memory import CUDA_RESERVE_GIB, SAFE_MEMORY_FRACTION
from cpbench.model.plan.options import PlanOptions
from cpbench.model.plan.search import (
    Plan,
    PlanRejection,
    SearchCounts,
    SearchSpace,
    search,
)
from cpbench.model.plan.step import (
    MFU_CONVENTION,
    STEP_TIME_CONVENTION,
    MatmulEfficiency,
    matmul_efficiency,
)
from cpbench.model.plan.transformer import ModelSpec, load_model
from cpbench.units import GIB

__all__ = ["PackedDocuments", "Plan", "PlanRejection", "PlanRequest", "PlanResult",
           "plan_report", "plan_training"]


@dataclass(frozen=True)
class PlanRequest(PlanOptions):
    """What `cpbench plan` is asked: the options (`PlanOptions`) and the model, L and GPUs as
    the user named them."""

    model: str
    """Preset name, model TOML or Hugging Face config.json."""
    seq_len: int
    """L: tokens per sequence."""
    gpus: int
    """GPUs in total."""
    gpus_per_node: int | None = None
    """GPUs per node; None = the profile's."""
    hardware: str | None = None
    """Profile name or TOML path; None = h100-sxm."""
    global_batch: int | None = None
    """Sequences per optimizer step; None = one per GPU."""
    matmul_efficiency: float | None = None
    """GEMM efficiency override."""
    reserve_gib: float | None = None
    """Runtime reserve per GPU; None = 2 GiB on a GPU, 0 on CPU."""
    fabric: str | None = None
    """A built-in fabric (`cpbench.model.hardware.network.FABRICS`); None: the profile's links."""
    lengths: str | None = None
    """Document lengths packed into every sequence (a distribution drawn with `seed`, a file or
    explicit lengths: `cpbench.config.documents.resolve_documents`); None: one causal sequence."""
    seed: int = 0
    """Seed of a `lengths` distribution."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_int("seq_len", self.seq_len)
        check_positive_int("gpus", self.gpus)
        for name in ("gpus_per_node", "global_batch"):
            if getattr(self, name) is not None:
                check_positive_int(name.replace("_", " "), getattr(self, name))
        if self.reserve_gib is not None and self.reserve_gib < 0:
            raise CpbenchError(f"reserve must be >= 0 GiB, got {self.reserve_gib}")


@dataclass(frozen=True)
class PlanResult:
    """The answer of `plan`."""

    request: PlanRequest
    model: ModelSpec
    profile: HardwareProfile
    gpus_per_node: int
    global_batch: int
    """Sequences per optimizer step."""
    efficiency: MatmulEfficiency
    """GEMM efficiency used."""
    reserve_bytes: float
    """Runtime reserve per GPU."""
    feasible: tuple[Plan, ...]
    """The `keep` fastest plans that fit (every one with keep = 0), fastest first."""
    rejected: tuple[PlanRejection, ...]
    """Rule rejections and the memory rejections closest to fitting (`keep` of them)."""
    frameworks: tuple[FrameworkSetting, ...]
    """Settings of the winner."""
    notes: tuple[str, ...]
    """What the user should know about the answer."""
    shortest_cp: Plan | None = None
    """The fastest plan of the smallest CP degree that fits."""
    counts: SearchCounts | None = None
    """What the search enumerated, rejected, priced and pruned."""
    documents: PackedDocuments | None = None
    """The documents packed into every sequence (`--lengths`); None: one causal sequence."""

    @property
    def winner(self) -> Plan | None:
        """The fastest feasible plan."""
        return self.feasible[0] if self.feasible else None


@dataclass(frozen=True)
class PackedDocuments:
    """The documents of `--lengths` packed into each sequence, and what they change."""

    source: str
    """The length source as given."""
    seed: int
    lengths: tuple[int, ...]
    """Their lengths in one sequence (the last cut to fill it); every sequence is priced so."""
    single_step_s: float | None
    """The fastest step of the same search over one causal sequence of L (None: none fits)."""
    single_label: str | None
    """That plan's label."""

    @property
    def count(self) -> int:
        """Documents per sequence."""
        return len(self.lengths)

    @property
    def mean(self) -> float:
        """Their mean length."""
        return statistics.fmean(self.lengths)

    @property
    def longest(self) -> int:
        """The longest of them."""
        return max(self.lengths)


def plan_training(request: PlanRequest) -> PlanResult:
    """Search the plans (`cpbench.model.plan.search`); see docs/plan.md."""
    model = load_model(request.model)
    profile = load_profile(request.hardware or DEFAULT_HARDWARE)
    per_node = request.gpus_per_node or profile.devices_per_node
    if request.gpus > per_node and request.gpus % per_node:
        raise CpbenchError(
            f"gpus ({request.gpus}) must be a multiple of gpus per node ({per_node}) when they "
            f"span nodes"
        )
    global_batch = request.global_batch or request.gpus
    efficiency = matmul_efficiency(profile, request.matmul_efficiency)
    reserve = (
        request.reserve_gib * GIB if request.reserve_gib is not None
        else (CUDA_RESERVE_GIB * GIB if profile.device_kind == "cuda" else 0.0)
    )
    options = {f.name: getattr(request, f.name) for f in fields(PlanOptions)}
    space = SearchSpace(
        **options, model=model, profile=profile, gpus=request.gpus, gpus_per_node=per_node,
        seq_len=request.seq_len, global_batch=global_batch, efficiency=efficiency,
        reserve_bytes=reserve,
        fabric=load_fabric(request.fabric) if request.fabric is not None else None,
    )
    packed = None
    if request.lengths is not None:
        lengths = resolve_documents(request.lengths, request.seq_len, request.seed)
        single = search(replace(space, keep=1)).feasible  # the same plans on one sequence
        space = replace(space, documents=lengths if len(lengths) > 1 else None)
        packed = PackedDocuments(request.lengths, request.seed, lengths,
                                 single[0].time.total_s if single else None,
                                 single[0].par.label() if single else None)  # fmt: skip
    found = search(space)
    notes = _notes(space, request, found.counts)
    feasible = found.feasible
    frameworks = plan_framework_settings(feasible[0], request, global_batch) if feasible else ()
    return PlanResult(request, model, profile, per_node, global_batch, efficiency, reserve,
                      feasible, found.rejected, frameworks, notes, found.shortest_cp,
                      found.counts, packed)


def _notes(space: SearchSpace, request: PlanRequest, counts: SearchCounts) -> tuple[str, ...]:
    model = space.model
    notes = [model.describe() + f" ({model.source})"]
    if request.recompute is None and not space.scores_materialised:
        notes.append(
            "selective recompute (Korthikanti et al.'s: the core attention) is not searched: the "
            "fused attention kernel stores no scores, so it keeps what 'none' keeps and only "
            "adds an attention forward"
        )
    notes.append(f"matmul efficiency {space.efficiency.value:.2f}: {space.efficiency.source}")
    if request.lengths is not None:
        notes.append(
            "attention priced under the document mask of one draw of --lengths packed into L "
            "(every micro-batch's sequence the same packing); a query attends only its own "
            "document; the ring layouts are the framework's, cut over the packed sequence"
        )
    impl = space.attention
    factor = (f"measured factor {space.factor:g}" if space.attention_factor is not None
              else f"factor {space.factor:g}")
    notes.append(f"attention priced as {impl.framework} ({factor}): {impl.source}")
    if space.linears != "bf16":
        notes.append(f"{space.linears} linears: GEMMs {space.linear_speedup:g}x the bf16 rate "
                     "(cpbench.model.plan.framework.FP8_LINEAR_SPEEDUP); attention in "
                     f"{space.dtype}")
    notes.append(
        f"searched {counts.enumerated} plans: {counts.rejected_by_memory} over memory, "
        f"{counts.feasible} fit, {counts.priced} priced ({counts.meshes_priced} attention meshes)"
        + (f", {counts.pruned} not priced because a lower bound of their step is slower than "
           f"the {space.keep} best" if counts.pruned else "")
    )
    return tuple(notes)


# --------------------------------------------------------------------------- frameworks


def plan_framework_settings(
    best: Plan, request: PlanRequest, global_batch: int
) -> tuple[FrameworkSetting, ...]:
    """Megatron-LM, torchtitan and DeepSpeed settings of a plan (flags, templates and notes
    from `cpbench/data/settings/frameworks.toml`)."""
    p = best.par
    table = framework_table()
    t, words = table.training, table.plan
    flag = t.megatron.flags
    comm = cp_comm_type(p.ulysses, p.ring)
    flags = f"{flag['tp']} {p.tp}"
    if p.tp > 1:
        flags += f" {flag['sequence_parallel']}"
    flags += f" {flag['cp']} {p.cp}"
    if p.cp > 1:
        flags += f" {flag['comm']} {comm}"
        if comm == t.megatron.comm_types["hybrid"]:
            flags += f" {flag['hierarchical']} {p.ulysses} {p.ring}"
    flags += (
        f" {flag['pp']} {p.pp} {flag['micro_batch']} {p.micro_batch}"
        f" {flag['global_batch']} {global_batch} {flag['seq_len']} {request.seq_len}"
    )
    if p.recompute != "none":
        flags += f" {flag['recompute_' + p.recompute]}"
    notes = [words["megatron_chunks"]]
    if p.zero in (1, 2):
        flags += f" {flag['zero1']}"
    elif p.zero == 3:
        flags += f" {flag['zero3']}"
        notes.append(words["megatron_zero3"])
    if p.zero == 2:
        notes.append(words["megatron_zero2"])
    flags += f" {flag['bf16']}" if canonical_dtype(request.dtype) == "bfloat16" else ""
    megatron = FrameworkSetting(t.megatron.name, True, flags, "; ".join(notes) + ".")

    titan_ok = p.ulysses == 1 or t.torchtitan.ulysses
    titan = t.torchtitan.plan_setting.format(
        tp=p.tp, cp=p.cp, pp=p.pp, dp=p.dp, recompute=p.recompute, seq_len=request.seq_len,
        micro_batch=p.micro_batch,
    )
    titan_note = words["torchtitan"]
    if not titan_ok:
        titan_note += "; " + words["torchtitan_ulysses"].format(ulysses=p.ulysses, cp=p.cp)
    torchtitan = FrameworkSetting(t.torchtitan.name, titan_ok, titan, titan_note + ".")

    ds = (
        t.deepspeed.plan_setting.format(
            zero=p.zero, micro_batch=p.micro_batch, global_batch=global_batch
        )
        + (f", {t.deepspeed.setting.format(ulysses=p.ulysses)}" if p.ulysses > 1 else "")
        + (f", {t.deepspeed.plan_recompute}" if p.recompute != "none" else "")
    )
    reasons = []
    if p.tp > 1:
        reasons.append(words["deepspeed_tp"].format(tp=p.tp))
    if p.ring > 1 and not t.deepspeed.ring:
        reasons.append(words["deepspeed_ring"].format(ring=p.ring))
    if p.pp > 1:
        reasons.append(words["deepspeed_pp"].format(pp=p.pp))
    ds_note = "; ".join(reasons) if reasons else words["deepspeed"]
    deepspeed = FrameworkSetting(t.deepspeed.name, not reasons, ds, ds_note + ".")
    return (megatron, torchtitan, deepspeed)


# ---------------------------------------------------------------------------------- JSON


CONVENTIONS = {
    "time": STEP_TIME_CONVENTION,
    "mfu": MFU_CONVENTION,
    "memory": "bytes per rank of the busiest pipeline stage; GiB = 2**30 bytes; "
              "memory_bytes = tensors + runtime reserve, memory_tensor_bytes = the "
              "tensors alone (what a caching allocator's reserved memory must cover, "
              "with its cached and fragmented blocks on top); safe = tensors within "
              f"{SAFE_MEMORY_FRACTION:.0%} of the device memory (Fujii et al. 2024, "
              "arXiv:2411.06465: no OOM over 454 runs below it)",
    "tokens": "tokens per second per GPU = global batch x L / step time / GPUs",
}
"""What the plan's numbers mean (`--json`'s `conventions`, the screen's last line)."""


def _feasible_entry(p: Plan, rank: int, capacity: float) -> FeasiblePlan:
    par, t, peak = p.par, p.time, p.peak
    return FeasiblePlan(
        rank=rank,
        label=par.label(),
        **attributes(par, "tp cp ulysses ring", layout=par.layout if par.ring > 1 else "any"),
        **attributes(par, "pp dp recompute zero micro_batch micro_batches", step_s=t.total_s),
        parts_s={k: getattr(t, f"{k}_s") for k in PLAN_PARTS},
        **attributes(t, "attention_share bubble_fraction tokens_per_s_per_gpu mfu"),
        memory_bytes=peak.total,
        memory_tensor_bytes=peak.tensor_total,
        memory_safe_bytes=SAFE_MEMORY_FRACTION * capacity,
        within_safe_margin=peak.tensor_total <= SAFE_MEMORY_FRACTION * capacity,
        memory_stage=peak.stage,
        memory={
            s.stage: {c.name: MemoryComponentEntry(bytes=c.bytes, formula=c.formula)
                      for c in s.components}
            for s in p.stages
        },
        **attributes(p, "max_seq_len max_seq_len_safe", tiers=_tiers(p)),
    )


PLAN_PARTS = ("gemm", "attention", "tp_comm", "pp_comm", "bubble", "dp_comm", "optimizer")
"""The parts of a step (`StepTime.<part>_s`)."""


def _tiers(p: Plan) -> dict[str, GroupLinkEntry | AttentionTiers]:
    """Each group's tier and link; the attention's collectives as the cost model placed them."""
    out: dict[str, GroupLinkEntry | AttentionTiers] = {}
    for g in p.tiers.groups if p.tiers is not None else ():
        if g.sends:
            out[g.group] = GroupLinkEntry(
                tier=g.tier, link=g.link.name, size=g.size, stride=g.stride,
                send_recv_busbw_GBps=g.link.send_recv.busbw / 1e9,
                all_to_all_busbw_GBps=g.link.all_to_all.busbw / 1e9,
            )  # fmt: skip
    place = p.attention.placement
    out["attention"] = AttentionTiers(
        ulysses_all_to_all=place.ulysses_tier if p.par.ulysses > 1 else None,
        ring_hops=place.ring_tier if p.par.ring > 1 else None,
        **attributes(place, "ring_crossing_hops nodes"),
    )
    return out


def plan_report(result: PlanResult) -> PlanReport:
    """The typed answer (`--json` is its `model_dump(mode="json")`, schema_version first)."""
    r, m, counts = result.request, result.model, result.counts
    winner, shortest = result.winner, result.shortest_cp
    ranked = {id(p): i + 1 for i, p in enumerate(result.feasible)}
    inputs = PlanInputs(
        model=m.to_dict(),
        parameters=m.total_params,
        **attributes(r, "seq_len gpus", gpus_per_node=result.gpus_per_node),
        hardware=result.profile.name,
        memory_capacity_bytes=result.profile.memory_bytes,
        reserve_bytes=result.reserve_bytes,
        dtype=canonical_dtype(r.dtype),
        **attributes(r, "kernel zero micro_batch", global_batch=result.global_batch),
        recompute=r.recompute or "search",
        framework=r.framework,
        attention_factor=(r.attention_factor if r.attention_factor is not None
                          else framework_attention(r.framework).factor),
        **attributes(r, "linears fabric memory_margin rank_by"),
        **(attributes(r, "lengths seed") if r.lengths is not None else {}),
        matmul_efficiency=result.efficiency.value,
        matmul_efficiency_source=result.efficiency.source,
    )  # fmt: skip
    return PlanReport(
        inputs=inputs,
        feasible=[_feasible_entry(p, i + 1, result.profile.memory_bytes)
                  for i, p in enumerate(result.feasible)],
        rejected=[
            RejectedPlan.of(x, memory_bytes=x.total_bytes) for x in result.rejected
        ],
        winner=ranked[id(winner)] if winner is not None else None,
        shortest_cp=(
            ShortestCp(cp=shortest.par.cp, rank=ranked.get(id(shortest)),
                       label=shortest.par.label(), step_s=shortest.time.total_s)
            if shortest is not None else None
        ),
        frameworks=[PlanFramework.of(f) for f in result.frameworks],
        search=(
            SearchSummary.of(counts, kept=r.keep) if counts is not None else None
        ),
        documents=(DocumentsSummary.of(result.documents, lengths=list(result.documents.lengths))
                   if result.documents else None),
        notes=list(result.notes),
        conventions=dict(CONVENTIONS),
    )  # fmt: skip
