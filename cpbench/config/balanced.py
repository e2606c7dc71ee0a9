"""The balanced layout's placement of packed documents on a ring (docs/design.md section 1):
documents of at least `long_doc` tokens are cut into 2R near-equal chunks and zigzagged (their
causal work is then equal on every rank and ring step); the others are kept whole where they
fit, heaviest first on the least-loaded rank with room (LPT), a piece that overflows its rank
continuing on the least-loaded rank with room. Every rank ends with exactly L/R tokens.

The chunks placed before the first one that overflows its rank go where they are sent, all at
once (numpy); the rest are placed one at a time, the least-loaded rank with room taken from a
heap of (load, rank). `cpbench.config.geometry` makes the candidates' shards and picks one.
numpy is imported where it computes (`cpbench --help` loads none)."""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import TYPE_CHECKING

from cpbench.config.bands import sum_clamped, sum_clamped_array
from cpbench.config.masks import MaskSpec
from cpbench.config.run_table import RunTable, document_arrays, joined

if TYPE_CHECKING:
    import numpy as np


def long_chunks(
    mask: MaskSpec, ring: int, long_doc: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The 2R chunks of the documents of at least `long_doc` tokens (a causal mask): (start,
    size, rank, document start, row work) arrays of shape (documents, 2R); chunk c of a
    document is sent to rank c for c < R, else 2R-1-c, and placed in that order."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    starts, lengths = document_arrays(mask.documents or ())
    keep = lengths >= long_doc
    starts, lengths = starts[keep], lengths[keep]
    c = np.arange(2 * ring, dtype=np.int64)
    sizes = lengths[:, None] // (2 * ring) + (c[None, :] < (lengths % (2 * ring))[:, None])
    offsets = starts[:, None] + np.cumsum(sizes, axis=1) - sizes
    ranks = np.broadcast_to(np.minimum(c, 2 * ring - 1 - c), sizes.shape)
    doc_starts = np.broadcast_to(starts[:, None], sizes.shape)
    a = offsets - doc_starts + 1  # a chunk's first query sees a keys of its document
    work = sum_clamped_array(a, sizes, a + sizes if mask.window is None else mask.window)
    return offsets, sizes, ranks, doc_starts, work


def _first_overflow(sizes: np.ndarray, ring: int, room: int) -> int:
    """The first chunk (in placement order, of `long_chunks`' sizes) that does not fit in the
    `room` left on its rank; their number when every one fits. Rank r receives chunks r and
    2R-1-r of every document in turn."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    docs, width = sizes.shape
    low, high = sizes[:, :ring], sizes[:, ::-1][:, :ring]  # column r: chunks r and 2R-1-r
    before = np.cumsum(low + high, axis=0) - (low + high)
    row = np.arange(docs, dtype=np.int64)[:, None] * width
    column = np.arange(ring, dtype=np.int64)[None, :]
    firsts = np.concatenate(
        [
            (row + column)[before + low > room],
            (row + width - 1 - column)[before + low + high > room],
            [docs * width],
        ]
    )
    return int(firsts.min())


class _Ring:
    """The ranks' room and load while pieces are placed one at a time, and the pieces."""

    def __init__(self, mask: MaskSpec, room: list[int], load: list[int]) -> None:
        self.mask = mask
        self.room, self.load = room, load
        self.total = sum(mask.documents or ())
        self.heap = [(load[r], r) for r in range(len(room)) if room[r]]
        """One (load, rank) per rank with room: its load when last looked at, at most its load
        now (loads only grow), so the least entry whose load is current is the least rank."""
        heapq.heapify(self.heap)
        self.start: list[int] = []
        self.length: list[int] = []
        self.rank: list[int] = []

    def least_loaded(self) -> int:
        """The rank with room of the least (load, rank)."""
        heap, room, load = self.heap, self.room, self.load
        while True:
            weight, rank = heap[0]
            if load[rank] == weight and room[rank]:
                return rank
            if room[rank]:  # loaded since: look again at its load now
                heapq.heapreplace(heap, (load[rank], rank))
            else:  # full: never again
                heapq.heappop(heap)

    def place(self, pieces: Iterable[tuple[int, int, int, int, int]]) -> None:
        """Put each piece (start, length, rank, document start, row work) on its rank (the
        least loaded for rank -1), what does not fit spilling to the least-loaded ranks with
        room."""
        room, load = self.room, self.load
        starts, lengths, ranks = self.start, self.length, self.rank
        causal, window, total = self.mask.causal, self.mask.window, self.total
        for start, length, rank, doc_start, work in pieces:
            whole = True
            while length > 0:  # an empty chunk (of a document shorter than 2R) places nothing
                if rank < 0 or room[rank] == 0:
                    rank = self.least_loaded()
                take = min(length, room[rank])
                starts.append(start)
                lengths.append(take)
                ranks.append(rank)
                if whole and take == length:  # it fits: placed whole
                    load[rank] += work
                elif causal:  # row_work of positions inside one document
                    a = start - doc_start + 1
                    load[rank] += sum_clamped(a, take, window or a + take)
                else:
                    load[rank] += take * total
                room[rank] -= take
                start, length, whole = start + take, length - take, False


def balanced_table(mask: MaskSpec, seq_len: int, ring: int, long_doc: int) -> RunTable:
    """The balanced placement with documents of at least `long_doc` tokens zigzagged (the mask's
    documents explicit)."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    room, load = [seq_len // ring] * ring, [0] * ring
    starts, lengths = document_arrays(mask.documents or ())
    at_once: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * 3
    tail: Iterable[tuple[int, int, int, int, int]]
    if mask.causal:
        offsets, sizes, ranks, doc_starts, work = long_chunks(mask, ring, long_doc)
        first = _first_overflow(sizes, ring, room[0])
        flat = [x.ravel() for x in (offsets, sizes, ranks, doc_starts, work)]
        at_once = [x[:first] for x in flat[:3]]
        tokens, weights = np.zeros(ring, dtype=np.int64), np.zeros(ring, dtype=np.int64)
        np.add.at(tokens, at_once[2], at_once[1])
        np.add.at(weights, at_once[2], flat[4][:first])
        for r, (n, w) in enumerate(zip(tokens.tolist(), weights.tolist(), strict=True)):
            room[r] -= n
            load[r] += w
        tail = zip(*(x[first:].tolist() for x in flat), strict=True)
    else:  # full attention: one document, row_work a row's every key
        total = sum(mask.documents or ())
        tail = (
            (start + offset, size, min(c, 2 * ring - 1 - c), start, size * total)
            for start, length in zip(mask.starts, mask.documents or (), strict=True)
            if length >= long_doc
            for c, (offset, size) in enumerate(_chunk_spans(length, ring))
        )
    ring_state = _Ring(mask, room, load)
    ring_state.place(tail)
    short = np.flatnonzero(lengths < long_doc)
    if mask.causal:  # a whole document's row_work
        window = lengths[short] + 1 if mask.window is None else mask.window
        heavy = sum_clamped_array(np.ones_like(short), lengths[short], window)
    else:
        heavy = lengths[short] * int(lengths.sum())
    order = np.lexsort((starts[short], -heavy))  # heaviest first
    short_docs = (starts[short][order], lengths[short][order], heavy[order])
    ring_state.place(
        (s, n, -1, s, w) for s, n, w in zip(*(x.tolist() for x in short_docs), strict=True)
    )
    start, length, rank = (
        np.concatenate((a, np.asarray(b, dtype=np.int64)))
        for a, b in zip(
            at_once, (ring_state.start, ring_state.length, ring_state.rank), strict=True
        )
    )
    return joined(start, length, rank, ring)


def _chunk_spans(length: int, ring: int) -> list[tuple[int, int]]:
    """(offset, size) of a document's 2R near-equal chunks, the longer first."""
    base, extra = divmod(length, 2 * ring)
    spans, offset = [], 0
    for c in range(2 * ring):
        size = base + (1 if c < extra else 0)
        spans.append((offset, size))
        offset += size
    return spans
