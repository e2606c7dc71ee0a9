"""Prefill's new-token layouts (contiguous, zigzag: 2W head-tail chunks) and the decode merges
(all-gather, all-to-all to a head split): outputs against the float64 reference and bytes
against the model on 2 and 4 gloo ranks, the balanced split's work per rank against a
brute-force count of (query, key) pairs, its imbalance against contiguous, a planted wrong
chunk order caught by the reference check, and the cost model reading the same work."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from cpbench.bench.inference_verify import (
    decode_case,
    default_decode_cases,
    default_prefill_cases,
    prefill_case,
    run_inference_cases_on_rank,
)
from cpbench.bench.pool import WorkerPool
from cpbench.config.problem import CpProblem
from cpbench.errors import CpbenchError
from cpbench.model.hardware.loading import load_profile
from cpbench.model.inference import (
    DECODE_MERGES,
    NEW_TOKEN_LAYOUTS,
    PREFILL_SCHEMES,
    DecodeCase,
    PrefillCase,
    check_decode_merge,
    decode_bytes,
    new_token_segments,
    prefill_bytes,
    prefill_imbalance,
    prefill_kv_bytes_per_rank,
    prefill_pairs_per_rank,
)
from cpbench.model.inference_cost import price_decode, price_prefill
from tests.inference_layout_tasks import prefill_with_tail_first_chunks

Pool = Callable[[int], WorkerPool]


def layout_cases(world: int) -> list[PrefillCase | DecodeCase]:
    """Every scheme x both new-token layouts on T = 1, T < 2W (empty chunks), T with a
    remainder over 2W larger than W (a rank other than 0 holds the most: 7 on 2 ranks, 13 on
    4) and T = P; GQA 8/2; then decode over both cache layouts x both merges."""
    lengths = [(0, 1), (9, world + 1), (5, 6 * world + 1), (8 * world, 8 * world)]
    prefill: list[PrefillCase | DecodeCase] = [
        prefill_case(scheme, world, p, t, kv_heads=2, new_token_layout=layout)
        for layout in NEW_TOKEN_LAYOUTS
        for scheme in PREFILL_SCHEMES
        for p, t in lengths
    ]
    decode: list[PrefillCase | DecodeCase] = [
        decode_case(layout, world, p, t, kv_heads=kv, merge=merge)
        for merge in DECODE_MERGES
        for layout in ("contiguous", "interleaved")
        for p, t, kv in ((0, 1, 8), (4 * world + 3, 5, 1))
    ]
    return prefill + decode


@pytest.mark.parametrize("world", [2, 4])
def test_both_layouts_and_merges_match_the_reference_and_the_bytes(pool: Pool, world: int) -> None:
    cases = layout_cases(world)
    records = pool(world).run(run_inference_cases_on_rank, cases, timeout=300)[0]
    assert len(records) == len(cases)
    prefill = [r for r in records if r["inference"] == "prefill"]
    decode = [r for r in records if r["inference"] == "decode"]
    assert {(r["scheme"], r["new_token_layout"]) for r in prefill} == {
        (s, layout) for s in PREFILL_SCHEMES for layout in NEW_TOKEN_LAYOUTS
    }
    assert {r["merge"] for r in decode} == set(DECODE_MERGES)
    for r in records:
        assert "error" not in r, r
        assert r["max_error"] <= r["tolerance"], r["label"]
        assert r["bytes"] == r["analytic_bytes"], r["label"]
        assert r["passed"], r["label"]
    a2a = [r for r in decode if r["merge"] == "all_to_all"]
    assert all(set(r["bytes"]) == {"a2a_out", "a2a_lse"} for r in a2a)


def test_the_default_verify_lists_hold_both_layouts_and_merges() -> None:
    for world in (2, 4):
        prefill = default_prefill_cases(world)
        assert {c.new_token_layout for c in prefill} == set(NEW_TOKEN_LAYOUTS)
        for layout in NEW_TOKEN_LAYOUTS:  # the same matrix for each layout
            assert len([c for c in prefill if c.new_token_layout == layout]) == len(prefill) // 2
        assert {c.merge for c in default_decode_cases(world)} == set(DECODE_MERGES)


def brute_force_pairs(cached_len: int, new_tokens: int, world: int, layout: str) -> list[int]:
    """Per rank, the (query, key) pairs with key <= query, counted one by one; the rank's
    query positions from torch.tensor_split of the new offsets into W parts (contiguous) or 2W
    chunks of which rank r takes r and 2W - 1 - r (balanced)."""
    offsets = torch.arange(new_tokens)
    if layout == "contiguous":
        held = list(torch.tensor_split(offsets, world))
    else:
        chunks = torch.tensor_split(offsets, 2 * world)
        held = [torch.cat([chunks[r], chunks[2 * world - 1 - r]]) for r in range(world)]
    keys = range(cached_len + new_tokens)
    return [
        sum(1 for o in mine.tolist() for j in keys if j <= cached_len + o) for mine in held
    ]


@pytest.mark.parametrize("layout", NEW_TOKEN_LAYOUTS)
def test_pairs_per_rank_equal_a_brute_force_count(layout: str) -> None:
    for p, t, w in ((0, 1, 2), (0, 3, 4), (5, 7, 2), (3, 13, 4), (16, 16, 2), (0, 37, 4),
                    (11, 24, 8)):  # fmt: skip
        assert list(prefill_pairs_per_rank(p, t, w, layout)) == brute_force_pairs(p, t, w, layout)


def test_balanced_runs_are_the_tensor_split_chunks() -> None:
    """Rank r's runs are chunks r and 2W - 1 - r of torch.tensor_split(T, 2W), head first,
    empty chunks left out (T = 3 on 4 ranks: the last rank holds nothing)."""
    for t, w in ((5, 2), (7, 2), (13, 4), (3, 4), (64, 4)):
        chunks = torch.tensor_split(torch.arange(t), 2 * w)
        for r, runs in enumerate(new_token_segments(t, w, "zigzag")):
            mine = [c for c in (chunks[r], chunks[2 * w - 1 - r]) if len(c)]
            assert [(int(c[0]), len(c)) for c in mine] == list(runs)
    assert new_token_segments(3, 4, "zigzag")[3] == ()


def test_balanced_work_is_even_where_contiguous_is_not() -> None:
    """A fresh causal prompt (P = 0): contiguous gives the last rank (2W - 1) / W of the mean
    work; balanced exactly the mean when 2W divides T, and otherwise within the unevenness of
    2W chunks of T tokens (at most 1 + 2W / T: rank 0's one extra token per chunk), never
    worse than contiguous, over a grid of P, T, W."""
    assert prefill_imbalance(0, 4096, 4, "contiguous") == pytest.approx(7 / 4, abs=1e-3)
    assert prefill_imbalance(0, 4096, 4, "zigzag") == pytest.approx(1.0, abs=1e-12)
    assert prefill_imbalance(0, 4099, 4, "zigzag") == pytest.approx(1.0, abs=0.01)
    assert prefill_imbalance(8, 8, 2, "zigzag") == pytest.approx(1.0, abs=1e-12)  # 50, 50
    ratios = []
    for p in (0, 64, 1024):
        for t in (64, 257, 1024):
            for w in (2, 4, 8):
                balanced = prefill_imbalance(p, t, w, "zigzag")
                assert balanced <= 1 + 2 * w / t, (p, t, w)
                if t % (2 * w) == 0:
                    assert balanced == pytest.approx(1.0, abs=1e-12), (p, t, w)
                ratios.append(prefill_imbalance(p, t, w, "contiguous") / balanced)
    assert min(ratios) >= 1.0 and max(ratios) > 1.7


def test_bytes_pad_to_the_largest_balanced_shard_by_hand() -> None:
    """W = 2, T = 7: chunks 2, 2, 2, 1, so rank 0 holds 2 + 1 and rank 1 holds 2 + 2 (the
    largest); P = 3: cache shards 2, 1, so the padded K/V chunk is max(2 + 3, 1 + 4) = 5
    tokens (contiguous: 4 + 3 new, chunk 2 + 4 = 6). 8 / 2 heads, d 16, fp32."""
    kv = prefill_case("pass_kv", 2, 3, 7, kv_heads=2, new_token_layout="zigzag")
    assert (kv.q_block, kv.kv_block) == (4, 5)
    assert prefill_bytes(kv) == {"p2p_kv": 5 * 2 * 2 * 16 * 4}
    q = prefill_case("pass_q", 2, 3, 7, kv_heads=2, new_token_layout="zigzag")
    assert prefill_bytes(q) == {
        "p2p_q": 4 * 8 * 16 * 4, "a2a_out": 4 * 8 * 16 * 4, "a2a_lse": 8 * 4 * 4
    }  # fmt: skip
    contiguous = prefill_case("pass_kv", 2, 3, 7, kv_heads=2, new_token_layout="contiguous")
    assert prefill_bytes(contiguous) == {"p2p_kv": 6 * 2 * 2 * 16 * 4}
    assert prefill_case("pass_kv", 2, 3, 7).new_token_layout == "zigzag"  # the default
    with pytest.raises(CpbenchError, match="'striped' is not one of contiguous, zigzag"):
        prefill_case("pass_kv", 2, 3, 7, new_token_layout="striped")


def test_a_tail_first_chunk_order_fails_the_reference_check(pool: Pool) -> None:
    """Every scheme, ranks holding their balanced chunks tail first: the bytes are the same,
    the output is not (far outside the bound)."""
    cases = [
        prefill_case(s, 2, cached_len=p, new_tokens=t, new_token_layout="zigzag")
        for s in PREFILL_SCHEMES
        for p, t in ((8, 8), (0, 7))
    ]
    records = pool(2).run(prefill_with_tail_first_chunks, cases, timeout=120)[0]
    for r in records:
        assert r["bytes_match"] is True, r["label"]
        assert r["passed"] is False and r["max_error"] > 100 * r["tolerance"], r["label"]


def decode_heads(heads: int, world: int, rank: int) -> tuple[int, int]:
    """The heads [first, end) rank `rank` holds after an all_to_all merge: r H / W .. (r + 1)
    H / W (W must divide H: `check_decode_merge`)."""
    check_decode_merge("all_to_all", heads, world)
    per = heads // world
    return rank * per, (rank + 1) * per


def test_all_to_all_decode_bytes_heads_and_refusal() -> None:
    """8 heads, d 16, fp32, T = 2 on 4 ranks: a rank hands in 2 x 8 x 16 x 4 B of output and
    8 x 2 x 4 B of LSE and keeps its quarter; the all-gather receives 3 whole partials."""
    assert decode_bytes(2, 4, 8, 16, "float32", merge="all_to_all") == {
        "a2a_out": 2 * 8 * 16 * 4 * 3 // 4, "a2a_lse": 8 * 2 * 4 * 3 // 4
    }  # fmt: skip
    assert decode_bytes(2, 4, 8, 16, "float32") == {
        "allgather_out": 3 * 2 * 8 * 16 * 4, "allgather_lse": 3 * 8 * 2 * 4
    }  # fmt: skip
    assert [decode_heads(8, 4, r) for r in range(4)] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    with pytest.raises(CpbenchError, match="splits 6 heads over 4 ranks: 6 % 4 = 2"):
        decode_case("contiguous", 4, 8, 1, heads=6, kv_heads=6, merge="all_to_all")
    with pytest.raises(CpbenchError, match="decode merge 'reduce' is not one of"):
        decode_case("contiguous", 2, 8, 1, merge="reduce")


def test_the_cost_model_prices_the_layouts_work() -> None:
    """price_prefill's step is the busiest rank's pairs of `prefill_pairs_per_rank` for the
    layout it is given (balanced by default): on a fresh 128K prompt over 8 ranks the
    contiguous step is 15/8 of the balanced one; the all-to-all decode merge sends 1/W of
    the all-gather's bytes and prices them."""
    shape = CpProblem(seq_len=1, heads=32, kv_heads=8, head_dim=128, dtype="bfloat16")
    h100 = load_profile("h100-sxm")
    default = price_prefill("pass_kv", 0, 131072, shape, 8, h100)
    contiguous = price_prefill("pass_kv", 0, 131072, shape, 8, h100, new_token_layout="contiguous")
    pairs = {
        layout: max(prefill_pairs_per_rank(0, 131072, 8, layout)) for layout in NEW_TOKEN_LAYOUTS
    }
    assert contiguous.step_s / default.step_s == pytest.approx(
        pairs["contiguous"] / pairs["zigzag"], rel=1e-9
    )
    assert contiguous.step_s / default.step_s == pytest.approx(15 / 8, rel=1e-3)
    gather = price_decode(131072, shape, 8, h100)
    a2a = price_decode(131072, shape, 8, h100, merge="all_to_all")
    assert sum(a2a.bytes_sent.values()) * 8 == sum(gather.bytes_sent.values())
    assert a2a.comm_s < gather.comm_s and a2a.memory_s == gather.memory_s


def test_prefill_kv_bytes_are_the_fullest_ranks_cache_and_new_shards_by_hand() -> None:
    """P = T = 3 on 2 ranks, 2 KV heads x d 16 x fp32 = 128 B per token for K and V each:
    contiguous, rank 0 holds cache 2 + new 2 = 4 tokens (not ceil(6 / 2) = 3); zigzag (4 chunks
    of 1, 1, 1, 0: rank 0 chunks 0 and 3, rank 1 chunks 1 and 2), ranks hold 2 + 1 and 1 + 2."""
    per_token = 2 * 2 * 16 * 4
    contiguous = prefill_case("pass_kv", 2, 3, 3, kv_heads=2, new_token_layout="contiguous")
    assert prefill_kv_bytes_per_rank(contiguous) == 4 * per_token
    zigzag = prefill_case("pass_kv", 2, 3, 3, kv_heads=2, new_token_layout="zigzag")
    assert prefill_kv_bytes_per_rank(zigzag) == 3 * per_token
