"""Pure tests of the token layouts (all five, with masks) and of the ring schedule's block
decomposition against the dense mask (no process group)."""

from __future__ import annotations

import pytest
import torch

from cpbench.attention.kernels.base import band_mask
from cpbench.attention.layouts import (
    packing,
    positions,
    run_length,
    shard_tensor,
    unshard_tensors,
)
from cpbench.attention.reference import dense_mask
from cpbench.config.constraints import LAYOUTS, seq_divisor
from cpbench.config.geometry import ring_schedule
from cpbench.config.masks import MaskSpec
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
    assert positions(16, 1, 2, "zigzag", 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
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


MASKS = [
    MaskSpec(),
    MaskSpec(causal=False),
    MaskSpec(documents=(1, 3, 60, 1, 55)),
    MaskSpec(window=5),
    MaskSpec(documents=(27, 63, 30), window=4),
]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("ring", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("mask", MASKS, ids=lambda m: m.short_key())
def test_block_pieces_cover_exactly_the_mask(layout: str, ring: int, mask: MaskSpec) -> None:
    """The union of a ring step's kernel calls (the schedule's pieces), each with its own full,
    top-left causal or band mask, must be exactly the global mask between the two shards'
    positions: nothing missing, nothing seen twice."""
    seq_len = 120 if mask.documents else 2 * ring * 4
    if seq_len % seq_divisor(1, ring, layout):
        pytest.skip(f"{seq_len} tokens do not fit {layout} on a ring of {ring}")
    packed = packing(seq_len, 1, ring, layout, mask)
    schedule = ring_schedule(packed)
    dense = dense_mask(packed.mask, packed.seq_len)
    for q_rank in range(ring):
        q_pos = positions(seq_len, 1, ring, layout, q_rank, mask)  # U = 1: a ring rank
        for step in range(ring):
            kv_rank = (q_rank - step) % ring
            k_pos = positions(seq_len, 1, ring, layout, kv_rank, mask)
            truth = dense[q_pos][:, k_pos]
            covered = torch.zeros(len(q_pos), len(k_pos), dtype=torch.int64)
            for p in schedule.pieces[q_rank][step]:
                band = band_mask(p.rows, p.cols, (p.lo, p.hi), torch.device("cpu"))
                covered[p.q_start : p.q_end, p.k_start : p.k_end] += band.long()
            where = f"{layout} {mask.label} q{q_rank} kv{kv_rank}"
            assert covered.max() <= 1, f"{where}: a pair is computed twice"
            assert torch.equal(covered.bool(), truth), where


def test_zigzag_skips_nothing_and_contiguous_skips_later_blocks() -> None:
    contiguous = ring_schedule(packing(32, 1, 2, "contiguous"))
    assert contiguous.pieces[0][1] == ()  # rank 0 against rank 1's later chunk: masked
    zigzag = ring_schedule(packing(64, 1, 4, "zigzag"))
    assert len(zigzag.pieces[0][1]) == 1  # rank 0 against rank 3: one full block


def test_doc_zigzag_pads_and_the_tensors_have_the_run_length() -> None:
    """Documents (5, 11) on a ring of 2: each padded to a multiple of 2R = 4 (5 -> 8, 11 ->
    12): the run length is 20, every rank holds 10 positions of it, and a 16-token tensor is
    refused with the arithmetic."""
    mask = MaskSpec(documents=(5, 11))
    assert run_length(mask, 16, 1, 2, "doc_zigzag") == 20
    held = [positions(16, 1, 2, "doc_zigzag", r, mask) for r in range(2)]
    assert torch.equal(torch.cat(held).sort().values, torch.arange(20))
    # Document 0 (+3 padding) is cut into 4 chunks of 2: rank 0 holds chunks 0 and 3.
    assert held[0][:4].tolist() == [0, 1, 6, 7]
    x = torch.randn(1, 20, 2, 3)
    pieces = [shard_tensor(x, 1, 2, "doc_zigzag", r, mask=mask) for r in range(2)]
    assert torch.equal(unshard_tensors(pieces, 1, 2, "doc_zigzag", mask=mask), x)
    with pytest.raises(CpbenchError, match=r"runs 20 = 16 \+ 4 padding"):
        shard_tensor(torch.randn(1, 16, 2, 3), 1, 2, "doc_zigzag", 0, mask=mask)
    # Without documents, a length that needs padding is refused too.
    with pytest.raises(CpbenchError, match="pass the mask's documents"):
        shard_tensor(torch.randn(1, 18, 2, 3), 1, 2, "doc_zigzag", 0)


def test_balanced_layout_follows_the_documents() -> None:
    """The balanced layout depends on the documents: positions partition the sequence with
    L/R tokens per rank, and a single document (causal or full) is the zigzag layout."""
    mask = MaskSpec(documents=(40, 3, 3, 2, 8, 8))
    held = [positions(64, 1, 4, "balanced", r, mask) for r in range(4)]
    assert all(h.numel() == 16 for h in held)
    assert torch.equal(torch.cat(held).sort().values, torch.arange(64))
    for causal in (True, False):
        one = MaskSpec(causal=causal)
        assert all(
            torch.equal(
                positions(64, 1, 4, "balanced", r, one), positions(64, 1, 4, "zigzag", r)
            )
            for r in range(4)
        )


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
