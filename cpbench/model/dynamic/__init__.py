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
    cpbench_plan,
    static_plan,
)
from cpbench.model.hardware.profile import HardwareProfile

__all__ = [
    "POLICIES", "CpGroup", "DynamicProblem", "GroupedMicroBatch", "Policy", "PolicyPlan",
    "SequenceCosts", "cpbench_plan", "megatron_plan", "plan_policies", "speedup", "static_plan",
]  # fmt: skip

PLANNERS: dict[Policy, Callable[[SequenceCosts], PolicyPlan]] = {
    "static": static_plan, "megatron": megatron_plan, "cpbench": cpbench_plan,
}  # fmt: skip


def plan_policies(
    problem: DynamicProblem, profile: HardwareProfile, policies: Sequence[Policy] = POLICIES
) -> dict[Policy, PolicyPlan]:
    """Every requested policy's plan of the batch, priced on one `SequenceCosts`."""
    costs = SequenceCosts(problem, profile)
    return {p: PLANNERS[p](costs) for p in policies}


def speedup(plan: PolicyPlan, baseline: PolicyPlan) -> float:
    """baseline step / plan step (> 1: the plan is faster)."""
    return baseline.step_s / plan.step_s if plan.step_s > 0 else math.inf
