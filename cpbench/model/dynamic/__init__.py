"""Dynamic context parallelism: a global batch of whole sequences scheduled by a policy (static
CP, Megatron-Core's dynamic-CP rule, cpbench's cost-model scheduler) and priced on a hardware
profile. docs/dynamic-cp.md. Pure Python."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from cpbench.errors import CpbenchError
from cpbench.model.dynamic.megatron import megatron_plan
from cpbench.model.dynamic.schedule import (
    POLICIES,
    CpGroup,
    DynamicProblem,
    GroupedMicroBatch,
    Policy,
    PolicyPlan,
    SequenceCosts,
    greedy_plan,
    reschemed,
    static_plan,
)
from cpbench.model.hardware.profile import HardwareProfile

__all__ = [
    "POLICIES", "STEP_MICRO_BATCHES", "CpGroup", "DynamicProblem", "GroupedMicroBatch", "Policy",
    "PolicyPlan", "SequenceCosts", "greedy_plan", "megatron_plan", "plan_policies", "speedup",
    "static_plan",
]  # fmt: skip

STEP_MICRO_BATCHES = 8
"""The default token budget of a step: this many micro-batches of W x C tokens (Megatron's
benchmark runs 8 micro-batches)."""


def _cpbench_of(costs: SequenceCosts, megatron: PolicyPlan | None) -> PolicyPlan:
    """cpbench's policy: the faster by the model of its greedy schedule (`greedy_plan`) and
    Megatron's schedule (when Megatron's rule can plan the batch) with each group on its
    fastest scheme (`reschemed`): never slower than Megatron's rule by the model that prices
    both."""
    options = [greedy_plan(costs)] + ([reschemed(costs, megatron)] if megatron else [])
    return min(options, key=lambda plan: plan.step_s)


def plan_policies(
    problem: DynamicProblem, profile: HardwareProfile, policies: Sequence[Policy] = POLICIES,
    refused: dict[Policy, str] | None = None,
) -> dict[Policy, PolicyPlan]:  # fmt: skip
    """Every requested policy's plan of the batch, priced on one `SequenceCosts` (Megatron's
    schedule planned once: cpbench's policy weighs it too). A policy whose rule cannot plan
    the batch (static CP with fewer sequences than data-parallel packs, Megatron's power-of-two
    degrees on a world that is none) raises CpbenchError, or with `refused` is left out and its
    reason put there."""
    costs = SequenceCosts(problem, profile)
    reasons: dict[Policy, str] = {}

    def attempt(policy: Policy, planner: Callable[[], PolicyPlan]) -> PolicyPlan | None:
        try:
            return planner()
        except CpbenchError as exc:
            if refused is None:
                raise
            reasons[policy] = str(exc)
            return None

    megatron = None
    if {"megatron", "cpbench"} & set(policies):
        megatron = attempt("megatron", lambda: megatron_plan(costs))
    planners: dict[Policy, Callable[[], PolicyPlan | None]] = {
        "static": lambda: attempt("static", lambda: static_plan(costs)),
        "megatron": lambda: megatron,
        "cpbench": lambda: _cpbench_of(costs, megatron),
    }
    plans = {p: planners[p]() for p in policies}
    if refused is not None:
        refused.update({p: r for p, r in reasons.items() if p in policies})
    return {p: plan for p, plan in plans.items() if plan is not None}


def speedup(plan: PolicyPlan, baseline: PolicyPlan) -> float:
    """baseline step / plan step (> 1: the plan is faster)."""
    return baseline.step_s / plan.step_s if plan.step_s > 0 else math.inf
