"""Every mask on every scheme, multi-rank: ring, Ulysses and USP, forward and backward, against
the float64 reference with the same mask (tolerance `TOLERANCE["float32"]`, 2e-4 relative to
the reference's scale; measured max error ~3e-6); the bytes of a shortened ring equal the
protocol of docs/design.md exactly. The pool spawns the 4 gloo ranks once for the session."""

from __future__ import annotations

import pytest

from cpbench.app.verify import _mask_matrix, mask_cases
from cpbench.bench.reference import run_cases_on_rank
from cpbench.config.bench import VerifyCase
from cpbench.config.geometry import pack, ring_schedule
from cpbench.config.masks import MaskSpec
from cpbench.config.tolerances import TOLERANCE
from cpbench.config.vocabulary import LAYOUTS
from cpbench.errors import CpbenchError
from tests import rank_tasks

WORLD = 4
SEQ_LEN = 16 * WORLD * 2  # what `cpbench verify` runs at 4 ranks


def test_every_mask_layout_scheme_gqa_case_matches_reference(pool) -> None:  # type: ignore[no-untyped-def]
    """The verify matrix's mask part: 3 meshes x 5 layouts x 7 masks (documents shorter than a
    chunk, single-token documents, a document spanning every rank, windows 1, 5, L/4 + 8 and
    8L, documents with a window) x kv_heads 8, 2, 1 (fewer KV heads than ranks)."""
    cases = _mask_matrix(WORLD, SEQ_LEN, "float32", "auto", "cpbench")
    assert len(cases) == 3 * len(LAYOUTS) * 7 * 3
    records = pool(WORLD).run(run_cases_on_rank, cases, timeout=600)[0]
    assert len(records) == len(cases)
    bad = [(r["label"], r.get("errors"), r.get("error")) for r in records if not r["passed"]]
    assert not bad
    assert max(r["max_error"] for r in records) < TOLERANCE["float32"]
    assert {r["scheme"] for r in records} == {"ring", "usp", "ulysses"}


