"""The piece-free ring counts (`ring_counts`) equal the schedule built piece by piece."""

from __future__ import annotations

import random

import pytest

from cpbench.config import geometry
from cpbench.config.block_counts import CountingTooCostly, counting_budget, table_counts
from cpbench.config.geometry import pack, ring_counts, ring_schedule, schedule_counts
from cpbench.config.masks import MaskSpec
from cpbench.config.vocabulary import LAYOUTS
from cpbench.errors import CpbenchError
from tests.geometry_reference import (
    balance_score,
    balanced_shards,
    padded_spans,
    reference_balanced,
    zigzag_shards,
)

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)


def _documents(rng: random.Random, seq_len: int) -> tuple[int, ...]:
    """Lengths summing to seq_len: single tokens, short ones and some spanning ranks."""
    docs: list[int] = []
    while sum(docs) < seq_len:
        kind = rng.random()
        length = 1 if kind < 0.25 else rng.randint(2, 9) if kind < 0.8 else rng.randint(10, 90)
        docs.append(min(length, seq_len - sum(docs)))
    return tuple(docs)


def _cases() -> list[tuple[MaskSpec, int, int, int]]:
    rng = random.Random(39)
    cases = []
    for ring in (1, 2, 3, 4, 5, 8):
        for _ in range(6):
            seq_len = 2 * ring * rng.randint(1, 12)
            window = rng.choice([None, None, 1, 2, 3, 7, 20])
            docs = None if rng.random() < 0.2 else _documents(rng, seq_len)
            cases.append(
                (MaskSpec(documents=docs, window=window), seq_len, rng.choice([1, 2]), ring)
            )
        cases.append((MaskSpec(documents=(1,) * (2 * ring * 3)), 2 * ring * 3, 1, ring))
        cases.append((MaskSpec(causal=False), 2 * ring * 4, 1, ring))
    return cases


@pytest.mark.parametrize("case", _cases())
def test_counts_equal_the_pieces(case: tuple[MaskSpec, int, int, int]) -> None:
    mask, seq_len, ulysses, ring = case
    for layout in LAYOUTS:
        try:
            packing = pack(mask, seq_len, ulysses, ring, layout)
        except CpbenchError:
            continue
        exact = schedule_counts(ring_schedule(packing))
        assert ring_counts(packing) == exact, (layout, mask, seq_len, ulysses, ring)


def test_balanced_score_from_counts_picks_the_same_candidate() -> None:
    rng = random.Random(7)
    for ring in (2, 3, 4, 8):
        for _ in range(8):
            seq_len = 2 * ring * rng.randint(2, 16)
            mask = MaskSpec(documents=_documents(rng, seq_len), window=rng.choice([None, 5]))
            for long_doc in (1, 2, 2 * ring, seq_len // ring, seq_len + 1):
                shards = balanced_shards(mask, seq_len, ring, long_doc)
                schedule = geometry._schedule(mask, shards, ring)
                counts = geometry._counts(mask, geometry.shards_table(shards))
                assert geometry.counts_score(counts) == (
                    balance_score(schedule),
                    schedule.steps,
                )


def test_balanced_placement_equals_the_chunk_by_chunk_one() -> None:
    rng = random.Random(11)
    for ring in (1, 2, 3, 4, 8):
        for _ in range(10):
            seq_len = 2 * ring * rng.randint(1, 20)
            docs = _documents(rng, seq_len) if rng.random() < 0.8 else (seq_len,)
            mask = MaskSpec(documents=docs, window=rng.choice([None, 1, 4]))
            for long_doc in (1, 2, 3, 2 * ring, seq_len // ring, seq_len + 1):
                expected = reference_balanced(mask, seq_len, ring, long_doc)
                assert balanced_shards(mask, seq_len, ring, long_doc) == expected


def test_doc_zigzag_shards_equal_one_zigzag_of_all_spans() -> None:
    rng = random.Random(5)
    for ring in (1, 2, 3, 4, 8):
        for ulysses in (1, 2, 3, 4):
            seq_len = 2 * ring * ulysses * rng.randint(1, 12)
            mask = MaskSpec(documents=_documents(rng, seq_len))
            spans = padded_spans(mask.documents or (), ulysses, ring)
            starts = [0]
            for d, p in spans:
                starts.append(starts[-1] + d + p)
            whole = zigzag_shards(
                [(a, d + p) for a, (d, p) in zip(starts[:-1], spans, strict=True)], ring
            )
            packing = pack(mask, seq_len, ulysses, ring, "doc_zigzag")
            assert packing.shards == (whole if ring > 1 else packing.shards)
            assert packing.seq_len == starts[-1] or ring == 1
            if ring > 1:  # the padding tokens are documents of their own
                padded = tuple(x for d, p in spans for x in (d, p) if x)
                assert packing.mask.documents == padded


def test_counting_many_documents_holds_one_table_of_blocks() -> None:
    """table_counts sums each group of documents into one R x R table as it goes: 400 documents
    of distinct lengths under doc_zigzag at R = 64 are 400+ groups, whose blocks held at once
    (before the fix) took over 100 MB; one table is 9 x 64^2 int64 (0.3 MB) plus a group's own
    blocks. The bound leaves room for those and for numpy's temporaries."""
    import tracemalloc  # noqa: PLC0415 (only this test traces allocations)

    lengths = tuple(range(1000, 1400))  # distinct: no two documents share a group
    packing = pack(MaskSpec(documents=lengths), sum(lengths), 1, 64, "doc_zigzag")
    tracemalloc.start()
    try:
        counts = table_counts(packing.mask, packing.table)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert counts is not None
    assert sum(map(sum, counts.pairs)) >= sum(n * (n + 1) // 2 for n in lengths)
    assert peak < 40e6, f"peak {peak / 1e6:.0f} MB while counting"


def test_a_ranking_budget_refuses_a_schedule_too_costly_to_count() -> None:
    """Within `counting_budget`, counts that need more pairs of parts than it allows raise
    (with the number) instead of running for minutes; outside it the same packing counts."""
    lengths = tuple(range(100, 140))
    packing = pack(MaskSpec(documents=lengths), sum(lengths), 1, 16, "doc_zigzag")
    with counting_budget(100), pytest.raises(CountingTooCostly) as refused:
        table_counts(packing.mask, packing.table)
    assert refused.value.budget == 100
    # 40 documents and their padding, each at most 2R = 32 parts paired part by part
    needed = refused.value.part_pairs
    assert 100 < needed <= 2 * 40 * 32**2
    with counting_budget(needed):  # the budget is the pairs it needs: it counts
        counted = table_counts(packing.mask, packing.table)
    assert counted == schedule_counts(ring_schedule(packing))
