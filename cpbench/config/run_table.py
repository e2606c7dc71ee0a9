"""Shards as arrays: a `RunTable` holds the runs of positions of every ring rank in position
order, so that the layouts of many packed documents are built, joined and cut with numpy and
the `Run` objects of a shard are made only when a schedule asks for them
(`cpbench.config.geometry` turns a table into shards and back). The shards and what they mean:
docs/design.md section 1. numpy is imported where it computes (`cpbench --help` loads none)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from cpbench.errors import CpbenchError

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True, eq=False)
class RunTable:
    """The runs (start, length, `stride`) of the ranks of a ring of `ring`: int64 arrays of one
    length, in order of the runs' first positions, a rank's runs in increasing order as its
    `Shard` holds them. Compared by identity (arrays are not values): compare the shards."""

    start: np.ndarray
    length: np.ndarray
    rank: np.ndarray
    ring: int
    stride: int = 1
    """Distance between the positions of a run, the same for every run (1, or R: striped)."""

    def per_rank(self) -> list[list[tuple[int, int]]]:
        """Each rank's runs as (start, length), in order."""
        import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

        order = np.argsort(self.rank, kind="stable")
        ends = np.cumsum(np.bincount(self.rank, minlength=self.ring)).tolist()
        starts, lengths = self.start[order].tolist(), self.length[order].tolist()
        out, begin = [], 0
        for end in ends:
            out.append(list(zip(starts[begin:end], lengths[begin:end], strict=True)))
            begin = end
        return out

    def local_offsets(self) -> np.ndarray:
        """Where each run starts in its rank's shard: the lengths of that rank's earlier runs."""
        import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

        order = np.argsort(self.rank, kind="stable")
        lengths = self.length[order]
        before = np.cumsum(lengths) - lengths  # every earlier run, of any rank, in rank order
        counts = np.bincount(self.rank, minlength=self.ring)
        rank_first = np.cumsum(counts) - counts  # where each rank's runs begin in that order
        out = np.empty_like(before)
        out[order] = before - np.repeat(before[rank_first[counts > 0]], counts[counts > 0])
        return out

    def tokens(self) -> tuple[int, ...]:
        """Each rank's tokens."""
        import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

        own = np.zeros(self.ring, dtype=np.int64)
        np.add.at(own, self.rank, self.length)
        return tuple(own.tolist())


@lru_cache(maxsize=16)
def document_arrays(documents: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(starts, lengths) of packed documents as read-only int64 arrays, once per list (every
    candidate layout of a mesh reads the same 100,000 lengths)."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    lengths = np.asarray(documents, dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    starts.flags.writeable = lengths.flags.writeable = False
    return starts, lengths


def joined(
    start: np.ndarray, length: np.ndarray, rank: np.ndarray, ring: int, stride: int = 1
) -> RunTable:
    """The table of runs given in any order: empty runs dropped, sorted by start, and (stride 1)
    a run that starts where the same rank's previous run ends joined to it, as a shard's
    adjacent contiguous runs are. The runs must not overlap."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    start, length, rank = (np.asarray(x, dtype=np.int64) for x in (start, length, rank))
    keep = length > 0
    if not keep.all():
        start, length, rank = start[keep], length[keep], rank[keep]
    if len(start) > 1 and not (start[1:] > start[:-1]).all():
        order = np.argsort(start, kind="stable")  # a merge of sorted stretches: near linear
        start, length, rank = start[order], length[order], rank[order]
    if stride == 1 and len(start) > 1:
        joins = (rank[1:] == rank[:-1]) & (start[1:] == start[:-1] + length[:-1])
        if joins.any():
            heads = np.flatnonzero(np.concatenate(([True], ~joins)))
            start, length, rank = start[heads], np.add.reduceat(length, heads), rank[heads]
    return RunTable(start, length, rank, ring, stride)


def zigzag_table(
    starts: np.ndarray | Sequence[int], lengths: np.ndarray | Sequence[int], ring: int
) -> RunTable:
    """Each span (start, length), in increasing order, cut into 2R chunks of length // 2R (the
    rest of it on no rank), chunk c on rank c for c < R and on rank 2R-1-c after."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    chunk = np.asarray(lengths, dtype=np.int64) // (2 * ring)
    keep = chunk > 0
    first, chunk = np.asarray(starts, dtype=np.int64)[keep], chunk[keep]
    c = np.arange(2 * ring, dtype=np.int64)
    run_start = (first[:, None] + c[None, :] * chunk[:, None]).ravel()
    run_rank = np.tile(np.minimum(c, 2 * ring - 1 - c), len(chunk))
    return joined(run_start, np.repeat(chunk, 2 * ring), run_rank, ring)


def concatenated(first: RunTable, then: RunTable) -> RunTable:
    """The runs of `first` followed by those of `then` (on the same ring), joined."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    if first.ring != then.ring or first.stride != then.stride:
        raise CpbenchError("only tables of one ring and stride can be concatenated")
    start = np.concatenate((first.start, then.start))
    length = np.concatenate((first.length, then.length))
    rank = np.concatenate((first.rank, then.rank))
    return joined(start, length, rank, first.ring, first.stride)


def table_of_runs(shards: Sequence[Sequence[tuple[int, int, int]]]) -> RunTable:
    """The table of shards given as each rank's runs (start, length, stride), in order; every
    run of one stride."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    rows = [(s, n, d, r) for r, runs in enumerate(shards) for s, n, d in runs]
    strides = {d for _, _, d, _ in rows}
    if len(strides) > 1:
        raise CpbenchError(f"a run table holds runs of one stride, not {sorted(strides)}")
    arr = np.asarray([(s, n, r) for s, n, _, r in rows], dtype=np.int64).reshape(-1, 3)
    order = np.argsort(arr[:, 0], kind="stable")
    stride = strides.pop() if strides else 1
    return RunTable(arr[order, 0], arr[order, 1], arr[order, 2], len(shards), stride)