def test_edge_cases_are_what_they_claim() -> None:
    docs, _, *windows, mixed = mask_cases(SEQ_LEN)
    assert docs.documents is not None and 1 in docs.documents
    chunk = SEQ_LEN // (2 * WORLD)
    assert min(docs.documents) < chunk
    # The long document starts on contiguous ring rank 0 and ends on rank 3.
    start = sum(docs.documents[:3])
    shard = SEQ_LEN // WORLD
    assert start < shard and start + docs.documents[3] > 3 * shard
    assert [w.window for w in windows] == [1, 5, SEQ_LEN // 4 + 8, 8 * SEQ_LEN]
    assert mixed.kind == "document_sliding_window"


MIXED = [
    (1, 4, "contiguous", (5, 40, 1, 18), None, 2, "naive"),
    (1, 4, "zigzag", (5, 40, 1, 18), 6, 4, "naive"),
    (1, 4, "doc_zigzag", (5, 40, 1, 18), 6, 1, "naive"),
    (2, 2, "balanced", (5, 40, 1, 18), None, 2, "naive"),
    (2, 2, "striped", None, 9, 1, "sdpa"),
    (4, 1, "contiguous", (5, 40, 1, 18), 3, 4, "sdpa"),
    (1, 4, "striped", (7, 7, 50), None, 4, "sdpa"),
]


def test_the_check_can_fail_and_the_naive_kernel_agrees(pool) -> None:  # type: ignore[no-untyped-def]
    """Through the einsum and the CPU kernels: every case within 2e-5 of the reference with
    the same mask, and far (> 1e-2) from the mask-blind causal answer, so a dropped mask
    could not pass."""
    results = pool(WORLD).run(rank_tasks.masked_against_reference, MIXED, timeout=300)[0]
    for case, errors in zip(MIXED, results, strict=True):
        assert errors is not None
        assert max(errors[n] for n in ("out", "dq", "dk", "dv")) < 2e-5, (case, errors)
        assert errors["causal_out"] > 1e-2, (case, errors)


def _chunk_bytes(seq_len: int, ring: int, kv_heads: int, head_dim: int, batch: int, size: int):  # type: ignore[no-untyped-def]
    return batch * (seq_len // ring) * 2 * kv_heads * head_dim * size


@pytest.mark.parametrize(
    ("layout", "documents", "window", "steps"),
    [
        ("contiguous", None, 64 // 8, 2),  # a window of L/8 on a ring of 4: k = 2
        ("contiguous", None, 1, 1),  # every query sees only itself: no hop at all
        ("contiguous", None, 17, 2),  # W - 1 = 16 = one shard back: still 2
        ("contiguous", None, 18, 3),
        ("zigzag", None, 8, 4),  # zigzag's far chunk sees the whole ring: no hop skipped
        ("contiguous", (16, 16, 16, 16), None, 1),  # documents aligned to the shards
        ("doc_zigzag", (10, 20, 34), None, 4),
    ],
)
def test_bytes_of_a_shortened_ring_equal_the_protocol(pool, layout, documents, window, steps) -> None:  # type: ignore[no-untyped-def]
    """Per rank: forward k - 1 K/V hops; backward k - 1 K/V hops and k - 1 fp32 dK/dV hops (the
    last straight home), none when k = 1; of the run length's chunk. fp32, 4 heads, kv 2."""
    seq_len, heads, kv_heads, head_dim, batch = 64, 4, 2, 8, 2
    mask = MaskSpec(documents=documents, window=window)
    packed = pack(mask, seq_len, 1, 4, layout)
    assert ring_schedule(packed).steps == steps
    per_rank = pool(WORLD).run(
        rank_tasks.count_bytes, seq_len, heads, kv_heads, head_dim, batch, 1, 4, layout,
        "float32", "full", documents, window, timeout=120,
    )  # fmt: skip
    chunk = _chunk_bytes(packed.seq_len, 4, kv_heads, head_dim, batch, 4)
    fwd = {"p2p_kv": (steps - 1) * chunk} if steps > 1 else {}
    bwd = {"p2p_kv": (steps - 1) * chunk, "p2p_dkv": (steps - 1) * chunk} if steps > 1 else {}
    for counted in per_rank:
        assert counted.get("fwd", {}) == fwd, counted
        assert counted.get("bwd", {}) == bwd, counted


def test_shortened_ring_variants(pool) -> None:  # type: ignore[no-untyped-def]
    """Window L/8 on a ring of 4: the compute variant sends nothing, the comm variant the same
    bytes as the full step; with Ulysses x ring (2 x 2) the all-to-alls are unchanged and the
    ring's hops shortened (k = 2 of 2: L/8 = 8 reaches one 16-token shard back)."""
    args = (64, 4, 2, 8, 2, 1, 4, "contiguous", "float32")
    full = pool(WORLD).run(rank_tasks.count_bytes, *args, "full", None, 8, timeout=60)
    compute = pool(WORLD).run(rank_tasks.count_bytes, *args, "compute", None, 8, timeout=60)
    comm = pool(WORLD).run(rank_tasks.count_bytes, *args, "comm", None, 8, timeout=60)
    assert all(c == {} for c in compute)
    assert comm == full
    usp_args = (64, 4, 2, 8, 2, 2, 2, "contiguous", "float32", "full")
    windowed = pool(WORLD).run(rank_tasks.count_bytes, *usp_args, None, 8, timeout=60)
    plain = pool(WORLD).run(rank_tasks.count_bytes, *usp_args, timeout=60)
    for w, p in zip(windowed, plain, strict=True):
        assert {t: b for t, b in w["fwd"].items() if t.startswith("a2a")} == {
            t: b for t, b in p["fwd"].items() if t.startswith("a2a")
        }
    assert windowed == plain  # R = 2, W = 8 < shard 32: still both steps


def test_mask_errors_are_records_not_hangs(pool) -> None:  # type: ignore[no-untyped-def]
    """A document list that does not fill the sequence is refused when the case is built (before
    any rank runs); a case a kernel refuses on the ranks (a band through flash-attn, absent on
    CPU) is a skipped record with the reason on every rank, and the pool stays usable: the next
    case, a window through the einsum kernel, passes."""
    with pytest.raises(CpbenchError, match="sum to 30"):
        VerifyCase(ulysses=1, ring=4, layout="zigzag", heads=4, kv_heads=4, seq_len=64, documents=(10, 20))
    wrong = VerifyCase(ulysses=1, ring=4, layout="contiguous", heads=4, kv_heads=4, seq_len=64, window=5, kernel="flash_attn")
    naive = VerifyCase(ulysses=1, ring=4, layout="contiguous", causal=True, heads=4, kv_heads=4, seq_len=64, window=5, kernel="naive")
    records = pool(WORLD).run(run_cases_on_rank, [wrong, naive], timeout=60)[0]
    assert records[0]["passed"] is None and "flash" in records[0]["skipped"].lower()
    assert records[1]["passed"]
