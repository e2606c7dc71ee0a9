"""Prefill with a cached prefix (pass-KV, pass-Q, all-gather, Ulysses): outputs against the
float64 reference on 2 and 4 gloo ranks, bytes sent against the analytic model, the model's
arithmetic and its pass-KV / pass-Q crossover."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cpbench.bench.inference_verify import (
    decode_case,
    default_decode_cases,
    default_prefill_cases,
    prefill_case,
    run_inference_cases_on_rank,
)
from cpbench.bench.pool import WorkerPool
from cpbench.errors import CpbenchError
from cpbench.model.inference import (
    PREFILL_SCHEMES,
    cache_shard_len,
    cache_visible,
    kv_cache_bytes_per_rank,
    longest_context,
    prefill_bytes,
    prefill_imbalance,
    prefill_pairs_per_rank,
    split_sizes,
    split_starts,
)
from tests.inference_tasks import decode_with_wrong_offset, prefill_with_wrong_offset

Pool = Callable[[int], WorkerPool]


@pytest.mark.parametrize("world", [2, 4])
def test_every_prefill_case_matches_the_reference_and_the_bytes(pool: Pool, world: int) -> None:
    cases = default_prefill_cases(world)
    records = pool(world).run(run_inference_cases_on_rank, cases, timeout=300)[0]
    assert len(records) == len(cases)
    assert {r["scheme"] for r in records} == set(PREFILL_SCHEMES)
    assert {(r["cached_len"], r["new_tokens"]) for r in records} >= {(0, 1), (5, 1)}
    for r in records:
        assert "error" not in r, r
        assert r["max_error"] <= r["tolerance"], r["label"]
        assert r["bytes"] == r["analytic_bytes"], r["label"]
        assert r["passed"], r["label"]


def test_a_wrong_cache_offset_fails_the_check(pool: Pool) -> None:
    """The same judge rejects every scheme's prefill when its pieces are masked top-left (the
    cached keys hidden from all but the first queries, as with cache offset 0), by far."""
    cases = [
        prefill_case(s, 2, cached_len=p, new_tokens=t)
        for s in PREFILL_SCHEMES
        for p, t in ((8, 4), (33, 1), (3, 9))
    ]
    records = pool(2).run(prefill_with_wrong_offset, cases, timeout=120)[0]
    for r in records:
        assert r["passed"] is False, r["label"]
        assert r["max_error"] > 100 * r["tolerance"], r["label"]


def test_shards_split_like_tensor_split() -> None:
    assert split_sizes(5, 4) == (2, 1, 1, 1)
    assert split_sizes(1, 4) == (1, 0, 0, 0)
    assert split_starts(5, 4) == (0, 2, 3, 4, 5)
    with pytest.raises(CpbenchError, match="cannot split"):
        split_sizes(3, 0)


def test_prefill_bytes_by_hand() -> None:
    """W = 4, P = 4096, T = 64, 8 heads over 2 KV heads, d 64, fp32: the chunk is
    (1024 + 16) tokens x 2 x 2 heads x 64 x 4 B, the query block 16 x 8 x 64 x 4 B."""
    kv = prefill_case("pass_kv", 4, 4096, 64, kv_heads=2, head_dim=64)
    assert prefill_bytes(kv) == {"p2p_kv": 3 * 1040 * 2 * 2 * 64 * 4}
    ag = prefill_case("all_gather", 4, 4096, 64, kv_heads=2, head_dim=64)
    assert prefill_bytes(ag) == {"allgather_kv": 3 * 1040 * 2 * 2 * 64 * 4}
    q = prefill_case("pass_q", 4, 4096, 64, kv_heads=2, head_dim=64)
    assert prefill_bytes(q) == {
        "p2p_q": 3 * 16 * 8 * 64 * 4,
        "a2a_out": 3 * 16 * 8 * 64 * 4,
        "a2a_lse": 3 * 8 * 16 * 4,
    }
    u = prefill_case("ulysses", 4, 4096, 64, kv_heads=2, head_dim=64)  # KV heads 2 -> 4
    assert prefill_bytes(u) == {
        "a2a_q": 16 * 8 * 64 * 4 * 3 // 4,
        "a2a_kv": 1040 * 2 * 4 * 64 * 4 * 3 // 4,
        "a2a_out": 16 * 8 * 64 * 4 * 3 // 4,
    }


def test_bad_prefill_cases_name_the_rule() -> None:
    with pytest.raises(CpbenchError, match="new_tokens >= 1"):
        prefill_case("pass_kv", 2, 8, 0)
    with pytest.raises(CpbenchError, match="not one of"):
        prefill_case("pass_k", 2, 8, 1)
    with pytest.raises(CpbenchError, match="multiples of it"):
        prefill_case("ulysses", 4, 8, 1, heads=6, kv_heads=6)


def test_verify_runs_the_prefill_cases_after_the_training_ones() -> None:
    """`run_verify(..., inference=True)` (what `cpbench verify --inference` calls): the
    prefill records follow the training ones, marked, every one passed with its bytes equal to
    the model's; an external impl is refused with the rule."""
    from cpbench.app.verify import run_verify  # noqa: PLC0415
    from cpbench.config.bench import VerifyCase  # noqa: PLC0415

    trained = VerifyCase(ring=2, heads=8, kv_heads=8, head_dim=16, seq_len=64, dtype="float32")
    records = run_verify(2, cases=[trained], inference=True, timeout=300)
    assert records[0].label == trained.label and records[0].inference is None
    records = records[1:]
    assert len(records) == len(default_prefill_cases(2)) + len(default_decode_cases(2))
    assert [r.inference for r in records].count("decode") == len(default_decode_cases(2))
    assert all(r.passed and r.bytes_match for r in records)
    with pytest.raises(CpbenchError, match="own prefill schemes only"):
        run_verify(2, cases=[], inference=True, impl="ring_flash_attn")


