"""Dynamic CP on 4 gloo ranks (the session's pool): each policy's plan routed to subgroups,
every group of every micro-batch checked against the float64 reference (output and dQ/dK/dV,
the verify tolerance), the step timed and each rank's busy seconds measured."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cpbench.app.dynamic import MeasuredPolicy, measure_policies, routed
from cpbench.bench.pool import WorkerPool
from cpbench.model.dynamic import DynamicProblem, SequenceCosts, plan_policies
from cpbench.model.hardware.loading import load_profile

WORLD = 4
SETTINGS = {"warmup": 0, "iters": 2, "precision": None, "budget": 1.0}
# a skewed batch: one sequence needs all 4 ranks of 96 tokens, three need 2, the rest fit one
LENGTHS = (300, 150, 120, 100, 90, 60, 40, 30, 20, 17, 9, 3)


@pytest.fixture(scope="module")
def measured(pool: Callable[[int], WorkerPool]) -> dict[str, MeasuredPolicy]:
    problem = DynamicProblem(LENGTHS, WORLD, 96, 4, 2, 16, "float32", static_cp=WORLD)
    profile = load_profile("cpu-local")
    plans = plan_policies(problem, profile)
    return measure_policies(problem, profile, plans, SETTINGS, pool=pool(WORLD))  # type: ignore[return-value]


def test_every_routed_group_passes_its_reference_check(measured: dict) -> None:
    for name, m in measured.items():
        groups = sum(len(mb.groups) for mb in m.plan.micro_batches)
        assert len(m.checks) == groups, name
        assert all(c["passed"] is True for c in m.checks), (name, m.failed)
        # the cases are those of the plan: each group's packed lengths, GQA 4/2, causal
        assert {c["kv_heads"] for c in m.checks} == {2}
        assert max(c["max_error"] / c["tolerance"] for c in m.checks) <= 1.0


def test_the_step_is_timed_and_every_rank_reports_its_work(measured: dict) -> None:
    for m in measured.values():
        assert len(m.samples) == SETTINGS["iters"] and min(m.samples) > 0
        assert len(m.busy_s) == WORLD and all(b >= 0 for b in m.busy_s)
        assert -0.05 <= m.idle_share < 1  # busy seconds of one step within that step
    # static CP runs every group on all 4 ranks: no rank idles a micro-batch away
    assert {g.degree for mb in measured["static"].plan.micro_batches for g in mb.groups} == {4}


def test_routing_puts_each_group_on_consecutive_ranks_with_the_priced_padding() -> None:
    problem = DynamicProblem(LENGTHS, WORLD, 96, 4, 2, 16, "float32", static_cp=WORLD)
    costs = SequenceCosts(problem, load_profile("cpu-local"))
    for plan in plan_policies(problem, costs.profile).values():
        step = routed(plan, costs)
        for mb, groups in zip(plan.micro_batches, step.micro_batches, strict=True):
            ranks = [r for g in groups for r in g.ranks]
            assert ranks == list(range(len(ranks))) and len(ranks) <= WORLD
            for g, r in zip(mb.groups, groups, strict=True):
                assert r.ulysses * r.ring == g.degree
                unit = 1 if g.degree == 1 else g.degree if g.scheme == "ulysses" else 2 * g.degree
                assert all(d % unit == 0 for d in r.documents)
                assert len(r.documents) == len(g.sequences)
