"""Memory as the allocator sees it: the tensors next to the reserve, Fujii et al.'s 80% margin,
and `--max-seq-len` (the longest sequence each plan holds under it)."""

from __future__ import annotations

import pytest

from cpbench.app.plan import PlanRequest, plan_training
from cpbench.config.constraints import seq_divisor
from cpbench.errors import CpbenchError
from cpbench.model.plan.memory import SAFE_MEMORY_FRACTION, attention_buffer_bytes, peak_stage
from cpbench.model.plan.search import PlanSearch, SearchSpace

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

CASE = ("llama3-8b", 262144, 16, 8)


def test_tensor_total_is_the_total_less_the_reserve() -> None:
    r = plan_training(PlanRequest(*CASE))
    for p in r.feasible:
        assert p.peak.tensor_total == pytest.approx(p.peak.total - 2 * 2**30, rel=1e-12)


def test_safe_margin_keeps_only_plans_within_80_percent() -> None:
    capacity = plan_training(PlanRequest(*CASE, keep=0))
    safe = plan_training(PlanRequest(*CASE, keep=0, memory_margin="safe"))
    cap = safe.profile.memory_bytes
    assert safe.feasible and all(p.peak.tensor_total <= SAFE_MEMORY_FRACTION * cap
                                 for p in safe.feasible)
    assert safe.counts is not None and capacity.counts is not None
    assert 0 < safe.counts.feasible < capacity.counts.feasible
    # the plans over 80% but within the capacity are the difference
    between = [p for p in capacity.feasible if p.peak.tensor_total > SAFE_MEMORY_FRACTION * cap]
    assert len(between) == capacity.counts.feasible - safe.counts.feasible


def test_longest_safe_sequence_is_the_bisection_edge() -> None:
    r = plan_training(PlanRequest(*CASE))
    w = r.feasible[0]
    assert 0 < w.max_seq_len_safe <= w.max_seq_len
    search = PlanSearch(SearchSpace(r.model, r.profile, 16, 8, CASE[1], r.global_batch,
                                    r.efficiency, r.reserve_bytes))
    per_token = attention_buffer_bytes(w.attention.candidate) / CASE[1]
    q = seq_divisor(w.par.ulysses, w.par.ring, w.par.layout)
    inside = peak_stage(search.memory(w.par, w.max_seq_len_safe, per_token)).tensor_total
    beyond = peak_stage(search.memory(w.par, w.max_seq_len_safe + q, per_token)).tensor_total
    limit = SAFE_MEMORY_FRACTION * r.profile.memory_bytes
    assert inside <= limit < beyond


def test_max_seq_len_ranks_by_the_longest_safe_sequence() -> None:
    every = plan_training(PlanRequest(*CASE, keep=0))
    longest = plan_training(PlanRequest(*CASE, rank_by="max_seq_len"))
    lengths = [p.max_seq_len_safe for p in longest.feasible]
    assert lengths == sorted(lengths, reverse=True)
    assert lengths[0] == max(p.max_seq_len_safe for p in every.feasible)


def test_bad_margin_is_refused() -> None:
    with pytest.raises(CpbenchError, match="memory margin 'tight' is not one of"):
        plan_training(PlanRequest(*CASE, memory_margin="tight"))
