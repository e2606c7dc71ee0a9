"""The pruned plan search against the exhaustive one: the same ranked top 10, the same shortest
CP, and lower bounds that are below every priced step (what makes the pruning exact)."""

from __future__ import annotations

import pytest

from cpbench.app.plan import PlanRequest, PlanResult, plan_training
from cpbench.model.plan.search import PlanSearch, SearchSpace, rank_seconds
from cpbench.model.plan.step import step_time_of_layer

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

CASES = [
    # (model, L, GPUs, GPUs per node, fixed CP): exhaustive pricing is O(R^2) in the ring
    # (cost.work's step matrix), so the 1,024-GPU cases fix CP (TP, PP, DP, U x R, recompute
    # are still searched)
    pytest.param(("llama3-8b", 131072, 64, 8, None), id="8b-128K-64gpu"),
    pytest.param(("mistral-7b", 32768, 32, 8, None), id="mistral-32K-32gpu"),
    pytest.param(("llama3-70b", 262144, 128, 8, None), id="70b-256K-128gpu"),
    pytest.param(("llama3-70b", 1048576, 1024, 8, 32), id="70b-1M-1024gpu-cp32"),
    pytest.param(("qwen2.5-7b", 524288, 1024, 8, 16), id="qwen7b-512K-1024gpu-cp16"),
    # the bounds hold with the features that change the pricing: tiers of a rail fabric, the
    # framework's attention with FP8 linears, uneven pipeline stages are not searched
    pytest.param(("llama3-8b", 131072, 64, 8, None, {"fabric": "hgx-rail"}), id="8b-rails"),
    pytest.param(("llama3-8b", 131072, 64, 8, None,
                  {"framework": "torchtitan", "linears": "fp8", "zero": 3}),
                 id="8b-torchtitan-fp8"),
    pytest.param(("llama3-8b", 131072, 64, 8, None, {"memory_margin": "safe"}), id="8b-safe"),
]


def _pair(case: tuple[object, ...]) -> tuple[PlanResult, PlanResult]:
    model, seq_len, gpus, per_node, cp = case[:5]
    extra: dict[str, object] = case[5] if len(case) > 5 else {}  # type: ignore[assignment]
    request = PlanRequest(model, seq_len, gpus, per_node, cp=cp, **extra)  # type: ignore[arg-type]
    pruned = plan_training(request)
    exhaustive = plan_training(PlanRequest(model, seq_len, gpus, per_node, cp=cp, keep=0,  # type: ignore[arg-type]
                                           **extra))
    return pruned, exhaustive


def _row(p: object) -> tuple[object, ...]:
    par = p.par  # type: ignore[attr-defined]
    return (par, p.time.total_s, p.peak.total, p.max_seq_len)  # type: ignore[attr-defined]


@pytest.mark.parametrize("case", CASES)
def test_pruned_search_ranks_the_same_top_10(case: tuple[object, ...]) -> None:
    pruned, exhaustive = _pair(case)
    assert exhaustive.counts is not None and exhaustive.counts.pruned == 0
    assert len(exhaustive.feasible) == exhaustive.counts.feasible >= 10
    assert [_row(p) for p in pruned.feasible] == [_row(p) for p in exhaustive.feasible[:10]]
    assert pruned.shortest_cp is not None and exhaustive.shortest_cp is not None
    assert _row(pruned.shortest_cp) == _row(exhaustive.shortest_cp)
    # the same plans fit and the same are over memory; the pruned search priced fewer
    assert pruned.counts is not None
    assert pruned.counts.feasible == exhaustive.counts.feasible
    assert pruned.counts.rejected_by_memory == exhaustive.counts.rejected_by_memory
    assert pruned.counts.priced + pruned.counts.pruned == pruned.counts.feasible


def test_bounds_are_below_every_priced_step() -> None:
    """The pruning is exact only if each plan's bound is at most its priced step."""
    r = plan_training(PlanRequest("llama3-8b", 131072, 64, 8, keep=0))
    search = PlanSearch(SearchSpace(r.model, r.profile, 64, 8, 131072, r.global_batch,
                                    r.efficiency, r.reserve_bytes))
    checked = 0
    tightest = float("inf")
    for p in r.feasible:
        fwd, bwd = search.mesh(p.par.tp, p.par.ulysses, p.par.ring).bound_s
        bound = step_time_of_layer(r.model, p.par, 131072, fwd, bwd, r.profile, 8,
                                   efficiency=r.efficiency).total_s
        assert bound <= p.time.total_s * (1 + 1e-12), p.par.label()
        assert rank_seconds(bound) <= rank_seconds(p.time.total_s)
        tightest = min(tightest, p.time.total_s / bound)
        checked += 1
    assert checked == len(r.feasible) > 50
    # the bound is close for the best plans (what lets it prune): within 5% for at least one
    assert tightest < 1.05


def test_pruning_prices_a_fraction_at_scale() -> None:
    """At 16,384 GPUs the search prices a small share of the plans that fit."""
    r = plan_training(PlanRequest("llama3-70b", 1048576, 16384, 8))
    assert r.counts is not None and len(r.feasible) == 10
    assert r.counts.feasible > 300
    assert r.counts.priced < r.counts.feasible / 4
    times = [p.time.total_s for p in r.feasible]
    assert times == sorted(times, key=rank_seconds)
