"""A ring schedule's exact pairs and kernel calls per rank and step (`RingCounts`), counted from
the shards as arrays (`RunTable`) without building the schedule's pieces.

A causal mask's pieces are those of each document alone, so the documents are cut into parts
(one per shard run they meet) and grouped by how the shards cut them: documents with the same
length and the same parts (rank, offset in the document, size, place in the rank's shard after
the document's first part there) have the same pieces, translated. The pieces of one document
per group are computed at once with numpy (`geometry._run_pieces` and `_crop` as array
formulas), then every block (query rank, key rank) sums its pieces' pairs and count and keeps
their bounding box and band limits, which decide whether the pieces coalesce into one kernel
call (`geometry._coalesce`'s test). `geometry.schedule_counts` is the reference it equals
(tests/test_documents_scale.py). numpy is imported where it computes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cpbench.config.bands import band_pairs_array
from cpbench.config.masks import MaskSpec
from cpbench.config.run_table import RunTable, document_arrays
from cpbench.errors import CpbenchError

if TYPE_CHECKING:
    import numpy as np

PAIRS_AT_ONCE = 1 << 21
"""Pairs of parts whose pieces are computed in one go (a document of thousands of parts is
taken a slice of query parts at a time)."""
CELLS_AT_ONCE = 1 << 22
"""Cells of the ranks x ranks x documents difference computed in one go (else row by row)."""

RANKING_PART_PAIRS = 30_000_000
"""The counting budget a ranking of many candidates sets (`counting_budget`): about 10 s of
counting on a 2-core CPU (0.3 us per pair of parts). doc_zigzag, striped and balanced under
packed documents cut each document into up to 2R parts, so their exact counts grow as the
documents x R^2: 56 million pairs (31 s) at R = 256 and 266 documents, 0.9 billion at 1,024."""
_BUDGET: ContextVar[int | None] = ContextVar("part_pairs_budget", default=None)


class CountingTooCostly(CpbenchError):
    """The exact counts of a schedule need more pairs of parts than the budget allows."""

    def __init__(self, part_pairs: int, budget: int) -> None:
        self.part_pairs, self.budget = part_pairs, budget
        self.rule = f"not priced: counting it exactly is over {budget:,} part pairs"
        super().__init__(f"{self.rule}: {part_pairs:,}")


@contextmanager
def counting_budget(part_pairs: int | None = None) -> Iterator[None]:
    """Within it, `table_counts` raises `CountingTooCostly` instead of counting a schedule of
    more than `part_pairs` (default `RANKING_PART_PAIRS`) pairs of parts (a ranking skips such
    a candidate, saying why)."""
    token = _BUDGET.set(RANKING_PART_PAIRS if part_pairs is None else part_pairs)
    try:
        yield
    finally:
        _BUDGET.reset(token)


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


@dataclass(frozen=True, eq=False)
class Parts:
    """Every (document, shard run) intersection, in position order: int64 arrays."""

    doc: np.ndarray
    rank: np.ndarray
    offset: np.ndarray
    """The part's first position in its document."""
    size: np.ndarray
    """Its positions."""
    local: np.ndarray
    """Its first position's index in its rank's shard."""
    stride: int


