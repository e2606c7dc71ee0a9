"""Mask geometry: where each ring rank's tokens are, and which (query, key) blocks attend.

Shards, packings, layouts, pieces and schedules: docs/design.md section 1. Pure Python."""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from cpbench.config.constraints import seq_divisor
from cpbench.config.masks import MaskSpec
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


# ------------------------------------------------------------------------------ band counting


def _sum_clamped(a: int, n: int, cap: int) -> int:
    """sum_{i=0}^{n-1} min(max(a + i, 0), cap), cap >= 0."""
    if n <= 0:
        return 0
    i_zero = min(max(-a, 0), n)
    i_cap = min(max(cap - a, 0), n)
    i_cap = max(i_cap, i_zero)
    count = i_cap - i_zero
    linear = count * a + (i_zero + i_cap - 1) * count // 2
    return linear + (n - i_cap) * cap


def band_pairs(rows: int, cols: int, lo: int | None, hi: int | None) -> int:
    """Cells (i, j) of a rows x cols rectangle with lo <= j - i <= hi."""
    upper = rows * cols if hi is None else _sum_clamped(hi + 1, rows, cols)
    lower = 0 if lo is None else _sum_clamped(lo, rows, cols)
    return max(upper - lower, 0)


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
    shards: tuple[Shard, ...]
    """Ring rank j's positions."""

    @cached_property
    def counts(self) -> RingCounts:
        """`ring_counts`, once per packing (hashing a packed sequence's shards is not free)."""
        return _counts(self.mask, self.shards, self.ring)


def _merge_runs(runs: list[Run]) -> Shard:
    return _merged(sorted((r.start, r.length, r.stride) for r in runs))


def _merged(spans: list[tuple[int, int, int]]) -> Shard:
    """Runs from (start, length, stride) in increasing order, adjacent contiguous ones joined."""
    merged: list[tuple[int, int, int]] = []
    end = -1  # where the last run ends when it is contiguous, else -1
    for start, length, stride in spans:
        if stride == 1 and start == end:
            merged[-1] = (merged[-1][0], merged[-1][1] + length, 1)
        else:
            merged.append((start, length, stride))
        end = start + length if stride == 1 else -1
    return tuple(Run(*run) for run in merged)


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
        total += _sum_clamped(a, n, cap)
        pos, d = seg_stop, d + 1
    return total


def _zigzag_shards(starts_lengths: list[tuple[int, int]], ring: int) -> tuple[Shard, ...]:
    """Zigzag each span (start, length) over 2R chunks; ring rank j gets chunks j and 2R-1-j."""
    per_rank: list[list[tuple[int, int, int]]] = [[] for _ in range(ring)]
    for start, length in starts_lengths:
        chunk = length // (2 * ring)
        if chunk == 0:
            continue
        for j in range(ring):
            per_rank[j].append((start + j * chunk, chunk, 1))
            per_rank[j].append((start + (2 * ring - 1 - j) * chunk, chunk, 1))
    return tuple(_merged(sorted(spans)) for spans in per_rank)


@lru_cache(maxsize=64)
def _doc_zigzag_shards(documents: tuple[int, ...], ring: int) -> tuple[Shard, ...]:
    """doc_zigzag's shards of the documents, each padded to a multiple of 2R: what every
    Ulysses degree shares (only the final padding span depends on it)."""
    spans, start = [], 0
    for d in documents:
        spans.append((start, d - d % -(2 * ring)))
        start += spans[-1][1]
    return _zigzag_shards(spans, ring)


def _appended(first: tuple[Shard, ...], then: tuple[Shard, ...]) -> tuple[Shard, ...]:
    """Each rank's runs of `first` followed by those of `then` (all later), as `_merged`."""
    out = []
    for a, b in zip(first, then, strict=True):
        if a and b and a[-1].stride == b[0].stride == 1 and a[-1].last + 1 == b[0].start:
            joined = Run(a[-1].start, a[-1].length + b[0].length)
            out.append((*a[:-1], joined, *b[1:]))
        else:
            out.append(a + b)
    return tuple(out)


