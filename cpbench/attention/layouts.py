"""Token layouts over a U x R mesh: which global positions each CP rank holds.

The convention of yunchang's USP, for the five layouts of `LAYOUTS` (defined in docs/design.md,
"Layouts"):

* **Ring level.** The layout assigns each ring rank j a set of token positions, in increasing
  order; `cpbench.config.geometry.pack` is the one derivation, shared with the ring's schedule
  and the model.
* **Ulysses level.** The U ranks of a Ulysses group split their ring rank's ordered positions
  into U contiguous pieces; Ulysses rank u takes piece u, so after the all-to-all every rank
  holds its ring rank's positions in ring order, with h/U heads. With R = 1 every layout shards
  like `contiguous`.
* **Global rank** p = j*U + u: Ulysses groups are consecutive ranks (inside a node).

The document layouts depend on the mask (`mask=None`: one causal document filling the
sequence). `doc_zigzag` runs more tokens than the sequence has: its global tensors have the run
length `run_length(...)` = L + padding, and `positions` index that run-length tensor. A layout
is a token permutation: position ids (RoPE) and labels must be sharded with it (`positions`).
Pure tensor arithmetic; no torch.distributed.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from cpbench.config.geometry import Packing, check_packing, pack
from cpbench.config.masks import MaskSpec
from cpbench.config.vocabulary import Layout
from cpbench.errors import CpbenchError

DEFAULT_MASK = MaskSpec()
"""The mask a layout assumes when given none: one causal document filling the sequence."""


def packing(
    seq_len: int, ulysses: int, ring: int, layout: str, mask: MaskSpec | None = None
) -> Packing:
    """The packed sequence of `seq_len` tokens (the logical length, before padding) on a
    U x R mesh: `cpbench.config.geometry.pack`, cached."""
    check_packing(seq_len, ulysses, ring, layout)
    layout_name: Layout = layout  # type: ignore[assignment]  # checked just above
    return pack(mask or DEFAULT_MASK, seq_len, ulysses, ring, layout_name)


def run_length(
    mask: MaskSpec | None, seq_len: int, ulysses: int, ring: int, layout: str
) -> int:
    """Tokens the layout runs: `seq_len` plus the padding doc_zigzag adds (the length of the
    global tensors that `shard_tensor` takes and `unshard_tensors` returns)."""
    return packing(seq_len, ulysses, ring, layout, mask).seq_len


def logical_length(
    run_len: int, ulysses: int, ring: int, layout: str, mask: MaskSpec | None = None
) -> int:
    """The sequence length L whose run length is `run_len` (the length of a global or gathered
    tensor): the documents' sum when the mask has documents, else `run_len` itself, which then
    must need no padding. Raises CpbenchError naming both lengths otherwise."""
    seq_len = sum(mask.documents) if mask is not None and mask.documents is not None else run_len
    expected = run_length(mask, seq_len, ulysses, ring, layout)
    if expected != run_len:
        docs = "" if mask is None or mask.documents is None else f"{len(mask.documents)} "
        raise CpbenchError(
            f"a tensor of {run_len} tokens does not fit the {layout} layout of {seq_len} tokens "
            f"({docs}documents) on ulysses ({ulysses}) x ring ({ring}): it runs "
            f"{expected} = {seq_len} + {expected - seq_len} padding tokens"
            + ("" if mask is not None and mask.documents else "; pass the mask's documents")
        )
    return seq_len


@lru_cache(maxsize=256)
def _ring_positions(
    seq_len: int, ulysses: int, ring: int, layout: str, mask: MaskSpec | None
) -> tuple[torch.Tensor, ...]:
    packed = packing(seq_len, ulysses, ring, layout, mask)
    return tuple(
        torch.cat([torch.arange(r.start, r.last + 1, r.stride) for r in shard])
        for shard in packed.shards
    )


def positions(
    seq_len: int,
    ulysses: int,
    ring: int,
    layout: str,
    rank: int,
    mask: MaskSpec | None = None,
) -> torch.Tensor:
    """Global token positions held by global CP rank `rank` (= ring_rank*U + ulysses_rank) for
    a sequence of `seq_len` tokens (indices into the run-length tensor; see `run_length`)."""
    check_packing(seq_len, ulysses, ring, layout)
    if not 0 <= rank < ulysses * ring:
        raise CpbenchError(f"rank ({rank}) must be in [0, ulysses x ring = {ulysses * ring})")
    ring_rank, ulysses_rank = divmod(rank, ulysses)
    ring_pos = _ring_positions(seq_len, ulysses, ring, layout, mask)[ring_rank]
    piece = ring_pos.numel() // ulysses
    return ring_pos[ulysses_rank * piece : (ulysses_rank + 1) * piece].clone()


def shard_tensor(
    x: torch.Tensor,
    ulysses: int,
    ring: int,
    layout: str,
    rank: int,
    dim: int = 1,
    mask: MaskSpec | None = None,
) -> torch.Tensor:
    """The piece of a global tensor (run length along `dim`) that CP rank `rank` holds (a
    copy, contiguous)."""
    seq_len = logical_length(x.shape[dim], ulysses, ring, layout, mask)
    index = positions(seq_len, ulysses, ring, layout, rank, mask).to(x.device)
    return x.index_select(dim, index).contiguous()


def unshard_tensors(
    pieces: list[torch.Tensor],
    ulysses: int,
    ring: int,
    layout: str,
    dim: int = 1,
    mask: MaskSpec | None = None,
) -> torch.Tensor:
    """Inverse of `shard_tensor`: the global tensor (run length) from every rank's piece, in
    rank order."""
    if len(pieces) != ulysses * ring:
        raise CpbenchError(
            f"got {len(pieces)} pieces for ulysses ({ulysses}) x ring ({ring}) = {ulysses * ring}"
        )
    run_len = sum(p.shape[dim] for p in pieces)
    seq_len = logical_length(run_len, ulysses, ring, layout, mask)
    order = torch.cat(
        [positions(seq_len, ulysses, ring, layout, r, mask) for r in range(len(pieces))]
    )
    return reassemble(pieces, order, dim)


def reassemble(pieces: list[torch.Tensor], order: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """Concatenate rank-ordered pieces and put every token back at its global position;
    `order` lists the global position of each concatenated token."""
    stacked = torch.cat(pieces, dim=dim)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    return stacked.index_select(dim, inverse.to(stacked.device))