def document_parts(mask: MaskSpec, table: RunTable) -> Parts | None:
    """The parts of the mask's documents (explicit) under the table's shards; None for shards of
    another shape than contiguous runs covering the sequence once or the striped layout's."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    doc_starts, lengths = document_arrays(mask.documents or ())
    total = int(doc_starts[-1] + lengths[-1])
    ring = table.ring
    if table.stride != 1:
        ranks = np.arange(ring, dtype=np.int64)
        striped = table.stride == ring > 1 and len(table.start) == ring
        if not striped or not (
            np.array_equal(table.rank, ranks)
            and np.array_equal(table.start, ranks)
            and (table.length * ring == total).all()
        ):
            return None
        first = doc_starts[:, None] + (ranks[None, :] - doc_starts[:, None]) % ring
        count = np.maximum(-((first - (doc_starts + lengths)[:, None]) // ring), 0)
        keep = count > 0
        docs = np.broadcast_to(np.arange(len(lengths))[:, None], keep.shape)[keep]
        firsts, rk = first[keep], np.broadcast_to(ranks[None, :], keep.shape)[keep]
        order = np.lexsort((firsts, docs))
        docs, firsts, rk = docs[order], firsts[order], rk[order]
        return Parts(
            docs, rk, firsts - doc_starts[docs], count[keep][order], (firsts - rk) // ring, ring
        )
    run_starts, run_lengths = table.start, table.length
    if len(run_starts) == 0 or run_starts[0] != 0:
        return None
    if (run_starts[1:] != run_starts[:-1] + run_lengths[:-1]).any():
        return None
    if int(run_starts[-1] + run_lengths[-1]) != total:
        return None
    # the cuts: the document and run starts merged; at the last of equal ones, the documents
    # and runs before it are those that start there or earlier
    both = np.concatenate((doc_starts, run_starts))
    order = np.argsort(both, kind="stable")  # two sorted stretches: a merge
    cuts = both[order]
    is_doc = order < len(doc_starts)
    last = np.append(cuts[1:] != cuts[:-1], True)
    breaks = cuts[last]
    docs = (np.cumsum(is_doc) - 1)[last]
    run = (np.cumsum(~is_doc) - 1)[last]
    ends = np.append(breaks[1:], total)
    local = table.local_offsets()[run] + breaks - run_starts[run]
    return Parts(docs, table.rank[run], breaks - doc_starts[docs], ends - breaks, local, 1)


_MIX = 0x9E3779B97F4A7C15
"""An odd 64-bit multiplier (2^64 / golden ratio) for the signature hash."""


def _signature_hash(
    fields: tuple[np.ndarray, ...],
    index: np.ndarray,
    first: np.ndarray,
    heads: tuple[np.ndarray, ...],
) -> np.ndarray:
    """A 64-bit hash per document of its `heads` (one value each) and its parts' `fields`, in
    order (`index`: a part's place in its document, `first`: each document's first part)."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    mix = np.uint64(_MIX)
    part = np.zeros(len(index), dtype=np.uint64)
    for values in fields:
        part = (part ^ values.astype(np.uint64)) * mix
        part ^= part >> np.uint64(29)
    powers = np.cumprod(np.full(int(index.max()) + 1, mix, dtype=np.uint64))
    doc = np.add.reduceat(part * powers[index], first)
    for values in heads:
        doc = (doc ^ values.astype(np.uint64)) * mix
    return doc


def _exact_groups(
    fields: tuple[np.ndarray, ...],
    docs: np.ndarray,
    index: np.ndarray,
    heads: tuple[np.ndarray, ...],
) -> np.ndarray:
    """A group number per document from its whole signature row (heads, then every part's
    fields, -1 past its last part): what a hash collision falls back to."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    width = int(index.max()) + 1
    sig = np.full((len(heads[0]), len(heads) + len(fields) * width), -1, dtype=np.int64)
    for c, values in enumerate(heads):
        sig[:, c] = values
    for c, values in enumerate(fields):
        sig[docs, len(heads) + len(fields) * index + c] = values
    rows = np.ascontiguousarray(sig).view(np.dtype((np.void, sig.itemsize * sig.shape[1])))
    return np.unique(rows.ravel(), return_inverse=True)[1].ravel()


def document_groups(
    parts: Parts, rel: np.ndarray, lengths: np.ndarray, first: np.ndarray, count: np.ndarray
) -> np.ndarray:
    """A group number per document: equal for documents of the same length whose parts have the
    same rank, offset, size and `rel` (place in the rank's shard after the document's first
    part there), in order. Hashed, then every document checked against its group's first: exact
    (a collision falls back to comparing the signatures whole)."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    fields = (parts.rank, parts.offset, parts.size, rel)
    index = np.arange(len(parts.doc)) - first[parts.doc]
    heads = (lengths, count)
    hashes = _signature_hash(fields, index, first, heads)
    _, reps, group = np.unique(hashes, return_index=True, return_inverse=True)
    group = group.ravel()
    rep = reps[group]
    if all(np.array_equal(h[rep], h) for h in heads):
        twin = first[rep[parts.doc]] + index  # the same part of the group's first document
        if all(np.array_equal(f[twin], f) for f in fields):
            return group
    return _exact_groups(fields, parts.doc, index, heads)


