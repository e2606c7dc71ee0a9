"""Token layouts over a U x R mesh, and the causal blocks they produce in ring attention.

Definition (the convention of yunchang's USP):

* **Ring level.** The layout assigns each ring rank j (0..R-1) a set of L/R token positions, in
  increasing order:
  - `contiguous`: positions [j*L/R, (j+1)*L/R);
  - `zigzag`: the sequence is cut into 2R chunks; ring rank j holds chunks j and 2R-1-j, so
    every ring rank does the same causal work;
  - `striped`: positions i with i mod R == j (Striped Attention), balanced at token grain.
* **Ulysses level.** The U ranks of a Ulysses group split their ring rank's ordered positions
  into U contiguous pieces; Ulysses rank u takes piece u. The Ulysses all-to-all gathers the
  pieces back in group order, so after it every rank holds its ring rank's positions in ring
  order, with h/U heads. Ulysses attention needs no balancing (every rank sees the whole
  ring-level sequence), so with R = 1 every layout shards like `contiguous`.
* **Global rank** p = j*U + u: Ulysses groups are consecutive ranks (inside a node).

For U = 1 these are the usual layouts over P = R ranks ("token i to rank i mod P" for striped,
"rank r gets chunks r and 2P-1-r" for zigzag). A layout is a token permutation: position ids
(RoPE) and labels must be sharded with it — `positions` gives them.

Pure tensor arithmetic; no torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cpbench.config.constraints import LAYOUTS, seq_divisor
from cpbench.errors import CpbenchError


def _check(seq_len: int, ulysses: int, ring: int, layout: str) -> None:
    if layout not in LAYOUTS:
        raise CpbenchError(f"layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    divisor = seq_divisor(ulysses, ring, layout)
    if seq_len % divisor != 0:
        raise CpbenchError(
            f"sequence length ({seq_len}) must be divisible by {divisor} for the {layout} layout "
            f"on ulysses ({ulysses}) x ring ({ring})"
        )


def ring_positions(seq_len: int, ring: int, layout: str, ring_rank: int) -> torch.Tensor:
    """Global token positions held by ring rank `ring_rank`, in the order it holds them."""
    _check(seq_len, 1, ring, layout)
    n = seq_len // ring
    if layout == "contiguous":
        return torch.arange(ring_rank * n, (ring_rank + 1) * n)
    if layout == "zigzag":
        c = seq_len // (2 * ring)
        first = torch.arange(ring_rank * c, (ring_rank + 1) * c)
        last = 2 * ring - 1 - ring_rank
        return torch.cat([first, torch.arange(last * c, (last + 1) * c)])
    return torch.arange(ring_rank, seq_len, ring)


def positions(seq_len: int, ulysses: int, ring: int, layout: str, rank: int) -> torch.Tensor:
    """Global token positions held by global CP rank `rank` (= ring_rank*U + ulysses_rank)."""
    _check(seq_len, ulysses, ring, layout)
    if not 0 <= rank < ulysses * ring:
        raise CpbenchError(f"rank ({rank}) must be in [0, ulysses x ring = {ulysses * ring})")
    ring_rank, ulysses_rank = divmod(rank, ulysses)
    ring_pos = ring_positions(seq_len, ring, layout, ring_rank)
    piece = ring_pos.numel() // ulysses
    return ring_pos[ulysses_rank * piece : (ulysses_rank + 1) * piece]


def shard_tensor(
    x: torch.Tensor, ulysses: int, ring: int, layout: str, rank: int, dim: int = 1
) -> torch.Tensor:
    """The piece of a global tensor that CP rank `rank` holds (a copy, contiguous)."""
    index = positions(x.shape[dim], ulysses, ring, layout, rank).to(x.device)
    return x.index_select(dim, index).contiguous()


def unshard_tensors(
    pieces: list[torch.Tensor], ulysses: int, ring: int, layout: str, dim: int = 1
) -> torch.Tensor:
    """Inverse of `shard_tensor`: the global tensor from every rank's piece, in rank order."""
    if len(pieces) != ulysses * ring:
        raise CpbenchError(
            f"got {len(pieces)} pieces for ulysses ({ulysses}) x ring ({ring}) = {ulysses * ring}"
        )
    seq_len = sum(p.shape[dim] for p in pieces)
    order = torch.cat([positions(seq_len, ulysses, ring, layout, r) for r in range(len(pieces))])
    return reassemble(pieces, order, dim)


def reassemble(pieces: list[torch.Tensor], order: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """Concatenate rank-ordered pieces and put every token back at its global position;
    `order` lists the global position of each concatenated token."""
    stacked = torch.cat(pieces, dim=dim)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    return stacked.index_select(dim, inverse.to(stacked.device))


@dataclass(frozen=True)
class BlockPiece:
    """One kernel call of a ring step: query rows [q_start, q_end) of the local queries against
    key rows [k_start, k_end) of the visiting K/V chunk, top-left causal or full."""

    q_start: int
    q_end: int
    k_start: int
    k_end: int
    causal: bool


def ring_block_pieces(
    layout: str, causal: bool, q_rank: int, kv_rank: int, shard_len: int
) -> list[BlockPiece]:
    """The kernel calls that ring rank `q_rank` makes on the K/V chunk of ring rank `kv_rank`.

    Every shard holds `shard_len` tokens in increasing position order. An empty list means the
    block is fully masked and skipped. Derivation (i, j local row/column indices):
    - contiguous: same rank -> causal; earlier rank -> full; later rank -> masked.
    - zigzag (halves A = chunk r, B = chunk 2R-1-r): same rank -> causal on the whole shard
      (positions increase along it); earlier rank s < r -> all queries see K/V half A only;
      later rank s > r -> only query half B sees, and it sees all of K/V.
    - striped (row i is position i*R + r): key j visible iff j*R + s <= i*R + r, i.e. j <= i when
      s <= r (causal) and j <= i - 1 when s > r: rows 1.. against columns ..S-2, causal.
    """
    n = shard_len
    if not causal:
        return [BlockPiece(0, n, 0, n, False)]
    if layout == "contiguous":
        if kv_rank == q_rank:
            return [BlockPiece(0, n, 0, n, True)]
        return [BlockPiece(0, n, 0, n, False)] if kv_rank < q_rank else []
    if layout == "zigzag":
        half = n // 2
        if kv_rank == q_rank:
            return [BlockPiece(0, n, 0, n, True)]
        if kv_rank < q_rank:
            return [BlockPiece(0, n, 0, half, False)]
        return [BlockPiece(half, n, 0, n, False)]
    if layout == "striped":
        if kv_rank <= q_rank:
            return [BlockPiece(0, n, 0, n, True)]
        return [BlockPiece(1, n, 0, n - 1, True)] if n > 1 else []
    raise CpbenchError(f"layout {layout!r} is not one of {', '.join(LAYOUTS)}")
