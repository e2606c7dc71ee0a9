"""One-at-a-time references of the mask geometry's array forms (cpbench.config.run_table,
.balanced, .block_counts): shards merged run by run, zigzag chunk by chunk, doc_zigzag's
padding span by span and the balanced placement piece by piece."""

from __future__ import annotations

from cpbench.config import geometry
from cpbench.config.balanced import balanced_table
from cpbench.config.masks import MaskSpec


def merged(spans: list[tuple[int, int, int]]) -> geometry.Shard:
    """Runs from (start, length, stride) in increasing order, adjacent contiguous ones joined
    (the shards' form, one run at a time)."""
    merged: list[tuple[int, int, int]] = []
    end = -1  # where the last run ends when it is contiguous, else -1
    for start, length, stride in spans:
        if stride == 1 and start == end:
            merged[-1] = (merged[-1][0], merged[-1][1] + length, 1)
        else:
            merged.append((start, length, stride))
        end = start + length if stride == 1 else -1
    return tuple(geometry.Run(*run) for run in merged)


def merge_runs(runs: list[geometry.Run]) -> geometry.Shard:
    return merged(sorted((r.start, r.length, r.stride) for r in runs))


def zigzag_shards(starts_lengths: list[tuple[int, int]], ring: int) -> tuple[geometry.Shard, ...]:
    """Zigzag each span (start, length) over 2R chunks; ring rank j gets chunks j and 2R-1-j."""
    per_rank: list[list[tuple[int, int, int]]] = [[] for _ in range(ring)]
    for start, length in starts_lengths:
        chunk = length // (2 * ring)
        if chunk == 0:
            continue
        for j in range(ring):
            per_rank[j].append((start + j * chunk, chunk, 1))
            per_rank[j].append((start + (2 * ring - 1 - j) * chunk, chunk, 1))
    return tuple(merged(sorted(spans)) for spans in per_rank)


def padded_spans(docs: tuple[int, ...], ulysses: int, ring: int) -> list[tuple[int, int]]:
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


def reference_balanced(
    mask: MaskSpec, seq_len: int, ring: int, long_doc: int
) -> tuple[geometry.Shard, ...]:
    """The balanced placement one chunk at a time, the least-loaded rank by a scan, row_work by
    search."""
    room, load = [seq_len // ring] * ring, [0] * ring
    owned: list[list[geometry.Run]] = [[] for _ in range(ring)]

    def place(start: int, length: int, rank: int) -> None:
        while length > 0:
            if room[rank] == 0:
                rank = min((r for r in range(ring) if room[r]), key=lambda r: (load[r], r))
            take = min(length, room[rank])
            owned[rank].append(geometry.Run(start, take))
            load[rank] += geometry.row_work(mask, start, start + take)
            room[rank] -= take
            start, length = start + take, length - take

    docs = list(zip(mask.starts, mask.documents or (), strict=True))
    for start, length in docs:
        if length >= long_doc:
            base, extra = divmod(length, 2 * ring)
            for c in range(2 * ring):
                size = base + (1 if c < extra else 0)
                place(start, size, c if c < ring else 2 * ring - 1 - c)
                start += size
    short = sorted(
        ((s, n) for s, n in docs if n < long_doc),
        key=lambda d: (-geometry.row_work(mask, d[0], d[0] + d[1]), d[0]),
    )
    for start, length in short:
        place(start, length, min((r for r in range(ring) if room[r]), key=lambda r: (load[r], r)))
    return tuple(merge_runs(runs) for runs in owned)


def balanced_shards(
    mask: MaskSpec, seq_len: int, ring: int, long_doc: int
) -> tuple[geometry.Shard, ...]:
    """The shards of `balanced_table` (cpbench.config.balanced: the placement)."""
    return geometry.table_shards(balanced_table(mask, seq_len, ring, long_doc))


def balance_score(schedule: geometry.RingSchedule) -> int:
    """`geometry.counts_score`'s score piece by piece: the ring's busiest-step work sum plus the
    busiest rank's kernel calls at `CALL_COST_PAIRS` each."""
    ring = len(schedule.pieces)
    busiest = sum(max(schedule.pairs(j, t) for j in range(ring)) for t in range(schedule.steps))
    calls = max(sum(len(ps) for ps in schedule.pieces[j]) for j in range(ring))
    return busiest + geometry.CALL_COST_PAIRS * calls