def _reduce(
    keys: np.ndarray,
    sums: tuple[np.ndarray, ...],
    mins: tuple[np.ndarray, ...],
    maxs: tuple[np.ndarray, ...],
) -> tuple[np.ndarray, ...]:
    """(distinct keys, then per key the sums, minima and maxima of the given columns)."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    heads = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    out = [keys[heads]]
    out += [np.add.reduceat(x[order], heads) for x in sums]
    out += [np.minimum.reduceat(x[order], heads) for x in mins]
    out += [np.maximum.reduceat(x[order], heads) for x in maxs]
    return tuple(out)


def _document_blocks(
    rank: np.ndarray,
    offset: np.ndarray,
    size: np.ndarray,
    rel: np.ndarray,
    stride: int,
    window: int | None,
    ring: int,
) -> tuple[np.ndarray, ...]:
    """The pieces of one document between its parts (query part x key part, each a run of
    `stride` at `offset` in the document and `rel` in its shard), by block j * ring + i: (keys,
    count, pairs, q0, k0, lo, q1, k1, hi), the pieces' bounding box [q0, q1) x [k0, k1) and
    band limits lo <= k - q <= hi in shard coordinates; `PAIRS_AT_ONCE` pairs of parts at a
    time."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    n = len(rank)
    step = max(1, PAIRS_AT_ONCE // n)
    found = [
        _piece_blocks(np.arange(s, min(s + step, n)), rank, offset, size, rel, stride, window, ring)
        for s in range(0, n, step)
    ]
    if len(found) == 1:
        return found[0]
    keys, count, pairs, q0, k0, lo, q1, k1, hi = (
        np.concatenate(c) for c in zip(*found, strict=True)
    )
    return _reduce(keys, (count, pairs), (q0, k0, lo), (q1, k1, hi))


def _piece_blocks(
    queries: np.ndarray,
    rank: np.ndarray,
    offset: np.ndarray,
    size: np.ndarray,
    rel: np.ndarray,
    stride: int,
    window: int | None,
    ring: int,
) -> tuple[np.ndarray, ...]:
    """`_document_blocks` of the query parts `queries` against every key part."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    n = len(rank)
    a, b = np.repeat(queries, n), np.tile(np.arange(n), len(queries))
    seen = offset[b] <= offset[a] + (size[a] - 1) * stride  # a key not after every query
    a, b = a[seen], b[seen]
    rows, cols = size[a], size[b]
    delta = offset[a] - offset[b]
    # `_run_pieces` on one document, its missing lower bound written -(rows - 1): same cells
    hi = delta // stride
    lo = -(rows - 1) if window is None else (delta - window) // stride + 1
    # `_crop`: the band's tight box [r0, r1) x [c0, c1), empty ones dropped
    r0 = np.maximum(0, -hi)
    r1 = np.minimum(rows, cols - lo)
    c0 = np.maximum(0, r0 + lo)
    c1 = np.minimum(cols, r1 + hi)
    ok = (lo <= hi) & (r0 < r1) & (c0 < c1)
    a, b, lo, hi, r0, r1, c0, c1 = (x[ok] for x in (a, b, lo, hi, r0, r1, c0, c1))
    nq, nk, shift = r1 - r0, c1 - c0, c0 - r0
    lo = np.maximum(lo - shift, -(nq - 1))  # the piece's own limits, unbounded = its rectangle
    hi = np.minimum(hi - shift, nk - 1)
    pairs = band_pairs_array(nq, nk, lo, hi)
    q0, q1, k0, k1 = rel[a] + r0, rel[a] + r1, rel[b] + c0, rel[b] + c1
    keys = rank[a] * ring + rank[b]
    return _reduce(
        keys, (np.ones_like(keys), pairs), (q0, k0, lo + k0 - q0), (q1, k1, hi + k0 - q0)
    )


def _translated(
    blocks: tuple[np.ndarray, ...], ranks: np.ndarray, origins: np.ndarray, ring: int
) -> list[np.ndarray]:
    """A group's blocks (one document's, `_document_blocks`) summed over its documents, whose
    first shard positions on the group's `ranks` are the columns of `origins` (ranks x
    documents): counts and pairs times the documents, the box and band limits over all."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    keys, count, pairs, q0, k0, lo, q1, k1, hi = blocks
    j = np.searchsorted(ranks, keys // ring)  # the rows of `origins`
    i = np.searchsorted(ranks, keys % ring)
    low, high = origins.min(axis=1), origins.max(axis=1)
    width, members = origins.shape
    # shift[j, i]: the least and the most origin on rank i less the origin on rank j
    if width * width * members <= CELLS_AT_ONCE:
        diff = origins[None, :, :] - origins[:, None, :]
        shift_lo, shift_hi = diff.min(axis=2), diff.max(axis=2)
    else:
        shift_lo = np.empty((width, width), dtype=np.int64)
        shift_hi = np.empty((width, width), dtype=np.int64)
        for row in range(width):
            diff = origins - origins[row]
            shift_lo[row], shift_hi[row] = diff.min(axis=1), diff.max(axis=1)
    return [
        keys,
        count * members,
        pairs * members,
        q0 + low[j],
        k0 + low[i],
        lo + shift_lo[j, i],
        q1 + high[j],
        k1 + high[i],
        hi + shift_hi[j, i],
    ]


def _origins(parts: Parts, ring: int) -> np.ndarray:
    """Per part, the shard position of its document's first part on its rank (a rank holds a
    document's parts in position order, so the first is the least)."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    key = parts.doc * ring + parts.rank
    order = np.argsort(key, kind="stable")  # documents in order already: near linear
    ordered = key[order]
    heads = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    out = np.empty_like(parts.local)
    out[order] = np.repeat(parts.local[order[heads]], np.diff(np.append(heads, len(key))))
    return out


class _Blocks:
    """The blocks (query rank, key rank) of all groups, summed as they come: one dense cell per
    block, so memory stays R^2 cells whatever the number of groups (a list of every group's
    blocks reduced at the end held groups x R^2 cells: 37 GB at R = 1024 and 500 documents)."""

    def __init__(self, ring: int) -> None:
        import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

        cells = ring * ring
        least, most = np.iinfo(np.int64).max, np.iinfo(np.int64).min
        self.sums = np.zeros((2, cells), dtype=np.int64)  # count, pairs
        self.mins = np.full((3, cells), least, dtype=np.int64)  # q0, k0, lo
        self.maxs = np.full((3, cells), most, dtype=np.int64)  # q1, k1, hi

    def add(self, columns: list[np.ndarray]) -> None:
        """One group's blocks (`_translated`: distinct keys, then the nine columns' rest)."""
        import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

        keys = columns[0]
        self.sums[:, keys] += np.stack(columns[1:3])
        self.mins[:, keys] = np.minimum(self.mins[:, keys], np.stack(columns[3:6]))
        self.maxs[:, keys] = np.maximum(self.maxs[:, keys], np.stack(columns[6:9]))

    def columns(self) -> tuple[np.ndarray, ...]:
        """(keys, count, pairs, q0, k0, lo, q1, k1, hi) of the blocks with a piece, by key."""
        import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

        keys = np.flatnonzero(self.sums[0] > 0)
        return (keys, *self.sums[:, keys], *self.mins[:, keys], *self.maxs[:, keys])


def table_counts(mask: MaskSpec, table: RunTable) -> RingCounts | None:
    """`schedule_counts` of the schedule of `table`'s shards under a causal `mask` (documents
    explicit), without its pieces; None when the mask is not causal or `document_parts` does not
    know the shards' shape (the schedule is then built)."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    parts = document_parts(mask, table) if mask.causal else None
    if parts is None:
        return None
    ring = table.ring
    lengths = document_arrays(mask.documents or ())[1]
    origin = _origins(parts, ring)
    rel = parts.local - origin
    first = np.flatnonzero(np.append(True, parts.doc[1:] != parts.doc[:-1]))  # every one has parts
    count = np.diff(np.append(first, len(parts.doc)))
    group = document_groups(parts, rel, lengths, first, count)
    budget = _BUDGET.get()
    if budget is not None:  # one document per group is paired part by part
        sizes = count[np.unique(group, return_index=True)[1]]
        work = int((sizes * sizes).sum())
        if work > budget:
            raise CountingTooCostly(work, budget)
    members = np.argsort(group, kind="stable")
    blocks = _Blocks(ring)
    begin = 0
    for end in np.cumsum(np.bincount(group)).tolist():
        docs = members[begin:end]
        p0, p1 = int(first[docs[0]]), int(first[docs[0]] + count[docs[0]])  # its first's parts
        one_document = _document_blocks(
            parts.rank[p0:p1],
            parts.offset[p0:p1],
            parts.size[p0:p1],
            rel[p0:p1],
            parts.stride,
            mask.window,
            ring,
        )
        ranks, firsts = np.unique(parts.rank[p0:p1], return_index=True)
        origins = origin[firsts[:, None] + first[docs][None, :]]
        blocks.add(_translated(one_document, ranks, origins, ring))
        begin = end
    keys, count, pairs, q0, k0, lo, q1, k1, hi = blocks.columns()
    # `_coalesce`: one call when the pieces' union is one band over their bounding box
    one = (count > 1) & (band_pairs_array(q1 - q0, k1 - k0, lo - k0 + q0, hi - k0 + q0) == pairs)
    calls = np.where(one, 1, count)
    j, t = keys // ring, (keys // ring - keys % ring) % ring
    pair_table = np.zeros((ring, ring), dtype=np.int64)
    call_table = np.zeros((ring, ring), dtype=np.int64)
    pair_table[j, t] = pairs
    call_table[j, t] = calls
    steps = int(t[calls > 0].max(initial=0)) + 1
    return RingCounts(
        tuple(map(tuple, pair_table.tolist())),
        tuple(map(tuple, call_table.tolist())),
        steps,
        table.tokens(),
        True,
    )
