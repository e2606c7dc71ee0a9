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
from cpbench.results.scenarios.dynamic import DynamicStudy
from cpbench.results.schema import (
    ConfigSection,
    DynamicChecks,
    DynamicGroupSection,
    DynamicSection,
    ResultRecord,
)


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


def measure_routed(
    problem: DynamicProblem, profile: HardwareProfile, plans: dict[Policy, PolicyPlan],
    settings: dict[str, Any], device: str = "cpu", kernel: str = "auto", pool: Any = None,
    timeout: float = 300.0,
) -> dict[Policy, MeasuredPolicy]:  # fmt: skip
    """Every plan routed, checked and timed on one pool of W ranks (`pool`: a `WorkerPool` or
    the sweep's world, else a new one), in interleaved order over `settings["rounds"]` rounds
    (default 1) so the machine's drift falls on every policy alike; `timeout` seconds per
    policy and round. A failed check is in the result (`MeasuredPolicy.failed`), not raised."""
    from cpbench.bench.pool import WorkerPool, WorldSpec  # noqa: PLC0415

    costs = SequenceCosts(problem, profile)
    steps = {name: routed(plan, costs, kernel) for name, plan in plans.items()}
    own = pool is None
    pool = WorkerPool(WorldSpec(problem.world, device)) if own else pool
    samples: dict[Policy, list[float]] = {n: [] for n in plans}
    kept: dict[Policy, dict[str, Any]] = {}
    try:
        for round_ in range(int(settings.get("rounds", 1))):
            for name, step in steps.items():
                result = pool.run(run_routed_step_on_rank, step, settings, device,
                                  round_ == 0, timeout=timeout)[0]  # fmt: skip
                samples[name] += result["samples"]
                kept.setdefault(name, result)
    finally:
        if own:
            pool.close()
    return {
        name: MeasuredPolicy(plans[name], samples[name], kept[name]["busy_s"],
                             kept[name]["instrumented_s"], kept[name]["checks"])
        for name in plans
    }  # fmt: skip


def measure_policies(
    problem: DynamicProblem, profile: HardwareProfile, plans: dict[Policy, PolicyPlan],
    settings: dict[str, Any], device: str = "cpu", kernel: str = "auto", pool: Any = None,
) -> dict[Policy, MeasuredPolicy]:  # fmt: skip
    """`measure_routed`; RunFailure when a routed group fails its check."""
    measured = measure_routed(problem, profile, plans, settings, device, kernel, pool)
    failed = {name: m.failed for name, m in measured.items() if m.failed}
    if failed:
        name, checks = next(iter(failed.items()))
        raise RunFailure(f"dynamic CP {name}: {failed_checks_line(checks)}")
    return measured


def failed_checks_line(checks: list[dict[str, Any]]) -> str:
    """What failed, in one line: how many routed groups and the first one's errors."""
    first = checks[0]
    return (
        f"{len(checks)} routed group(s) failed the reference check, e.g. micro-batch "
        f"{first['micro_batch']} group {first['group']} ({first.get('label')}): "
        f"{first.get('error') or first.get('skipped') or first.get('errors')}"
    )


def _checks(m: MeasuredPolicy) -> DynamicChecks:
    """The routed groups' checks summed up (the failures in words)."""
    errors = [float(c["max_error"]) for c in m.checks if c.get("max_error") is not None]
    ratios = [float(c["max_error"]) / float(c["tolerance"]) for c in m.checks
              if c.get("max_error") is not None and c.get("tolerance")]  # fmt: skip
    failures = [
        f"micro-batch {c['micro_batch']} group {c['group']} ({c.get('label')}): "
        f"{c.get('error') or c.get('skipped') or c.get('errors')}"
        for c in m.failed
    ]
    return DynamicChecks(
        groups=len(m.checks), passed=len(m.checks) - len(m.failed),
        max_abs_error=max(errors) if errors else None,
        max_error_ratio=max(ratios) if ratios else None, **({"failures": failures} if failures else {}),
    )  # fmt: skip


def study_config(study: DynamicStudy, nodes: int = 1) -> ConfigSection:
    """The record's config of a study's policy: the batch as one packed stream of its
    sequences (`documents`) over W ranks, scheme and layout "dynamic" (each policy meshes its
    groups its own way: `dynamic.micro_batches`)."""
    p = study.problem
    return ConfigSection(
        seq_len=sum(p.lengths), batch=1, heads=p.heads, kv_heads=p.kv_heads,
        head_dim=p.head_dim, dtype=p.dtype, causal=True, ulysses=1, ring=p.world,
        layout="dynamic", kv_replication=1, backend=study.backend, kernel=None,
        device=study.device, world_size=p.world, nodes=nodes, phase="fwd+bwd", scheme="dynamic",
        impl="cpbench", mask="document", documents=list(p.lengths),
    )  # fmt: skip


def _plan_section(plan: PolicyPlan, problem: DynamicProblem) -> list[list[DynamicGroupSection]]:
    return [
        [DynamicGroupSection(degree=g.degree, scheme=g.scheme, sequences=len(g.sequences),
                             tokens=sum(problem.lengths[i] for i in g.sequences),
                             predicted_s=g.predicted_s) for g in mb.groups]
        for mb in plan.micro_batches
    ]  # fmt: skip


def policy_record(
    study: DynamicStudy, policy: Policy, base: ResultRecord, plan: PolicyPlan | None,
    static: PolicyPlan | None, measured: MeasuredPolicy | None, reason: str | None = None,
) -> ResultRecord:  # fmt: skip
    """One policy's record: skipped with `reason` (its rule cannot plan the batch, or the
    measurement failed: `measured` None), else measured, failed when a routed group's check
    failed. `base` carries the id, scenario, time, config and environment."""
    record = base.model_copy(deep=True)
    if plan is None or measured is None:
        record.status = "skipped" if plan is None else "failed"
        record.error = reason
        return record
    p = study.problem
    interval = median_interval(measured.samples)
    record.dynamic = DynamicSection(
        study=study.key, policy=policy, lengths_source=study.source, sequences=len(p.lengths),
        step_tokens=study.step_tokens, tokens_per_rank=p.tokens_per_rank,
        static_cp=p.static_degree, hardware=study.hardware,
        degrees={str(d): n for d, n in plan.degrees.items()},
        micro_batches=_plan_section(plan, p), predicted_s=plan.step_s,
        predicted_static_s=static.step_s if static is not None else None,
        predicted_idle_share=1.0 - plan.busy_share, median_s=interval.median,
        ci_low=interval.low, ci_high=interval.high, samples=list(measured.samples),
        rounds=study.rounds, busy_s=list(measured.busy_s),
        instrumented_s=measured.instrumented_s, idle_share=measured.idle_share,
        checks=_checks(measured),
    )  # fmt: skip
    if measured.failed:
        record.status = "failed"
        record.error = f"result differs from the reference: {failed_checks_line(measured.failed)}"
    return record
