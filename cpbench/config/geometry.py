"""Mask geometry: where each ring rank's tokens are, and which (query, key) blocks attend.

Shards, packings, layouts, pieces and schedules: docs/design.md section 1. The shards are
built as arrays (`cpbench.config.run_table`, the balanced placement in `.balanced`) and counted
without their pieces (`.block_counts`); their `Run`s and pieces are made when asked for."""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

from cpbench.config.balanced import balanced_table
from cpbench.config.bands import band_pairs, sum_clamped
from cpbench.config.block_counts import RingCounts, table_counts
from cpbench.config.constraints import seq_divisor
from cpbench.config.masks import MaskSpec
from cpbench.config.run_table import (
    RunTable,
    concatenated,
    document_arrays,
    table_of_runs,
    zigzag_table,
)
from cpbench.config.vocabulary import LAYOUTS, Layout
from cpbench.errors import CpbenchError


@dataclass(frozen=True)
class Run:
    """Positions start, start + stride, ..., (length of them)."""

    start: int
    """First global position."""
    length: int
    """Number of positions."""
    stride: int = 1
    """Distance between consecutive positions (1 contiguous, R striped)."""

    @property
    def last(self) -> int:
        return self.start + (self.length - 1) * self.stride

    def positions(self) -> range:
        return range(self.start, self.last + 1, self.stride)


Shard = tuple[Run, ...]
"""One ring rank's token positions, in the order it holds them (increasing)."""


@dataclass(frozen=True)
class Piece:
    """One kernel call: local rows [q_start, q_end) x local keys [k_start, k_end), visible
    where lo <= j - i <= hi (piece coordinates; None unbounded)."""

    q_start: int
    q_end: int
    k_start: int
    k_end: int
    lo: int | None
    """Lowest visible j - i (a sliding window's far edge); None = no lower bound."""
    hi: int | None
    """Highest visible j - i (the causal diagonal); None = no upper bound."""

    @property
    def rows(self) -> int:
        return self.q_end - self.q_start

    @property
    def cols(self) -> int:
        return self.k_end - self.k_start

    @property
    def is_full(self) -> bool:
        return self.lo is None and self.hi is None

    @property
    def is_causal(self) -> bool:
        """Top-left causal: row i sees columns 0..i."""
        return self.lo is None and self.hi == 0

    @property
    def pairs(self) -> int:
        """Visible (query, key) pairs, counted exactly."""
        return band_pairs(self.rows, self.cols, self.lo, self.hi)

    def visible(self, i: int, j: int) -> bool:
        """Piece-local visibility (for tests and the dense masks of kernels that need one)."""
        d = j - i
        return (self.lo is None or d >= self.lo) and (self.hi is None or d <= self.hi)


def _crop(
    rows: int, cols: int, lo: int | None, hi: int | None
) -> tuple[int, int, int, int, int | None, int | None] | None:
    """The band's tight bounding box (r0, r1, c0, c1) and its offsets there, normalised (an
    offset that no cell reaches becomes None); None when no cell is visible."""
    if rows <= 0 or cols <= 0 or (lo is not None and hi is not None and lo > hi):
        return None
    r0 = 0 if hi is None else max(0, -hi)
    r1 = rows if lo is None else min(rows, cols - lo)
    if r0 >= r1:
        return None
    c0 = 0 if lo is None else max(0, r0 + lo)
    c1 = cols if hi is None else min(cols, r1 + hi)
    if c0 >= c1:
        return None
    shift = c0 - r0
    nq, nk = r1 - r0, c1 - c0
    new_lo = None if lo is None or lo - shift <= -(nq - 1) else lo - shift
    new_hi = None if hi is None or hi - shift >= nk - 1 else hi - shift
    return r0, r1, c0, c1, new_lo, new_hi


# ---------------------------------------------------------------------------------- pieces


