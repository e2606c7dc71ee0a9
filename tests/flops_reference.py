"""Range arithmetic of the pairs a ring rank computes, kept as a reference for the closed forms
of `cpbench.model.flops` (which replaced it): token positions per ring rank and the pairs
between two of them."""

from __future__ import annotations

from fractions import Fraction

from cpbench.config.geometry import pack
from cpbench.config.masks import MaskSpec
from cpbench.config.vocabulary import GLOBAL_LAYOUTS
from cpbench.errors import CpbenchError
from cpbench.model.flops import _check_ring_layout, masked_step_pairs


def ring_rank_positions(seq_len: int, ring: int, layout: str, ring_rank: int) -> tuple[range, ...]:
    """Token positions held by a ring rank under a layout, as ranges (striped: one strided)."""
    _check_ring_layout(seq_len, ring, layout)
    if not 0 <= ring_rank < ring:
        raise CpbenchError(f"ring rank {ring_rank} is outside 0..{ring - 1}")
    shard = seq_len // ring
    if layout not in GLOBAL_LAYOUTS:
        runs = pack(MaskSpec(), seq_len, 1, ring, layout).shards[ring_rank]
        return tuple(range(r.start, r.last + 1, r.stride) for r in runs)
    if layout == "contiguous":
        return (range(ring_rank * shard, (ring_rank + 1) * shard),)
    if layout == "zigzag":
        chunk = seq_len // (2 * ring)
        first, second = ring_rank, 2 * ring - 1 - ring_rank
        return (
            range(first * chunk, (first + 1) * chunk),
            range(second * chunk, (second + 1) * chunk),
        )
    return (range(ring_rank, seq_len, ring),)


def range_pairs(query: range, key: range, causal: bool = True) -> Fraction:
    """Attended pairs between a contiguous query range and a contiguous key range."""
    if query.step != 1 or key.step != 1:
        raise CpbenchError("range_pairs needs contiguous ranges (step 1)")
    if not causal:
        return Fraction(len(query) * len(key))
    below = _keys_below_sum(query.start, query.stop, key.start, key.stop)
    overlap = max(0, min(query.stop, key.stop) - max(query.start, key.start))
    return below + Fraction(overlap, 2)


def _keys_below_sum(q_lo: int, q_hi: int, k_lo: int, k_hi: int) -> int:
    """Sum over queries q in [q_lo, q_hi) of the keys k in [k_lo, k_hi) with k < q."""
    width = k_hi - k_lo
    # queries in (k_lo, k_hi) see q - k_lo keys: an arithmetic series
    lo, hi = max(q_lo, k_lo + 1), min(q_hi, k_hi)
    partial = (hi - lo) * ((lo - k_lo) + (hi - 1 - k_lo)) // 2 if hi > lo else 0
    # queries at or after k_hi see all `width` keys
    full = max(0, q_hi - max(q_lo, k_hi)) * width
    return partial + full


def striped_pairs(shard: int, query_rank: int, key_rank: int, causal: bool = True) -> Fraction:
    """Pairs between the striped shards of two ring ranks (`shard` = L/R tokens each).

    Query positions `j + R*k`, key positions `i + R*l`: the key is earlier when `l <= k` for
    `i < j` (n(n+1)/2 pairs), when `l < k` for `i > j` (n(n-1)/2), and for `i == j` the n(n-1)/2
    earlier keys plus the diagonal n/2 make n^2/2.
    """
    n = shard
    if not causal:
        return Fraction(n * n)
    if key_rank < query_rank:
        return Fraction(n * (n + 1), 2)
    if key_rank > query_rank:
        return Fraction(n * (n - 1), 2)
    return Fraction(n * n, 2)


def chunk_pairs(
    seq_len: int, ring: int, layout: str, query_rank: int, key_rank: int, causal: bool = True
) -> Fraction:
    """Pairs ring rank `query_rank` computes against the K/V shard of ring rank `key_rank`."""
    if layout not in GLOBAL_LAYOUTS:
        _check_ring_layout(seq_len, ring, layout)
        step = (query_rank - key_rank) % ring
        return masked_step_pairs(MaskSpec(causal=causal), seq_len, 1, ring, layout)[step][
            query_rank
        ]
    if layout == "striped":
        _check_ring_layout(seq_len, ring, layout)
        return striped_pairs(seq_len // ring, query_rank, key_rank, causal)
    queries = ring_rank_positions(seq_len, ring, layout, query_rank)
    keys = ring_rank_positions(seq_len, ring, layout, key_rank)
    return sum((range_pairs(q, k, causal) for q in queries for k in keys), Fraction(0))