def _padded_spans(docs: tuple[int, ...], ulysses: int, ring: int) -> list[tuple[int, int]]:
    """doc_zigzag's spans: each document with the padding that makes it a multiple of 2R, and a
    final padding span that makes the ring shard a multiple of U; as (document, padding)."""
    spans = [(d, -d % (2 * ring)) for d in docs]
    total = sum(d + p for d, p in spans)
    extra = 0
    while ((total + extra) // ring) % ulysses:
        extra += 2 * ring
    if extra:
        spans.append((0, extra))
    return spans


def _place(
    mask: MaskSpec,
    start: int,
    length: int,
    rank: int,
    room: list[int],
    load: list[int],
    owned: list[list[tuple[int, int, int]]],
    doc_start: int,
) -> None:
    """Put positions [start, start+length) of the document at `doc_start` on `rank`, spilling
    what does not fit to the least-loaded ranks with room."""
    while length > 0:
        if room[rank] == 0:
            rank = min((r for r in range(len(room)) if room[r]), key=lambda r: (load[r], r))
        take = min(length, room[rank])
        owned[rank].append((start, take, 1))
        if mask.causal:  # row_work of positions inside one document
            a = start - doc_start + 1
            load[rank] += _sum_clamped(a, take, mask.window or a + take)
        else:
            load[rank] += row_work(mask, start, start + take)
        room[rank] -= take
        start, length = start + take, length - take


def _long_chunks(
    mask: MaskSpec, ring: int, long_doc: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The long documents' 2R chunks in placement order: (start, size, rank, document start,
    row_work) arrays."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    starts = np.asarray(mask.starts, dtype=np.int64)
    lengths = np.asarray(mask.documents, dtype=np.int64)
    keep = lengths >= long_doc
    starts, lengths = starts[keep], lengths[keep]
    c = np.arange(2 * ring, dtype=np.int64)
    sizes = lengths[:, None] // (2 * ring) + (c[None, :] < (lengths % (2 * ring))[:, None])
    offsets = starts[:, None] + np.cumsum(sizes, axis=1) - sizes
    ranks = np.broadcast_to(np.where(c < ring, c, 2 * ring - 1 - c), sizes.shape)
    doc_starts = np.broadcast_to(starts[:, None], sizes.shape)
    a, n = (offsets - doc_starts + 1).ravel(), sizes.ravel()
    if mask.window is None:  # sum of a .. a+n-1
        work = n * a + n * (n - 1) // 2
    else:  # _sum_clamped(a, n, W) for a >= 1
        capped = np.minimum(np.maximum(mask.window - a, 0), n)
        work = capped * a + capped * (capped - 1) // 2 + (n - capped) * mask.window
    return offsets.ravel(), n, ranks.ravel(), doc_starts.ravel(), work


def _balanced(mask: MaskSpec, seq_len: int, ring: int, long_doc: int) -> tuple[Shard, ...]:
    """Documents of at least `long_doc` tokens are cut into 2R near-equal chunks and zigzagged
    (their causal work is then equal on every rank and ring step); the others are kept whole
    where they fit, heaviest first on the least-loaded rank with room (LPT), a document that
    overflows a rank continuing on the next. Every rank ends with exactly L/R tokens."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    room, load = [seq_len // ring] * ring, [0] * ring
    owned: list[list[tuple[int, int, int]]] = [[] for _ in range(ring)]
    docs = list(zip(mask.starts, mask.documents or (), strict=True))
    if mask.causal:
        offsets, sizes, ranks, doc_starts, work = _long_chunks(mask, ring, long_doc)
        # the chunks before the first that overflows its rank go where they are sent, at once
        first = len(sizes)
        for r in range(ring):
            on_r = np.flatnonzero(ranks == r)
            over = np.flatnonzero(np.cumsum(sizes[on_r]) > room[r])
            if len(over):
                first = min(first, int(on_r[over[0]]))
        for r in range(ring):
            on_r = np.flatnonzero(ranks[:first] == r)
            on_r = on_r[sizes[on_r] > 0]
            owned[r].extend(
                zip(offsets[on_r].tolist(), sizes[on_r].tolist(), [1] * len(on_r), strict=True)
            )
            load[r] += int(work[on_r].sum())
            room[r] -= int(sizes[on_r].sum())
        tail = zip(*(x[first:].tolist() for x in (offsets, sizes, ranks, doc_starts)), strict=True)
        for offset, size, rank, start in tail:
            _place(mask, offset, size, rank, room, load, owned, start)
    else:
        for start, length in docs:
            if length < long_doc:
                continue
            base, extra = divmod(length, 2 * ring)
            offset = start
            for c in range(2 * ring):
                size = base + (1 if c < extra else 0)
                rank = c if c < ring else 2 * ring - 1 - c
                _place(mask, offset, size, rank, room, load, owned, start)
                offset += size
    short = [(start, length) for start, length in docs if length < long_doc]
    if mask.causal:  # a whole document's row_work
        short.sort(key=lambda d: (-_sum_clamped(1, d[1], mask.window or d[1] + 1), d[0]))
    else:
        short.sort(key=lambda d: (-row_work(mask, d[0], d[0] + d[1]), d[0]))
    for start, length in short:
        rank = min((r for r in range(ring) if room[r]), key=lambda r: (load[r], r))
        _place(mask, start, length, rank, room, load, owned, start)
    return tuple(_merged(sorted(spans)) for spans in owned)


def _global_shards(seq_len: int, ring: int, layout: str) -> tuple[Shard, ...]:
    n = seq_len // ring
    if layout == "contiguous":
        return tuple((Run(j * n, n),) for j in range(ring))
    if layout == "zigzag":
        return _zigzag_shards([(0, seq_len)], ring)
    return tuple((Run(j, n, ring),) for j in range(ring))


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
        return Packing(mask, seq_len, 0, layout, 1, ((Run(0, seq_len),),))
    if layout == "doc_zigzag":
        spans = _padded_spans(mask.documents or (seq_len,), ulysses, ring)
        docs = tuple(x for d, p in spans for x in (d, p) if x)
        run_mask = MaskSpec(causal=mask.causal, documents=docs, window=mask.window)
        starts = [0]
        for d, p in spans:
            starts.append(starts[-1] + d + p)
        core = _doc_zigzag_shards(mask.documents or (seq_len,), ring)
        shards = core
        if len(spans) > len(mask.documents or (seq_len,)):  # the final padding span
            shards = _appended(core, _zigzag_shards([(starts[-2], spans[-1][1])], ring))
        total = starts[-1]
        return Packing(run_mask, total, total - seq_len, layout, ring, shards)
    if layout == "balanced":
        return _best_balanced(mask, seq_len, ring, layout)
    return Packing(mask, seq_len, 0, layout, ring, _global_shards(seq_len, ring, layout))


@lru_cache(maxsize=64)
def _best_balanced(mask: MaskSpec, seq_len: int, ring: int, layout: Layout) -> Packing:
    """The balanced candidate (over the long-document thresholds) with the least
    `balance_score`; once per ring, whatever the Ulysses degree."""
    shard = seq_len // ring
    thresholds = sorted({seq_len + 1, shard, max(shard // 2, 1), max(shard // 4, 1), 2 * ring})
    best: tuple[tuple[int, int], Packing] | None = None
    tried: set[int] = set()
    for long_doc in thresholds:
        # thresholds that find the same long documents build the same shards (the first of
        # equal scores is kept): each distinct candidate is built and scheduled once
        long_count = sum(1 for d in mask.documents or () if d >= long_doc)
        if long_count in tried:
            continue
        tried.add(long_count)
        shards = _balanced(mask, seq_len, ring, long_doc)
        packing = Packing(mask, seq_len, 0, layout, ring, shards)
        score = counts_score(_counts(mask, shards, ring))
        if best is None or score < best[0]:
            best = (score, packing)
    if best is None:  # unreachable: there is always a threshold
        raise CpbenchError(f"no balanced layout of {seq_len} tokens over {ring} ranks")
    return best[1]


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


def busiest_step_sum(schedule: RingSchedule) -> int:
    """Sum over ring steps of the busiest rank's exact pairs: the work a synchronous ring
    computes for, when compute dominates."""
    ring = len(schedule.pieces)
    return sum(max(schedule.pairs(j, t) for j in range(ring)) for t in range(schedule.steps))


CALL_COST_PAIRS = 64 * 64
"""What the balanced layout charges a kernel call, in attended pairs (a 64 x 64 block): the
launch and tiling overhead that makes many small calls slower than one large one."""


def balance_score(schedule: RingSchedule) -> int:
    """What the balanced layout minimises: the ring's busiest-step work sum plus the busiest
    rank's kernel calls at `CALL_COST_PAIRS` each."""
    ring = len(schedule.pieces)
    calls = max(sum(len(ps) for ps in schedule.pieces[j]) for j in range(ring))
    return busiest_step_sum(schedule) + CALL_COST_PAIRS * calls


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


@dataclass(frozen=True)
class RingCounts:
    """A schedule's exact pairs and kernel calls per ring rank and step, without its pieces."""

    pairs: tuple[tuple[int, ...], ...]
    """pairs[j][t]: ring rank j's visible pairs at step t (`RingSchedule.pairs`)."""
    calls: tuple[tuple[int, ...], ...]
    """calls[j][t]: its kernel calls (len(RingSchedule.pieces[j][t]))."""
    steps: int
    own_tokens: tuple[int, ...]
    causal: bool = True


def schedule_counts(schedule: RingSchedule) -> RingCounts:
    """The counts of a schedule built piece by piece (the reference of `ring_counts`)."""
    ring = len(schedule.pieces)
    pairs = tuple(tuple(schedule.pairs(j, t) for t in range(ring)) for j in range(ring))
    calls = tuple(tuple(len(ps) for ps in row) for row in schedule.pieces)
    return RingCounts(pairs, calls, schedule.steps, schedule.own_tokens, schedule.causal)


def _parts(mask: MaskSpec, shards: tuple[Shard, ...], ring: int) -> tuple[Any, ...] | None:
    """Every (document, shard run) intersection as arrays (doc, rank, doc-local start, length,
    shard-local offset) in position order, and the stride; None for shards of another shape."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    doc_starts = np.asarray(mask.starts, dtype=np.int64)
    total = int(doc_starts[-1]) + (mask.documents or (0,))[-1]
    if all(len(s) == 1 and s[0].stride == ring > 1 for s in shards):  # striped
        if any(s[0].start != r or s[0].length * ring != total for r, s in enumerate(shards)):
            return None
        lengths = np.asarray(mask.documents, dtype=np.int64)
        ranks = np.arange(ring, dtype=np.int64)
        first = doc_starts[:, None] + (ranks[None, :] - doc_starts[:, None]) % ring
        count = np.maximum(-((first - (doc_starts + lengths)[:, None]) // ring), 0)
        keep = count > 0
        docs = np.broadcast_to(np.arange(len(lengths))[:, None], keep.shape)[keep]
        firsts, rk = first[keep], np.broadcast_to(ranks[None, :], keep.shape)[keep]
        order = np.lexsort((firsts, docs))
        docs, firsts, rk = docs[order], firsts[order], rk[order]
        return docs, rk, firsts - doc_starts[docs], count[keep][order], (firsts - rk) // ring, ring
    if any(run.stride != 1 for s in shards for run in s):
        return None
    runs = [(run.start, run.length, r) for r, s in enumerate(shards) for run in s]
    arr = np.asarray(runs, dtype=np.int64).reshape(-1, 3)
    locs = np.concatenate(
        [np.cumsum([0] + [run.length for run in s])[:-1] for s in shards if s]
    ).astype(np.int64)
    order = np.argsort(arr[:, 0], kind="stable")
    run_starts, run_lengths, run_ranks, locs = (
        arr[order, 0],
        arr[order, 1],
        arr[order, 2],
        locs[order],
    )
    if run_starts[0] != 0 or np.any(run_starts[1:] != run_starts[:-1] + run_lengths[:-1]):
        return None
    if int(run_starts[-1] + run_lengths[-1]) != total:
        return None
    breaks = np.union1d(doc_starts, run_starts)
    ends = np.append(breaks[1:], total)
    docs = np.searchsorted(doc_starts, breaks, side="right") - 1
    run = np.searchsorted(run_starts, breaks, side="right") - 1
    locs = locs[run] + breaks - run_starts[run]
    return docs, run_ranks[run], breaks - doc_starts[docs], ends - breaks, locs, 1


def _counts(mask: MaskSpec, shards: tuple[Shard, ...], ring: int) -> RingCounts:
    """`schedule_counts(_schedule(...))` without building the pieces: the documents are
    grouped by how the shards cut them (each group's pieces are one document's, translated),
    and a block's calls come from its pieces' count, bounding box and band limits (the test of
    `_coalesce`)."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    parts = None if not mask.causal else _parts(mask, shards, ring)
    if parts is None:
        return schedule_counts(_schedule(mask, shards, ring))
    docs, ranks, offs, sizes, locs, stride = parts
    n_docs = len(mask.documents or ())
    big = np.iinfo(np.int64).max
    base = np.full((n_docs, ring), big, dtype=np.int64)
    np.minimum.at(base, (docs, ranks), locs)
    rels = locs - base[docs, ranks]
    first_part = np.searchsorted(docs, np.arange(n_docs))
    per_doc = np.diff(np.append(first_part, len(docs)))
    index = np.arange(len(docs)) - first_part[docs]
    width = int(per_doc.max())
    sig = np.full((n_docs, 2 + 4 * width), -1, dtype=np.int64)
    sig[:, 0] = np.asarray(mask.documents, dtype=np.int64)
    sig[:, 1] = per_doc
    for c, values in enumerate((ranks, offs, sizes, rels)):
        sig[docs, 2 + 4 * index + c] = values
    rows = np.ascontiguousarray(sig).view(np.dtype((np.void, sig.itemsize * sig.shape[1])))
    _, reps, group_of = np.unique(rows.ravel(), return_index=True, return_inverse=True)
    members = np.argsort(group_of, kind="stable")
    bounds = np.cumsum(np.bincount(group_of.ravel(), minlength=len(reps)))
    # per block (j, i): count, pairs, q0, q1, k0, k1, min lo + k - q, max hi + k - q
    blocks: dict[tuple[int, int], list[int]] = {}
    for g, rep in enumerate(reps.tolist()):
        lo_i, hi_i = (int(bounds[g - 1]) if g else 0), int(bounds[g])
        group = members[lo_i:hi_i]
        size = hi_i - lo_i
        m = int(sig[rep, 0])
        mini = MaskSpec(documents=(m,), window=mask.window)
        start = int(first_part[rep])
        rep_parts = [
            (int(ranks[p]), Run(int(offs[p]), int(sizes[p]), int(stride)), int(rels[p]))
            for p in range(start, start + int(per_doc[rep]))
        ]
        local: dict[tuple[int, int], list[int]] = {}
        for j, q_run, q_off in rep_parts:
            for i, k_run, k_off in rep_parts:
                for p in _run_pieces(mini, q_run, q_off, k_run, k_off):
                    lo = -(p.rows - 1) if p.lo is None else p.lo
                    hi = p.cols - 1 if p.hi is None else p.hi
                    shift = p.k_start - p.q_start
                    acc = local.get((j, i))
                    if acc is None:
                        local[(j, i)] = [
                            1,
                            p.pairs,
                            p.q_start,
                            p.q_end,
                            p.k_start,
                            p.k_end,
                            lo + shift,
                            hi + shift,
                        ]
                    else:
                        acc[0] += 1
                        acc[1] += p.pairs
                        acc[2] = min(acc[2], p.q_start)
                        acc[3] = max(acc[3], p.q_end)
                        acc[4] = min(acc[4], p.k_start)
                        acc[5] = max(acc[5], p.k_end)
                        acc[6] = min(acc[6], lo + shift)
                        acc[7] = max(acc[7], hi + shift)
        sub = base[group] if size > 1 else None
        for (j, i), acc in local.items():
            if sub is None:
                bj = bj_hi = int(base[rep, j])
                bi = bi_hi = int(base[rep, i])
                d_lo = d_hi = bi - bj
            else:
                col_j, col_i = sub[:, j], sub[:, i]
                bj, bj_hi = int(col_j.min()), int(col_j.max())
                bi, bi_hi = int(col_i.min()), int(col_i.max())
                diff = col_i - col_j
                d_lo, d_hi = int(diff.min()), int(diff.max())
            new = [
                acc[0] * size,
                acc[1] * size,
                acc[2] + bj,
                acc[3] + bj_hi,
                acc[4] + bi,
                acc[5] + bi_hi,
                acc[6] + d_lo,
                acc[7] + d_hi,
            ]
            old = blocks.get((j, i))
            if old is None:
                blocks[(j, i)] = new
            else:
                blocks[(j, i)] = [
                    old[0] + new[0],
                    old[1] + new[1],
                    min(old[2], new[2]),
                    max(old[3], new[3]),
                    min(old[4], new[4]),
                    max(old[5], new[5]),
                    min(old[6], new[6]),
                    max(old[7], new[7]),
                ]
    pairs = [[0] * ring for _ in range(ring)]
    calls = [[0] * ring for _ in range(ring)]
    for (j, i), (count, total, q0, q1, k0, k1, lo, hi) in blocks.items():
        t = (j - i) % ring
        pairs[j][t] = total
        # `_coalesce`: one call when the pieces' union is one band over their bounding box
        one = count > 1 and band_pairs(q1 - q0, k1 - k0, lo - k0 + q0, hi - k0 + q0) == total
        calls[j][t] = 1 if one else count
    steps = max((t for row in calls for t, c in enumerate(row) if c), default=0) + 1
    own = tuple(sum(r.length for r in s) for s in shards)
    return RingCounts(tuple(map(tuple, pairs)), tuple(map(tuple, calls)), steps, own, mask.causal)


def counts_score(counts: RingCounts) -> tuple[int, int]:
    """(`balance_score`, steps) of a schedule from its counts: what the balanced layout
    minimises."""
    busiest = sum(max(row[t] for row in counts.pairs) for t in range(counts.steps))
    calls = max(sum(row) for row in counts.calls)
    return busiest + CALL_COST_PAIRS * calls, counts.steps


def ring_counts(packing: Packing) -> RingCounts:
    """The exact pairs, calls and steps of a packing's ring schedule, without its pieces."""
    return packing.counts
