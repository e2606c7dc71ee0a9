"""Pure tests of the token layouts and of the causal block decomposition (no process group)."""

from __future__ import annotations

import pytest
import torch

from cpbench.attention.layouts import (
    positions,
    ring_block_pieces,
    ring_positions,
    shard_tensor,
    unshard_tensors,
)
from cpbench.config.constraints import LAYOUTS
from cpbench.errors import CpbenchError

MESHES = [(1, 1), (1, 2), (2, 1), (1, 4), (4, 1), (2, 2), (2, 3), (3, 2), (1, 8)]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("ulysses", "ring"), MESHES)
def test_positions_partition_the_sequence(layout: str, ulysses: int, ring: int) -> None:
    seq_len = 2 * ulysses * ring * 6
    held = [positions(seq_len, ulysses, ring, layout, r) for r in range(ulysses * ring)]
    assert all(p.numel() == seq_len // (ulysses * ring) for p in held)
    assert torch.equal(torch.cat(held).sort().values, torch.arange(seq_len))


def test_layout_definitions_match_the_papers() -> None:
    # zigzag, P = 4, L = 16: 8 chunks of 2; rank 1 holds chunks 1 and 6.
    assert positions(16, 1, 4, "zigzag", 1).tolist() == [2, 3, 12, 13]
    # striped: token i on rank i mod P.
    assert positions(16, 1, 4, "striped", 3).tolist() == [3, 7, 11, 15]
    assert positions(16, 1, 4, "contiguous", 2).tolist() == [8, 9, 10, 11]
    # U x R: the ring rank's positions are split contiguously over the Ulysses group, and
    # global rank p = ring_rank * U + ulysses_rank.
    assert ring_positions(16, 2, "zigzag", 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert positions(16, 2, 2, "zigzag", 0).tolist() == [0, 1, 2, 3]
    assert positions(16, 2, 2, "zigzag", 1).tolist() == [12, 13, 14, 15]
    assert positions(16, 2, 2, "striped", 3).tolist() == [9, 11, 13, 15]
    # Pure Ulysses: every layout is contiguous (each rank sees the whole sequence anyway).
    assert positions(16, 4, 1, "zigzag", 1).tolist() == [4, 5, 6, 7]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("ulysses", "ring"), MESHES)
def test_shard_unshard_round_trip(layout: str, ulysses: int, ring: int) -> None:
    x = torch.randn(2, 2 * ulysses * ring * 3, 3, 4)
    pieces = [shard_tensor(x, ulysses, ring, layout, r) for r in range(ulysses * ring)]
    assert torch.equal(unshard_tensors(pieces, ulysses, ring, layout), x)
    # Other dims too (labels are [B, L]).
    labels = torch.arange(x.shape[1]).expand(2, -1)
    pieces = [shard_tensor(labels, ulysses, ring, layout, r, dim=1) for r in range(ulysses * ring)]
    assert torch.equal(
        pieces[-1][0], positions(x.shape[1], ulysses, ring, layout, ulysses * ring - 1)
    )


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("ring", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("causal", [True, False])
def test_block_pieces_cover_exactly_the_causal_mask(layout: str, ring: int, causal: bool) -> None:
    """The union of a ring step's kernel calls, each with its own top-left causal or full mask,
    must be exactly the global causal mask between the two shards' positions: nothing missing,
    nothing seen twice."""
    seq_len = 2 * ring * 4
    shard_len = seq_len // ring
    for q_rank in range(ring):
        q_pos = ring_positions(seq_len, ring, layout, q_rank)
        for kv_rank in range(ring):
            k_pos = ring_positions(seq_len, ring, layout, kv_rank)
            truth = (
                (k_pos[None, :] <= q_pos[:, None])
                if causal
                else torch.ones(shard_len, shard_len, dtype=torch.bool)
            )
            covered = torch.zeros(shard_len, shard_len, dtype=torch.int64)
            for p in ring_block_pieces(layout, causal, q_rank, kv_rank, shard_len):
                rows = torch.arange(p.q_end - p.q_start)[:, None]
                cols = torch.arange(p.k_end - p.k_start)[None, :]
                mask = (
                    (cols <= rows) if p.causal else torch.ones_like(rows * cols, dtype=torch.bool)
                )
                covered[p.q_start : p.q_end, p.k_start : p.k_end] += mask.long()
            assert covered.max() <= 1, f"{layout} q{q_rank} kv{kv_rank}: a pair is computed twice"
            assert torch.equal(covered.bool(), truth), f"{layout} q{q_rank} kv{kv_rank}"


def test_zigzag_skips_nothing_and_contiguous_skips_later_blocks() -> None:
    assert ring_block_pieces("contiguous", True, 0, 1, 8) == []
    assert len(ring_block_pieces("zigzag", True, 0, 3, 8)) == 1


@pytest.mark.parametrize(
    ("seq_len", "ulysses", "ring", "layout", "needle"),
    [
        (30, 1, 4, "contiguous", "divisible by 4"),
        (12, 1, 4, "zigzag", "divisible by 8"),
        (18, 3, 2, "zigzag", "divisible by 12"),
        (16, 1, 2, "diagonal", "not one of"),
    ],
)
def test_bad_layout_input_names_the_numbers(
    seq_len: int, ulysses: int, ring: int, layout: str, needle: str
) -> None:
    with pytest.raises(CpbenchError, match=needle):
        positions(seq_len, ulysses, ring, layout, 0)
