"""Dynamic CP measured: each policy's plan routed to the ranks (`bench.dynamic`), checked and
timed on one pool, beside its prediction. docs/dynamic-cp.md, "Measured"."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from cpbench.bench.dynamic import RoutedGroup, RoutedStep, run_routed_step_on_rank
from cpbench.errors import RunFailure
from cpbench.model.dynamic import DynamicProblem, Policy, PolicyPlan, SequenceCosts
from cpbench.model.hardware.profile import HardwareProfile
from cpbench.model.ties import median_interval


def routed(plan: PolicyPlan, costs: SequenceCosts, kernel: str = "auto") -> RoutedStep:
    """The plan as the ranks run it: each micro-batch's groups on consecutive ranks, a ring
    group on a 1 x g zigzag ring over its documents (doc_zigzag), Ulysses on g x 1, the
    all-gather ring 1 x g; every sequence padded as its price assumed (`SequenceCosts.padded`)."""
    p = costs.problem
    micro_batches = []
    for mb in plan.micro_batches:
        groups, first = [], 0
        for g in mb.groups:
            ulysses = g.degree if g.scheme == "ulysses" else 1
            documents = tuple(costs.padded(g.degree, g.scheme, p.lengths[i]) for i in g.sequences)
            groups.append(RoutedGroup(
                ranks=tuple(range(first, first + g.degree)), ulysses=ulysses,
                ring=g.degree // ulysses,
                layout="doc_zigzag" if g.degree > 1 and ulysses == 1 else "contiguous",
                cp_comm="all_gather" if g.scheme == "allgather" else "p2p", documents=documents,
            ))  # fmt: skip
            first += g.degree
        micro_batches.append(tuple(groups))
    return RoutedStep(tuple(micro_batches), p.heads, p.kv_heads, p.head_dim, p.dtype, kernel)


@dataclass(frozen=True)
class MeasuredPolicy:
    """One policy measured beside its prediction."""

    plan: PolicyPlan
    samples: list[float]
    """Seconds per step (each the max over ranks), every micro-batch included."""
    busy_s: list[float]
    """Each rank's seconds of work in one instrumented step."""
    instrumented_s: float
    """That step's seconds (the max over ranks)."""
    checks: list[dict[str, Any]]
    """Every routed group's reference check."""

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples)

    @property
    def interval(self) -> tuple[float, float]:
        i = median_interval(self.samples)
        return i.low, i.high

    @property
    def idle_share(self) -> float:
        """1 - the ranks' busy seconds / (W x the step), of one instrumented step."""
        return 1.0 - sum(self.busy_s) / (len(self.busy_s) * max(self.instrumented_s, 1e-12))

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [c for c in self.checks if c.get("passed") is not True]


def measure_policies(
    problem: DynamicProblem, profile: HardwareProfile, plans: dict[Policy, PolicyPlan],
    settings: dict[str, Any], device: str = "cpu", kernel: str = "auto", pool: Any = None,
) -> dict[Policy, MeasuredPolicy]:  # fmt: skip
    """Every plan routed, checked and timed on one pool of W ranks (`pool`, else a new one),
    in interleaved order over `settings["rounds"]` rounds (default 1) so the machine's drift
    falls on every policy alike. RunFailure when a routed group fails its check."""
    from cpbench.bench.pool import WorkerPool, WorldSpec  # noqa: PLC0415

    costs = SequenceCosts(problem, profile)
    steps = {name: routed(plan, costs, kernel) for name, plan in plans.items()}
    own = pool is None
    pool = pool or WorkerPool(WorldSpec(problem.world, device))
    samples: dict[Policy, list[float]] = {n: [] for n in plans}
    kept: dict[Policy, dict[str, Any]] = {}
    try:
        for round_ in range(int(settings.get("rounds", 1))):
            for name, step in steps.items():
                result = pool.run(run_routed_step_on_rank, step, settings, device,
                                  round_ == 0)[0]  # fmt: skip
                samples[name] += result["samples"]
                kept.setdefault(name, result)
    finally:
        if own:
            pool.close()
    measured = {
        name: MeasuredPolicy(plans[name], samples[name], kept[name]["busy_s"],
                             kept[name]["instrumented_s"], kept[name]["checks"])
        for name in plans
    }  # fmt: skip
    failed = {name: m.failed for name, m in measured.items() if m.failed}
    if failed:
        name, checks = next(iter(failed.items()))
        raise RunFailure(
            f"dynamic CP {name}: {len(checks)} routed group(s) failed the reference check, "
            f"e.g. micro-batch {checks[0]['micro_batch']} group {checks[0]['group']} "
            f"({checks[0].get('label')}): {checks[0].get('error') or checks[0].get('errors')}"
        )
    return measured
