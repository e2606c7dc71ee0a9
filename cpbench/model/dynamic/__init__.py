"""Dynamic context parallelism: a global batch of whole sequences scheduled by a policy (static
CP, Megatron-Core's dynamic-CP rule, cpbench's cost-model scheduler) and priced on a hardware
profile. docs/dynamic-cp.md. Pure Python."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

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
    "POLICIES", "CpGroup", "DynamicProblem", "GroupedMicroBatch", "Policy", "PolicyPlan",
    "SequenceCosts", "cpbench_plan", "greedy_plan", "megatron_plan", "plan_policies", "speedup",
    "static_plan",
]  # fmt: skip

def cpbench_plan(costs: SequenceCosts, megatron: PolicyPlan | None = None) -> PolicyPlan:
    """cpbench's policy: the faster by the model of its greedy schedule (`greedy_plan`) and
    Megatron's schedule (`megatron`, planned when not given) with each group on its fastest
    scheme (`reschemed`): never slower than Megatron's rule by the model that prices both."""
    megatron = megatron or megatron_plan(costs)
    return min((greedy_plan(costs), reschemed(costs, megatron)), key=lambda plan: plan.step_s)


def plan_policies(
    problem: DynamicProblem, profile: HardwareProfile, policies: Sequence[Policy] = POLICIES
) -> dict[Policy, PolicyPlan]:
    """Every requested policy's plan of the batch, priced on one `SequenceCosts` (Megatron's
    schedule planned once: cpbench's policy weighs it too)."""
    costs = SequenceCosts(problem, profile)
    megatron = megatron_plan(costs) if {"megatron", "cpbench"} & set(policies) else None
    planners: dict[Policy, Callable[[], PolicyPlan]] = {
        "static": lambda: static_plan(costs),
        "megatron": lambda: megatron or megatron_plan(costs),
        "cpbench": lambda: cpbench_plan(costs, megatron),
    }
    return {p: planners[p]() for p in policies}


def speedup(plan: PolicyPlan, baseline: PolicyPlan) -> float:
    """baseline step / plan step (> 1: the plan is faster)."""
    return baseline.step_s / plan.step_s if plan.step_s > 0 else math.inf