@pytest.mark.parametrize("world", [2, 4])
def test_every_decode_step_matches_the_reference_bytes_and_cache(pool: Pool, world: int) -> None:
    """1-8 new tokens over contiguous and interleaved caches: output within verify's bound,
    bytes sent equal to `decode_bytes`, and the largest cache shard's tensors exactly
    `kv_cache_bytes_per_rank` bytes."""
    cases = default_decode_cases(world)
    records = pool(world).run(run_inference_cases_on_rank, cases, timeout=300)[0]
    assert len(records) == len(cases)
    for r in records:
        assert "error" not in r, r
        assert r["max_error"] <= r["tolerance"], r["label"]
        assert r["bytes"] == r["analytic_bytes"], r["label"]
        assert r["cache_bytes"] == r["analytic_cache_bytes"], r["label"]


def test_decode_with_a_wrong_offset_fails(pool: Pool) -> None:
    """The decode check catches a top-left causal mask (each query of a shard sees only the
    keys up to its own row index): far outside the bound."""
    cases = [decode_case(layout, 2, 12, 3) for layout in ("contiguous", "interleaved")]
    records = pool(2).run(decode_with_wrong_offset, cases, timeout=120)[0]
    for r in records:
        assert r["passed"] is False and r["max_error"] > 100 * r["tolerance"], r["label"]


def test_cache_shards_and_capacity() -> None:
    """Interleaved shards hold positions r, r + W, ...; the visible prefix counts by hand."""
    assert [cache_shard_len(10, 4, r, "interleaved") for r in range(4)] == [3, 3, 2, 2]
    assert [cache_shard_len(10, 4, r, "contiguous") for r in range(4)] == [3, 3, 2, 2]
    assert cache_visible(10, 4, 1, "interleaved", 5) == 2  # positions 1, 5
    assert cache_visible(10, 4, 3, "interleaved", 2) == 0
    assert cache_visible(10, 4, 1, "contiguous", 4) == 2  # positions 3, 4 of 3..5
    assert kv_cache_bytes_per_rank(10, 4, 2, 64, "bfloat16") == 3 * 2 * 2 * 64 * 2
    # 80 GB, 8 KV heads x 128 x bf16 x 126 layers = 516096 B per token; x 8 ranks
    assert longest_context(80e9, 8, 8, 128, "bfloat16", 126) == (80_000_000_000 // 516096) * 8
    with pytest.raises(CpbenchError, match="1 <= new_tokens <= 8"):
        decode_case("interleaved", 2, 4, 9)


def test_prefill_work_per_rank_sums_to_the_causal_pairs() -> None:
    """Pairs per rank sum to T P + T (T + 1) / 2 for every split (uneven ones included); the
    imbalance of contiguous new-token shards by hand: W = 2, T = P = 8: rank 0 sees 4 x 8 +
    (1 + 2 + 3 + 4), rank 1 4 x 8 + 4 x 4 + 10."""
    for p, t, w in ((0, 1, 4), (5, 3, 4), (2048, 32, 2), (100, 77, 8)):
        assert sum(prefill_pairs_per_rank(p, t, w)) == t * p + t * (t + 1) // 2
    assert prefill_pairs_per_rank(8, 8, 2) == (42, 58)
    assert prefill_imbalance(8, 8, 2) == pytest.approx(58 / 50, abs=1e-12)
    assert prefill_imbalance(131072, 1024, 8) < 1.01
