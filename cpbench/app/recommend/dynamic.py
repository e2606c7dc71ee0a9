"""`recommend --lengths`: the dynamic-CP policies of a batch of sequences ranked by predicted
step time, with the speedup over static CP and the settings of the pick (docs/dynamic-cp.md)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from cpbench.app.recommend.types import DEFAULT_HARDWARE
from cpbench.app.recommend.uncertainty import faster_probability, profile_uncertainty
from cpbench.app.schema import ReportModel, Versioned
from cpbench.config.documents import global_batch
from cpbench.config.vocabulary import Dtype
from cpbench.errors import CpbenchError
from cpbench.model.dynamic import (
    STEP_MICRO_BATCHES,
    DynamicProblem,
    Policy,
    PolicyPlan,
    plan_policies,
    speedup,
)
from cpbench.model.dynamic.schedule import GroupScheme
from cpbench.model.hardware.loading import load_profile

DYNAMIC_CONVENTION = (
    "seconds of one attention layer's forward + backward for the whole batch: the micro-"
    "batches in turn, each as long as its slowest CP group (cpbench's cost model, the pack "
    "pricing of docs/dynamic-cp.md); the MLP and projections, the same per token under every "
    "policy, are not in it"
)


MAX_GPUS = 1 << 20
"""The most GPUs `--lengths` schedules over (the training path's bound)."""
MAX_TOKENS = 1 << 40
"""The largest token count `--tokens-per-rank` and `--step-tokens` take."""


@dataclass(frozen=True)
class DynamicRequest:
    """What `recommend --lengths` is asked."""

    lengths: str
    """The batch's sequence lengths: a distribution, a file or explicit lengths
    (`config.documents.global_batch`)."""
    heads: int
    kv_heads: int
    head_dim: int = 128
    dtype: Dtype = "bfloat16"
    gpus: int = 8
    """W: the ranks the batch is spread over (data x context parallel)."""
    tokens_per_rank: int = 8192
    """C: the most tokens a rank holds in a micro-batch."""
    static_cp: int | None = None
    """The static policy's CP degree (None: the power of two that holds the longest)."""
    step_tokens: int | None = None
    """The step's token budget (None: `STEP_MICRO_BATCHES` x W x C)."""
    seed: int = 0
    hardware: str | None = None

    @property
    def budget(self) -> int:
        if self.step_tokens is not None:
            return self.step_tokens
        return STEP_MICRO_BATCHES * self.gpus * self.tokens_per_rank


@dataclass(frozen=True)
class RankedPolicy:
    """One policy's plan with its place."""

    plan: PolicyPlan
    speedup_over_static: float | None
    """None when static CP cannot plan the batch."""
    faster_than_next: float | None
    """P(this policy is faster than the next ranked), from the model's error of a ratio."""


@dataclass(frozen=True)
class DynamicRecommendation:
    request: DynamicRequest
    profile_name: str
    lengths: tuple[int, ...]
    ranked: tuple[RankedPolicy, ...]
    ratio_sigma: float
    uncertainty_source: str
    refused: dict[Policy, str]
    """Policies whose rule cannot plan the batch, with why."""
    static_degree: int
    """The static policy's CP degree (its Megatron flag)."""

    @property
    def pick(self) -> RankedPolicy:
        return self.ranked[0]

    def plan(self, policy: Policy) -> PolicyPlan:
        return next(r.plan for r in self.ranked if r.plan.policy == policy)


def recommend_policies(request: DynamicRequest) -> DynamicRecommendation:
    """Draw or read the batch, plan it by every policy, rank the plans by predicted step."""
    for flag, value, most in (("--gpus", request.gpus, MAX_GPUS),
                              ("--tokens-per-rank", request.tokens_per_rank, MAX_TOKENS),
                              ("--step-tokens", request.step_tokens, MAX_TOKENS)):  # fmt: skip
        if value is not None and not 1 <= value <= most:
            raise CpbenchError(f"{flag} ({value}) must be 1 to {most:,}")
    lengths = global_batch(request.lengths, request.budget, request.seed)
    if request.step_tokens is not None and max(lengths) > request.step_tokens:
        raise CpbenchError(
            f"the step's token budget ({request.step_tokens:,}) is smaller than its longest "
            f"sequence ({max(lengths):,} tokens)"
        )
    problem = DynamicProblem(
        lengths, request.gpus, request.tokens_per_rank, request.heads, request.kv_heads,
        request.head_dim, request.dtype, request.static_cp,
    )  # fmt: skip
    profile = load_profile(request.hardware or DEFAULT_HARDWARE)
    refused: dict[Policy, str] = {}
    plans = sorted(plan_policies(problem, profile, refused=refused).values(),
                   key=lambda p: p.step_s)  # fmt: skip
    uncertainty = profile_uncertainty(profile, None)
    sigma = uncertainty.ratio_sigma
    static = next((p for p in plans if p.policy == "static"), None)
    ranked = tuple(
        RankedPolicy(p, speedup(p, static) if static else None,
                     faster_probability(p.step_s, plans[i + 1].step_s, sigma)
                     if i + 1 < len(plans) else None)
        for i, p in enumerate(plans)
    )  # fmt: skip
    return DynamicRecommendation(request, profile.name, lengths, ranked, sigma,
                                 uncertainty.source, refused, problem.static_degree)  # fmt: skip


def megatron_flags(request: DynamicRequest, static_cp: int) -> list[str]:
    """Megatron-Core's flags for its dynamic-CP rule on this batch's budgets."""
    return [
        f"--context-parallel-size {static_cp}",
        "--dynamic-context-parallel",
        "--sequence-packing-scheduler default_dynamic_cp",
        f"--max-seqlen-per-dp-cp-rank {request.tokens_per_rank}",
        "--min-dynamic-context-parallel-size 1",
        "--calculate-per-token-loss",
    ]


def not_in_megatron(plan: PolicyPlan) -> list[str]:
    """What a plan does that Megatron's dynamic CP cannot express."""
    groups = [g for mb in plan.micro_batches for g in mb.groups]
    out = []
    odd = sorted({g.degree for g in groups if g.degree & (g.degree - 1)})
    if odd:
        out.append(f"CP degrees that are not powers of two: {', '.join(map(str, odd))}")
    other = sorted({g.scheme for g in groups if g.scheme != "ring" and g.degree > 1})
    if other:
        out.append(f"groups that run {' and '.join(other)} instead of the p2p ring")
    return out


class BatchSummary(ReportModel):
    """The batch's length statistics."""

    sequences: int
    tokens: int
    min: int
    median: int | float
    """`statistics.median` of the lengths (an integer for an odd count)."""
    max: int
    needing_cp: int
    """Sequences longer than the tokens per rank: those that need CP."""


def batch_summary(lengths: tuple[int, ...], tokens_per_rank: int) -> BatchSummary:
    return BatchSummary(
        sequences=len(lengths), tokens=sum(lengths), min=min(lengths),
        median=statistics.median(lengths), max=max(lengths),
        needing_cp=sum(s > tokens_per_rank for s in lengths),
    )  # fmt: skip


class RatioUncertainty(ReportModel):
    """The model's error on a ratio of two predicted steps."""

    ratio_sigma: float
    source: str


class ScheduledGroup(ReportModel):
    """One CP group of a micro-batch."""

    degree: int
    scheme: GroupScheme
    sequences: list[int]
    """Ids of the batch's sequences the group runs, packed."""
    tokens: int
    predicted_s: float


class RankedPolicyEntry(ReportModel):
    """One policy's plan, ranked by predicted step."""

    policy: Policy
    step_s: float
    speedup_over_static: float | None
    """The static policy's step / this one's (None: static CP cannot plan the batch)."""
    faster_than_next_probability: float | None
    """Probability under the ratio's model error that this policy is faster than the next."""
    busy_share: float
    """Rank-seconds of work / (GPUs x step)."""
    micro_batches: int
    sequences_per_degree: dict[int, int]
    not_in_megatron: list[str]
    """What of this schedule Megatron's flags cannot express."""
    schedule: list[list[ScheduledGroup]]
    """Per micro-batch, its groups."""


class DynamicReport(Versioned):
    """`recommend --lengths --json`."""

    request: dict[str, Any]
    profile: str
    convention: str
    batch: BatchSummary
    uncertainty: RatioUncertainty
    pick: Policy
    policies: list[RankedPolicyEntry]
    refused: dict[Policy, str]
    """Policies whose rule cannot plan the batch, and why."""
    megatron_flags: list[str]


def dynamic_report(rec: DynamicRecommendation) -> DynamicReport:
    """The `--json` report (`model_dump(mode="json")`, schema_version first)."""
    req = rec.request
    return DynamicReport(
        request=asdict(req),
        profile=rec.profile_name,
        convention=DYNAMIC_CONVENTION,
        batch=batch_summary(rec.lengths, req.tokens_per_rank),
        uncertainty=RatioUncertainty(ratio_sigma=rec.ratio_sigma, source=rec.uncertainty_source),
        pick=rec.pick.plan.policy,
        policies=[
            RankedPolicyEntry(
                policy=r.plan.policy,
                step_s=r.plan.step_s,
                speedup_over_static=r.speedup_over_static,
                faster_than_next_probability=r.faster_than_next,
                busy_share=r.plan.busy_share,
                micro_batches=len(r.plan.micro_batches),
                sequences_per_degree=r.plan.degrees,
                not_in_megatron=not_in_megatron(r.plan),
                schedule=[[ScheduledGroup.of(g, sequences=list(g.sequences)) for g in mb.groups]
                          for mb in r.plan.micro_batches],  # fmt: skip
            )
            for r in rec.ranked
        ],
        refused=dict(rec.refused),
        megatron_flags=megatron_flags(req, rec.static_degree),
    )
