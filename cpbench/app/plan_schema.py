"""The typed answer of `cpbench plan --json` (and of the report's whole-model plan section):
`PlanReport`, built by `cpbench.app.plan.plan_report`, serialised once by
`model_dump(mode="json")`; docs/plan.md explains the numbers."""

from __future__ import annotations

from typing import Any, ClassVar

from cpbench.app.schema import ReportModel, Versioned


class PlanInputs(ReportModel):
    """What the plan was asked, with what the service resolved (profile, batch, efficiency)."""

    omitted_when_none: ClassVar[tuple[str, ...]] = ("lengths", "seed")

    model: dict[str, Any]
    """The model's architecture (`ModelSpec.to_dict`)."""
    parameters: int
    seq_len: int
    gpus: int
    gpus_per_node: int
    hardware: str
    """The hardware profile's name."""
    memory_capacity_bytes: float
    reserve_bytes: float
    """Runtime reserve per GPU."""
    dtype: str
    kernel: str
    zero: int
    micro_batch: int
    global_batch: int
    """Sequences per optimizer step."""
    recompute: str
    """The recompute asked for, or "search"."""
    framework: str
    attention_factor: float
    """The attention cost factor of the framework (or the one given)."""
    linears: str
    fabric: str | None
    memory_margin: str
    rank_by: str
    lengths: str | None = None
    """`--lengths`: the documents packed into each sequence (the key only with it)."""
    seed: int | None = None
    """The seed that draws them (the key only with `--lengths`)."""
    matmul_efficiency: float
    matmul_efficiency_source: str


class MemoryComponentEntry(ReportModel):
    """One component of a stage's peak memory."""

    bytes: float
    formula: str


class GroupLinkEntry(ReportModel):
    """A process group's tier and link."""

    tier: str
    link: str
    """The link's name."""
    size: int
    stride: int
    send_recv_busbw_GBps: float
    all_to_all_busbw_GBps: float


class AttentionTiers(ReportModel):
    """Where the cost model placed the attention's collectives."""

    ulysses_all_to_all: str | None
    """The Ulysses all-to-all's tier (None: no Ulysses)."""
    ring_hops: str | None
    """The ring hops' tier (None: no ring)."""
    ring_crossing_hops: int
    nodes: int


class FeasiblePlan(ReportModel):
    """One plan that fits, by rank."""

    rank: int
    label: str
    tp: int
    cp: int
    ulysses: int
    ring: int
    layout: str
    """The ring's token layout ("any" without a ring)."""
    pp: int
    dp: int
    recompute: str
    zero: int
    micro_batch: int
    micro_batches: int
    step_s: float
    """Seconds per optimizer step."""
    parts_s: dict[str, float]
    """The step's parts (`PLAN_PARTS`), seconds; they sum to the step."""
    attention_share: float
    bubble_fraction: float
    tokens_per_s_per_gpu: float
    mfu: float
    memory_bytes: float
    """Peak bytes per rank: tensors + runtime reserve."""
    memory_tensor_bytes: float
    memory_safe_bytes: float
    """The safe fraction of the device memory."""
    within_safe_margin: bool
    memory_stage: str
    """The pipeline stage of the peak."""
    memory: dict[str, dict[str, MemoryComponentEntry]]
    """Per stage, per component."""
    max_seq_len: int
    max_seq_len_safe: int
    tiers: dict[str, GroupLinkEntry | AttentionTiers]
    """Each group's tier, then "attention": the attention's collectives."""


class RejectedPlan(ReportModel):
    """A plan that cannot run, with the rule or the component that overflows."""

    label: str
    kind: str
    rule: str
    memory_bytes: float | None
    max_seq_len: int | None


class ShortestCp(ReportModel):
    """The fastest plan of the smallest CP degree that fits."""

    cp: int
    rank: int | None
    """Its rank among the kept plans (None: not among them)."""
    label: str
    step_s: float


class PlanFramework(ReportModel):
    """How to run the winner in one framework."""

    framework: str
    expressible: bool
    settings: str
    note: str


class SearchSummary(ReportModel):
    """What the search enumerated, rejected, priced and pruned."""

    enumerated: int
    rejected_by_rule: int
    rejected_by_memory: int
    feasible: int
    priced: int
    pruned: int
    meshes_priced: int
    kept: int
    """Plans kept (`--top`; 0: every one)."""


class DocumentsSummary(ReportModel):
    """`--lengths`: the documents of each sequence, and the step on one sequence."""

    source: str
    seed: int
    count: int
    mean: float
    longest: int
    lengths: list[int]
    single_step_s: float | None
    single_label: str | None


class PlanReport(Versioned):
    """`cpbench plan --json`."""

    omitted_when_none: ClassVar[tuple[str, ...]] = ("documents",)

    inputs: PlanInputs
    feasible: list[FeasiblePlan]
    """The kept plans that fit, fastest first."""
    rejected: list[RejectedPlan]
    winner: int | None
    """The winner's rank (None: no plan fits)."""
    shortest_cp: ShortestCp | None
    frameworks: list[PlanFramework]
    """The winner's settings."""
    search: SearchSummary | None
    documents: DocumentsSummary | None = None
    notes: list[str]
    conventions: dict[str, str]
    """What the numbers mean."""
