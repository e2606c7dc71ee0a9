"""The mask geometry's array forms equal their one-at-a-time references, exactly: run tables
(cpbench.config.run_table) and the shards they stand for, the band formulas on arrays, the
piece-free counts (cpbench.config.block_counts) on many documents of few lengths (the shape of
a packed data set: groups of many documents), with every signature hash colliding and with
documents of more parts than are paired at once, and the balanced placement
(cpbench.config.balanced) with its spills."""

from __future__ import annotations

import random

import numpy as np
import pytest

from cpbench.config import block_counts, geometry
from cpbench.config.bands import band_pairs, band_pairs_array, sum_clamped, sum_clamped_array
from cpbench.config.geometry import pack, ring_counts, ring_schedule, schedule_counts
from cpbench.config.masks import MaskSpec
from cpbench.config.run_table import joined, zigzag_table
from cpbench.config.vocabulary import LAYOUTS
from cpbench.errors import CpbenchError
from tests.geometry_reference import balanced_shards, merged, reference_balanced, zigzag_shards

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)


def _few_lengths(rng: random.Random, seq_len: int) -> tuple[int, ...]:
    """Lengths summing to seq_len drawn from two or three values (and a cut last one), now and
    then a long document among them."""
    values = [rng.randint(1, 12) for _ in range(rng.randint(2, 4))]
    docs: list[int] = []
    while sum(docs) < seq_len:
        length = rng.randint(seq_len // 8, seq_len // 2) if rng.random() < 0.05 else None
        docs.append(min(length or rng.choice(values), seq_len - sum(docs)))
    return tuple(docs)


def _cases(seed: int, count: int) -> list[tuple[MaskSpec, int, int, int]]:
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        ring = rng.choice([2, 3, 4, 8])
        seq_len = 2 * ring * rng.randint(8, 40)
        window = rng.choice([None, None, 1, 2, 3, 5, 7, 16, 200])
        mask = MaskSpec(documents=_few_lengths(rng, seq_len), window=window)
        cases.append((mask, seq_len, rng.choice([1, 2]), ring))
    return cases


def test_band_arrays_equal_the_python_formulas() -> None:
    rng = np.random.default_rng(3)
    a, n, cap = rng.integers(-40, 40, 5000), rng.integers(0, 30, 5000), rng.integers(0, 30, 5000)
    expected = [sum_clamped(*map(int, x)) for x in zip(a, n, cap, strict=True)]
    assert sum_clamped_array(a, n, cap).tolist() == expected
    rows, cols = rng.integers(1, 20, 5000), rng.integers(1, 20, 5000)
    lo, hi = rng.integers(-40, 40, 5000), rng.integers(-40, 40, 5000)
    # an offset beyond the rectangle is the missing bound (None) of the Python formula
    lo_none = [None if x <= -(r - 1) else int(x) for x, r in zip(lo, rows, strict=True)]
    hi_none = [None if x >= c - 1 else int(x) for x, c in zip(hi, cols, strict=True)]
    expected = [
        band_pairs(int(r), int(c), x, y)
        for r, c, x, y in zip(rows, cols, lo_none, hi_none, strict=True)
    ]
    assert band_pairs_array(rows, cols, lo, hi).tolist() == expected


def test_joined_runs_are_the_shards_merged_run_by_run() -> None:
    rng = random.Random(8)
    for _ in range(200):
        ring = rng.randint(1, 5)
        cuts = sorted(rng.sample(range(1, 120), rng.randint(0, 30)))
        spans = [(a, b - a) for a, b in zip([0, *cuts], [*cuts, 120], strict=True)]
        spans = [s for s in spans if rng.random() < 0.9]  # holes: positions on no rank
        ranks = [rng.randrange(ring) for _ in spans]
        order = list(range(len(spans)))
        rng.shuffle(order)
        table = joined(
            np.array([spans[i][0] for i in order], dtype=np.int64),
            np.array([spans[i][1] for i in order], dtype=np.int64),
            np.array([ranks[i] for i in order], dtype=np.int64),
            ring,
        )
        expected = tuple(
            merged(sorted((s, n, 1) for (s, n), r in zip(spans, ranks, strict=True) if r == j))
            for j in range(ring)
        )
        shards = geometry.table_shards(table)
        assert shards == expected
        assert geometry.table_shards(geometry.shards_table(shards)) == shards
        assert table.tokens() == tuple(sum(r.length for r in s) for s in shards)
        local = table.local_offsets().tolist()
        for start, rank, offset in zip(
            table.start.tolist(), table.rank.tolist(), local, strict=True
        ):
            before = [r for r in shards[rank] if r.start < start]
            assert offset == sum(r.length for r in before)


def test_zigzag_table_is_the_zigzag_chunk_by_chunk() -> None:
    rng = random.Random(4)
    for _ in range(100):
        ring = rng.randint(1, 6)
        lengths = [rng.randint(1, 40) for _ in range(rng.randint(1, 12))]
        starts = list(np.cumsum([0, *lengths])[:-1])
        got = geometry.table_shards(zigzag_table(starts, lengths, ring))
        assert got == zigzag_shards(list(zip(starts, lengths, strict=True)), ring)


def _assert_counts_are_the_schedules(mask: MaskSpec, seq_len: int, ulysses: int, ring: int) -> None:
    for layout in LAYOUTS:
        try:
            packing = pack(mask, seq_len, ulysses, ring, layout)
        except CpbenchError:
            continue
        exact = schedule_counts(ring_schedule(packing))
        assert ring_counts(packing) == exact, (layout, mask, seq_len, ulysses, ring)


@pytest.mark.parametrize("case", _cases(39, 24))
def test_counts_of_many_documents_of_few_lengths(case: tuple[MaskSpec, int, int, int]) -> None:
    _assert_counts_are_the_schedules(*case)


def test_counts_exact_when_every_signature_hash_collides(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hash that puts every document in one group: the check finds the documents that differ
    and the signatures are compared whole, so the counts stay exact."""
    calls = []
    exact = block_counts._exact_groups

    def colliding(fields: tuple, index: np.ndarray, first: np.ndarray, heads: tuple) -> np.ndarray:
        return np.zeros(len(first), dtype=np.uint64)

    def counted(*args: np.ndarray) -> np.ndarray:
        calls.append(len(args[1]))
        return exact(*args)

    monkeypatch.setattr(block_counts, "_signature_hash", colliding)
    monkeypatch.setattr(block_counts, "_exact_groups", counted)
    for case in _cases(40, 8):
        geometry.pack.cache_clear()
        geometry._best_balanced.cache_clear()
        _assert_counts_are_the_schedules(*case)
    assert calls  # the signatures were compared whole
    geometry.pack.cache_clear()
    geometry._best_balanced.cache_clear()


def test_counts_exact_a_slice_of_parts_and_a_row_of_ranks_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pieces of a document's parts a few query parts at a time, the origin shifts of a group a
    rank at a time: what a document of thousands of parts, or a group of many documents on many
    ranks, is counted with."""
    monkeypatch.setattr(block_counts, "PAIRS_AT_ONCE", 8)
    monkeypatch.setattr(block_counts, "CELLS_AT_ONCE", 8)
    for case in _cases(41, 8):
        geometry.pack.cache_clear()
        geometry._best_balanced.cache_clear()
        _assert_counts_are_the_schedules(*case)
    geometry.pack.cache_clear()
    geometry._best_balanced.cache_clear()


def test_balanced_placement_of_many_documents_equals_the_piece_by_piece_one() -> None:
    for mask, seq_len, _, ring in _cases(42, 30):
        shard = seq_len // ring
        for long_doc in (1, 3, 2 * ring, shard // 4, shard, seq_len + 1):
            expected = reference_balanced(mask, seq_len, ring, long_doc)
            got = balanced_shards(mask, seq_len, ring, long_doc)
            assert got == expected, (mask, seq_len, ring, long_doc)