def _index_range(run: Run, start: int, stop: int) -> tuple[int, int]:
    """Local indices i of `run` whose position lies in [start, stop)."""
    # ceil((start - first) / stride) as floor division, inline: the schedule calls this
    # millions of times for a packed sequence
    first, stride, length = run.start, run.stride, run.length
    i0 = min(max(-((first - start) // stride), 0), length)
    i1 = min(max(-((first - stop) // stride), 0), length)
    return i0, max(i0, i1)


def _run_pieces(mask: MaskSpec, q: Run, q_off: int, k: Run, k_off: int) -> list[Piece]:
    """The pieces between one query run and one key run (mask with explicit documents)."""
    if not mask.causal:
        return [Piece(q_off, q_off + q.length, k_off, k_off + k.length, None, None)]
    if q.stride != k.stride:
        raise CpbenchError(f"runs of strides {q.stride} and {k.stride} cannot be paired")
    if k.start > q.last:  # every key after every query
        return []
    if mask.window is not None and q.start - k.last >= mask.window:  # every key too far back
        return []
    s = q.stride
    delta = q.start - k.start
    hi_all = delta // s
    lo_all = None if mask.window is None else (delta - mask.window) // s + 1
    starts = mask.starts
    docs = mask.documents or ()
    first = bisect.bisect_right(starts, max(q.start, k.start)) - 1
    last = bisect.bisect_right(starts, min(q.last, k.last)) - 1
    pieces = []
    for d in range(first, last + 1):
        lo_pos, hi_pos = starts[d], starts[d] + docs[d]
        i0, i1 = _index_range(q, lo_pos, hi_pos)
        j0, j1 = _index_range(k, lo_pos, hi_pos)
        if i0 >= i1 or j0 >= j1:
            continue
        shift = j0 - i0
        lo = None if lo_all is None else lo_all - shift
        box = _crop(i1 - i0, j1 - j0, lo, hi_all - shift)
        if box is None:
            continue
        r0, r1, c0, c1, b_lo, b_hi = box
        pieces.append(
            Piece(q_off + i0 + r0, q_off + i0 + r1, k_off + j0 + c0, k_off + j0 + c1, b_lo, b_hi)
        )
    return pieces


def _coalesce(pieces: list[Piece]) -> list[Piece]:
    """One piece for the lot when their union is exactly one band over their bounding box (a
    zigzag shard's own block is one causal call, not three)."""
    if len(pieces) < 2:
        return pieces
    q0, q1 = min(p.q_start for p in pieces), max(p.q_end for p in pieces)
    k0, k1 = min(p.k_start for p in pieces), max(p.k_end for p in pieces)
    los, his = [], []
    for p in pieces:
        shift = (p.k_start - k0) - (p.q_start - q0)
        # An unbounded offset is bounded by the piece's own rectangle.
        los.append((-(p.rows - 1) if p.lo is None else p.lo) + shift)
        his.append((p.cols - 1 if p.hi is None else p.hi) + shift)
    lo, hi = min(los), max(his)
    if band_pairs(q1 - q0, k1 - k0, lo, hi) != sum(p.pairs for p in pieces):
        return pieces
    box = _crop(q1 - q0, k1 - k0, lo, hi)
    if box is None:  # unreachable: the pieces are not empty
        return pieces
    r0, r1, c0, c1, b_lo, b_hi = box
    return [Piece(q0 + r0, q0 + r1, k0 + c0, k0 + c1, b_lo, b_hi)]


def block_pieces(mask: MaskSpec, q_shard: Shard, k_shard: Shard) -> tuple[Piece, ...]:
    """The kernel calls of a query shard against a key shard (both of one packed sequence,
    `mask` with explicit documents); empty when no pair is visible. A shard's runs are
    disjoint and in increasing order, so the key runs a query run can see (keys from the
    start of its first query's document, or its window, up to its last query) are one range
    of them, found by bisection."""
    pieces: list[Piece] = []
    k_offsets = list(itertools.accumulate((k.length for k in k_shard), initial=0))
    k_starts = [k.start for k in k_shard]
    k_lasts = [k.last for k in k_shard]
    q_off = 0
    for q in q_shard:
        if mask.causal:
            lowest = mask.starts[mask.document_of(q.start)]
            if mask.window is not None:
                lowest = max(lowest, q.start - mask.window + 1)
            first = bisect.bisect_left(k_lasts, lowest)
            last = bisect.bisect_right(k_starts, q.last)
        else:
            first, last = 0, len(k_shard)
        for i in range(first, last):
            pieces.extend(_run_pieces(mask, q, q_off, k_shard[i], k_offsets[i]))
        q_off += q.length
    return tuple(_coalesce(pieces))


# -------------------------------------------------------------------------------- packings


@dataclass(frozen=True)
class Packing:
    """The packed sequence as it runs on a ring of R: documents (padding included) and each
    ring rank's shard."""

    mask: MaskSpec
    """The mask as run: documents explicit, padding documents included."""
    seq_len: int
    """Tokens as run: the sequence length plus the padding."""
    padding: int
    """Padding tokens the layout added (doc_zigzag only)."""
    layout: Layout
    ring: int
    table: RunTable = field(repr=False, compare=False)
    """The shards as arrays: every rank's runs in position order."""

    @cached_property
    def shards(self) -> tuple[Shard, ...]:
        """Ring rank j's positions (built from `table` when first asked for)."""
        return table_shards(self.table)

    @cached_property
    def counts(self) -> RingCounts:
        """`ring_counts`, once per packing."""
        return _counts(self.mask, self.table)


def table_shards(table: RunTable) -> tuple[Shard, ...]:
    """The shards of a run table."""
    return tuple(tuple(Run(s, n, table.stride) for s, n in runs) for runs in table.per_rank())


def shards_table(shards: tuple[Shard, ...]) -> RunTable:
    """The run table of shards (their runs of one stride)."""
    return table_of_runs([[(r.start, r.length, r.stride) for r in s] for s in shards])


def row_work(mask: MaskSpec, start: int, stop: int) -> int:
    """Keys visible from the queries at positions [start, stop), summed (exact)."""
    if not mask.causal:
        return (stop - start) * sum(mask.documents or ())
    total = 0
    starts, docs = mask.starts, mask.documents or ()
    d = bisect.bisect_right(starts, start) - 1
    pos = start
    while pos < stop:
        doc_start, doc_stop = starts[d], starts[d] + docs[d]
        seg_stop = min(stop, doc_stop)
        # query at p sees min(p - doc_start + 1, W) keys
        a, n = pos - doc_start + 1, seg_stop - pos
        cap = mask.window if mask.window is not None else a + n
        total += sum_clamped(a, n, cap)
        pos, d = seg_stop, d + 1
    return total


@lru_cache(maxsize=64)
def _doc_zigzag_table(documents: tuple[int, ...], ring: int) -> RunTable:
    """doc_zigzag's shards of the documents, each padded to a multiple of 2R: what every
    Ulysses degree shares (only the final padding span depends on it)."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    lengths = document_arrays(documents)[1]
    padded = lengths - lengths % -(2 * ring)
    return zigzag_table(np.cumsum(padded) - padded, padded, ring)


def _padded_documents(
    documents: tuple[int, ...], ulysses: int, ring: int
) -> tuple[tuple[int, ...], int]:
    """doc_zigzag's documents as run: each followed by the padding document that makes it a
    multiple of 2R (when it is not one), and a final padding document of `extra` tokens that
    makes the ring shard a multiple of U; (the documents, extra)."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    lengths = document_arrays(documents)[1]
    pads = -lengths % (2 * ring)
    total = int(lengths.sum() + pads.sum())
    extra = 0
    while ((total + extra) // ring) % ulysses:
        extra += 2 * ring
    both = np.stack((lengths, pads), axis=1).ravel()
    return (*both[both > 0].tolist(), *([extra] if extra else [])), extra


def _global_table(seq_len: int, ring: int, layout: str) -> RunTable:
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    n = seq_len // ring
    if layout == "zigzag":
        return zigzag_table([0], [seq_len], ring)
    ranks = np.arange(ring, dtype=np.int64)
    if layout == "contiguous":
        return RunTable(ranks * n, np.full(ring, n), ranks, ring)
    return RunTable(ranks.copy(), np.full(ring, n), ranks, ring, stride=ring)


def check_packing(seq_len: int, ulysses: int, ring: int, layout: str) -> None:
    """The divisibility each layout needs of the (unpadded) sequence."""
    if layout not in LAYOUTS:
        raise CpbenchError(f"layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    divisor = seq_divisor(ulysses, ring, layout)
    if seq_len % divisor:
        raise CpbenchError(
            f"sequence length ({seq_len}) must be divisible by {divisor} for the {layout} layout "
            f"on ulysses ({ulysses}) x ring ({ring})"
        )


@lru_cache(maxsize=256)
def pack(mask: MaskSpec, seq_len: int, ulysses: int, ring: int, layout: Layout) -> Packing:
    """The packed sequence of `seq_len` tokens under `mask` and `layout` on a U x R mesh."""
    check_packing(seq_len, ulysses, ring, layout)
    mask = mask.for_length(seq_len)
    if ring == 1:
        return Packing(mask, seq_len, 0, layout, 1, shards_table(((Run(0, seq_len),),)))
    if layout == "doc_zigzag":
        docs, extra = _padded_documents(mask.documents or (seq_len,), ulysses, ring)
        run_mask = MaskSpec(causal=mask.causal, documents=docs, window=mask.window)
        total = sum(docs)
        table = _doc_zigzag_table(mask.documents or (seq_len,), ring)
        if extra:  # the final padding document
            table = concatenated(table, zigzag_table([total - extra], [extra], ring))
        return Packing(run_mask, total, total - seq_len, layout, ring, table)
    if layout == "balanced":
        return _best_balanced(mask, seq_len, ring, layout)
    return Packing(mask, seq_len, 0, layout, ring, _global_table(seq_len, ring, layout))


@lru_cache(maxsize=64)
def _best_balanced(mask: MaskSpec, seq_len: int, ring: int, layout: Layout) -> Packing:
    """The balanced candidate (over the long-document thresholds) with the least
    `counts_score`; once per ring, whatever the Ulysses degree."""
    shard = seq_len // ring
    thresholds = sorted({seq_len + 1, shard, max(shard // 2, 1), max(shard // 4, 1), 2 * ring})
    lengths = sorted(mask.documents or ())
    best: tuple[tuple[int, int], Packing, RingCounts] | None = None
    tried: set[int] = set()
    for long_doc in thresholds:
        # thresholds that find the same long documents build the same shards (the first of
        # equal scores is kept): each distinct candidate is built and scheduled once
        long_count = len(lengths) - bisect.bisect_left(lengths, long_doc)
        if long_count in tried:
            continue
        tried.add(long_count)
        table = balanced_table(mask, seq_len, ring, long_doc)
        packing = Packing(mask, seq_len, 0, layout, ring, table)
        counts = _counts(mask, table)
        score = counts_score(counts)
        if best is None or score < best[0]:
            best = (score, packing, counts)
    if best is None:  # unreachable: there is always a threshold
        raise CpbenchError(f"no balanced layout of {seq_len} tokens over {ring} ranks")
    _, packing, counts = best
    vars(packing)["counts"] = counts  # the cached_property's value, counted once
    return packing


# -------------------------------------------------------------------------------- schedule


@dataclass(frozen=True)
class RingSchedule:
    """Every ring rank's kernel calls at every ring step, and the steps the ring needs."""

    pieces: tuple[tuple[tuple[Piece, ...], ...], ...]
    """pieces[j][t]: ring rank j's calls at step t, on the chunk of ring rank (j - t) mod R."""
    steps: int
    """Ring steps needed: 1 + the last step at which any rank has a visible pair."""
    own_tokens: tuple[int, ...]
    """Tokens of each ring rank (its diagonal, for the continuum pair convention)."""
    causal: bool = True
    """Whether the mask is causal (every token sees itself: a diagonal)."""

    def pairs(self, ring_rank: int, step: int) -> int:
        """Exact visible pairs of a ring rank at a step."""
        return sum(p.pairs for p in self.pieces[ring_rank][step])


@lru_cache(maxsize=512)
def _schedule(mask: MaskSpec, shards: tuple[Shard, ...], ring: int) -> RingSchedule:
    """The schedule of `shards`, once per distinct sharding: the balanced layout's candidates
    often coincide (no document reaches two of its thresholds), and the one it keeps is the
    packing's `ring_schedule`."""
    table = tuple(
        tuple(block_pieces(mask, shards[j], shards[(j - t) % ring]) for t in range(ring))
        for j in range(ring)
    )
    needed = max((t for row in table for t, ps in enumerate(row) if ps), default=0) + 1
    own = tuple(sum(r.length for r in s) for s in shards)
    return RingSchedule(table, needed, own, mask.causal)


def ring_schedule(packing: Packing) -> RingSchedule:
    """The ring's schedule for a packing."""
    return _schedule(packing.mask, packing.shards, packing.ring)


CALL_COST_PAIRS = 64 * 64
"""What the balanced layout charges a kernel call, in attended pairs (a 64 x 64 block): the
launch and tiling overhead that makes many small calls slower than one large one."""


def rank_pairs(schedule: RingSchedule, continuum: bool = True) -> tuple[float, ...]:
    """Pairs per ring rank over all steps. `continuum`: a causal pair on the diagonal counts
    1/2 (the convention of `cpbench.model.flops`, so that one causal document sums to L^2/2)."""
    ring = len(schedule.pieces)
    out = []
    for j in range(ring):
        exact = sum(schedule.pairs(j, t) for t in range(schedule.steps))
        diag = schedule.own_tokens[j] / 2 if continuum and schedule.causal else 0.0
        out.append(exact - diag)
    return tuple(out)


# ------------------------------------------------------------------------ counts, no pieces


def schedule_counts(schedule: RingSchedule) -> RingCounts:
    """The counts of a schedule built piece by piece (the reference of `ring_counts`)."""
    ring = len(schedule.pieces)
    pairs = tuple(tuple(schedule.pairs(j, t) for t in range(ring)) for j in range(ring))
    calls = tuple(tuple(len(ps) for ps in row) for row in schedule.pieces)
    return RingCounts(pairs, calls, schedule.steps, schedule.own_tokens, schedule.causal)


def _counts(mask: MaskSpec, table: RunTable) -> RingCounts:
    """`schedule_counts(_schedule(...))` of the table's shards, without building the pieces
    where `table_counts` (cpbench.config.block_counts) knows the mask and the shards' shape."""
    counts = table_counts(mask, table)
    if counts is None:
        return schedule_counts(_schedule(mask, table_shards(table), table.ring))
    return counts


def counts_score(counts: RingCounts) -> tuple[int, int]:
    """What the balanced layout minimises, from a schedule's counts: (the ring's busiest-step
    work sum plus the busiest rank's kernel calls at `CALL_COST_PAIRS` each, steps)."""
    busiest = sum(max(row[t] for row in counts.pairs) for t in range(counts.steps))
    calls = max(sum(row) for row in counts.calls)
    return busiest + CALL_COST_PAIRS * calls, counts.steps


def ring_counts(packing: Packing) -> RingCounts:
    """The exact pairs, calls and steps of a packing's ring schedule, without its pieces."""
    return packing.counts
