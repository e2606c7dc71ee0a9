"""The mask-aware model: per-rank work, ring steps, bytes, cost and recommend under packed
documents and sliding windows."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cpbench.app.formulas import formulas_report
from cpbench.app.formulas_schema import LayoutRow
from cpbench.app.recommend import RecommendRequest, recommend_mesh
from cpbench.cli.main import app
from cpbench.config.constraints import AttentionShape
from cpbench.config.documents import resolve_documents
from cpbench.config.geometry import pack, rank_pairs, ring_schedule
from cpbench.config.masks import MaskSpec
from cpbench.config.problem import CpProblem, MeshCandidate
from cpbench.config.vocabulary import GLOBAL_LAYOUTS, LAYOUTS
from cpbench.model.cost.prediction import predict
from cpbench.model.flops import flops_breakdown, layout_work, mask_pairs
from cpbench.model.formulas import (
    FP32_BYTES,
    comm_volume,
    ring_kv_chunk_elements,
    substitute,
)
from cpbench.model.hardware.loading import load_profile
from cpbench.model.memory import memory_estimate
from cpbench.render.recommend.explanation import explanation_text
from cpbench.render.recommend.frameworks import setting_note
from tests.formula_oracle import evaluate_formula, ring_bytes_sent

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

runner = CliRunner()
H100 = load_profile("h100-sxm")
DOCS = MaskSpec(documents=(2, 6))


def brute_rank_pairs(mask: MaskSpec, seq_len: int, ulysses: int, ring: int, layout: str):
    """Token by token over the packing: every visible key counts 1, the diagonal 1/2."""
    packing = pack(mask, seq_len, ulysses, ring, layout)
    run_mask = packing.mask
    out = []
    for shard in packing.shards:
        total = Fraction(0)
        for run in shard:
            for q in run.positions():
                seen = sum(run_mask.visible(q, k) for k in range(packing.seq_len))
                total += seen - (Fraction(1, 2) if run_mask.causal else 0)
        out.append(total)
    return tuple(out)


# ---------------------------------------------------------------------- hand-computed work


@pytest.mark.parametrize(
    ("layout", "ranks", "steps"),
    [
        # L=8, R=2, documents (2, 6): doc A = positions 0-1, doc B = 2-7; a query at offset i of
        # its document sees i+1 keys, minus 1/2 for its diagonal (continuum convention).
        # contiguous: rank 0 = 0..3 -> 1+2+1+2 - 2 = 4; rank 1 = 4..7 -> 3+4+5+6 - 2 = 16;
        # at step 1 rank 1 sees rank 0's keys 2, 3 (doc B): 4 queries x 2 = 8
        ("contiguous", (4, 16), ((4, 8), (0, 8))),
        # zigzag: rank 0 = {0,1,6,7} -> 1+2+5+6 - 2 = 12; rank 1 = {2..5} -> 1+2+3+4 - 2 = 8
        ("zigzag", (12, 8), ((4, 8), (8, 0))),
        # striped: rank 0 = {0,2,4,6} -> 1+1+3+5 - 2 = 8; rank 1 = {1,3,5,7} -> 2+2+4+6 - 2 = 12
        ("striped", (8, 12), ((5, 5), (3, 7))),
        # doc_zigzag pads A to 4 (padding doc 2-3) and B to 8 (padding doc 10-11): rank 0 =
        # {0, 3, 4, 5, 10, 11} -> 1+2+1+2+1+2 - 3 = 6; rank 1 = {1, 2, 6..9} -> 2+1+3+4+5+6 - 3
        # = 18; 24 pairs run for the mask's 20
        ("doc_zigzag", (6, 18), ((5, 9), (1, 9))),
        # balanced: rank 0 = {2..5} -> 1+2+3+4 - 2 = 8; rank 1 = {0,1,6,7} -> 1+2+5+6 - 2 = 12
        ("balanced", (8, 12), ((8, 4), (0, 8))),
    ],
)
def test_hand_computed_pairs_for_a_small_document_set(
    layout: str, ranks: tuple[int, int], steps: tuple[tuple[int, int], ...]
) -> None:
    work = layout_work(CpProblem(heads=1, kv_heads=1, head_dim=8, seq_len=8, ulysses=1, ring=2, layout=layout).masked(DOCS))
    assert work.ring_rank_pairs == ranks
    assert work.step_pairs == steps
    assert work.useful_total == mask_pairs(DOCS, 8) == 20  # 3 + 21 exact, minus 8/2
    assert work.ring_rank_pairs == brute_rank_pairs(DOCS, 8, 1, 2, layout)
    if layout == "doc_zigzag":
        assert (work.padding, work.padding_pairs, work.padding_fraction) == (4, 4, 0.2)
        assert work.overhead == pytest.approx(18 / 10)
    else:
        assert (work.padding, work.padding_pairs) == (0, 0)
    assert work.imbalance == pytest.approx(float(max(ranks)) / (sum(ranks) / 2))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 9), min_size=1, max_size=6),
    st.sampled_from(LAYOUTS),
    st.sampled_from([1, 2, 3]),
    st.sampled_from([1, 2]),
    st.one_of(st.none(), st.integers(1, 12)),
)
def test_work_matches_token_by_token_counting(
    docs: list[int], layout: str, ring: int, ulysses: int, window: int | None
) -> None:
    seq_len = sum(docs)
    seq_len += -seq_len % (2 * ring * ulysses)
    docs[-1] += seq_len - sum(docs)
    mask = MaskSpec(documents=tuple(docs) if len(docs) > 1 else None, window=window)
    shape = AttentionShape(seq_len, 2, 2, 8)
    breakdown = flops_breakdown(CpProblem.for_shape(shape=shape, ulysses=ulysses, ring=ring, layout=layout).masked(mask))
    work = breakdown.work
    assert work.ring_rank_pairs == brute_rank_pairs(mask, seq_len, ulysses, ring, layout)
    assert work.ring_rank_pairs == rank_pairs(
        ring_schedule(pack(mask, seq_len, ulysses, ring, layout))
    )
    assert work.useful_total == mask_pairs(mask, seq_len)
    assert work.total >= work.useful_total
    # global rank p = j*U + u does 1/U of its ring rank's pairs
    assert sum(work.rank_pairs) == work.total
    assert sum(breakdown.rank_flops()) == pytest.approx(breakdown.run_flops(), rel=1e-12)
    assert work.imbalance >= 1.0 and work.overhead >= work.imbalance - 1e-12


@pytest.mark.parametrize("layout", GLOBAL_LAYOUTS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("ring", [1, 2, 3, 4, 8])
def test_closed_forms_agree_with_the_mask_geometry(layout: str, causal: bool, ring: int) -> None:
    seq_len = 2 * ring * 12
    closed = layout_work(CpProblem(heads=1, kv_heads=1, head_dim=8, seq_len=seq_len, ulysses=1, ring=ring, layout=layout, causal=causal))
    packing = pack(MaskSpec(causal=causal), seq_len, 1, ring, layout)
    schedule = ring_schedule(packing)
    assert schedule.steps == ring == closed.steps
    assert closed.ring_rank_pairs == rank_pairs(schedule)
    for t in range(ring):
        for j in range(ring):
            diagonal = Fraction(schedule.own_tokens[j], 2) if causal and t == 0 else 0
            assert closed.step_pairs[t][j] == schedule.pairs(j, t) - diagonal


def test_new_layouts_on_one_causal_sequence() -> None:
    # one causal document: balanced is zigzag (every rank 2R * (L/2R)^2 / ... equal work);
    # doc_zigzag of a length that 2R divides pads nothing and is zigzag too
    for layout in ("doc_zigzag", "balanced"):
        work = layout_work(CpProblem(heads=1, kv_heads=1, head_dim=8, seq_len=64, ulysses=1, ring=4, layout=layout))
        assert work.ring_rank_pairs == layout_work(CpProblem(heads=1, kv_heads=1, head_dim=8, seq_len=64, ulysses=1, ring=4, layout="zigzag")).ring_rank_pairs
        assert work.padding == 0 and work.steps == 4
    padded = layout_work(CpProblem(heads=1, kv_heads=1, head_dim=8, seq_len=60, ulysses=1, ring=4, layout="doc_zigzag"))  # 60 -> 64 tokens run
    assert padded.padding == 4 and padded.run_length == 64
    assert padded.useful_total == Fraction(60 * 60, 2)


# -------------------------------------------------------------------------------- windows


def test_window_hops_on_a_ring_of_four() -> None:
    # L = 64, R = 4, W = L/8 = 8: on contiguous a query sees at most the previous shard (16
    # tokens back > 8), so 2 ring steps; zigzag's chunk 7 reaches back to chunk 6 on another
    # rank at every step distance, so all 4
    window = MaskSpec(window=8)
    contiguous = CpProblem(seq_len=64, heads=8, kv_heads=8, head_dim=16, ring=4, layout="contiguous").masked(window).require_feasible()
    zigzag = CpProblem(seq_len=64, heads=8, kv_heads=8, head_dim=16, ring=4, layout="zigzag").masked(window).require_feasible()
    assert (contiguous.ring_steps, contiguous.kv_hops, contiguous.dkv_hops) == (2, 1, 1)
    assert (zigzag.ring_steps, zigzag.kv_hops, zigzag.dkv_hops) == (4, 3, 3)
    assert layout_work(CpProblem(heads=1, kv_heads=1, head_dim=8, seq_len=64, ulysses=1, ring=4, layout="contiguous").masked(window)).steps == 2
    # a window larger than the sequence is causal attention: every step
    assert CpProblem(seq_len=64, heads=8, kv_heads=8, head_dim=16, ring=4).masked(MaskSpec(window=1000)).require_feasible().ring_steps == 4


@pytest.mark.parametrize("window", [1, 8, 16, 17, 40, 64])
@pytest.mark.parametrize("ulysses", [1, 2])
def test_ring_bytes_are_k_hop_arithmetic(window: int, ulysses: int) -> None:
    mask = MaskSpec(window=window)
    config = CpProblem(seq_len=128, heads=8, kv_heads=4, head_dim=16, batch=2, ulysses=ulysses, ring=4, layout="contiguous", dtype="bf16").masked(mask).require_feasible()
    k = config.ring_steps
    assert k == ring_schedule(pack(mask, 128, ulysses, 4, "contiguous")).steps
    chunk = ring_kv_chunk_elements(config)  # 2*B*(L/R)*(c*h_kv/U)*d_h
    assert chunk == 2 * 2 * 32 * (4 // ulysses) * 16
    kv = (k - 1) * chunk * 2
    dkv = (k - 1) * chunk * FP32_BYTES  # the own chunk's gradient stays home
    assert ring_bytes_sent(config, "forward") == kv
    assert ring_bytes_sent(config, "backward") == kv + dkv
    volume = comm_volume(config)
    symbols = config.symbols()
    assert symbols["k"] == k
    for phase in ("forward", "backward"):
        for stage in volume.stages(phase):
            assert evaluate_formula(stage.bytes_formula, symbols) == stage.bytes_sent
            assert evaluate_formula(substitute(stage.bytes_formula, symbols), {}) == (
                stage.bytes_sent
            )
            for c in stage.collectives:
                assert evaluate_formula(c.formula, symbols) == c.elements_sent
                if c.stage == "ring" and k < 4:
                    assert "k" in c.formula and "R-1" not in c.formula
    full = CpProblem(seq_len=128, heads=8, kv_heads=4, head_dim=16, batch=2, ulysses=ulysses, ring=4, layout="contiguous", dtype="bf16").require_feasible()
    assert ring_bytes_sent(config, "backward") <= ring_bytes_sent(full, "backward")


def test_doc_zigzag_bytes_and_memory_use_the_run_length() -> None:
    mask = MaskSpec(documents=(10, 20, 30))  # R = 4: pad to 16 + 24 + 32 = 72 tokens
    config = CpProblem(seq_len=60, heads=8, kv_heads=8, head_dim=16, ring=4, layout="doc_zigzag").masked(mask).require_feasible()
    assert (config.run_len, config.padding, config.ring_shard) == (72, 12, 18)
    assert ring_kv_chunk_elements(config) == 2 * 18 * 8 * 16
    ring_stage = comm_volume(config).forward[0]
    assert "L_run" in ring_stage.formula
    assert evaluate_formula(ring_stage.formula, config.symbols()) == ring_stage.elements_sent
    padded = memory_estimate(CpProblem(seq_len=60, heads=8, kv_heads=8, head_dim=16, ring=4, layout="doc_zigzag").masked(mask).require_feasible())
    same = memory_estimate(CpProblem(seq_len=72, heads=8, kv_heads=8, head_dim=16, ring=4, layout="contiguous").require_feasible())
    assert padded.peak("forward_backward") == same.peak("forward_backward")


# ---------------------------------------------------------------------- balance and cost


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_balanced_is_no_worse_than_zigzag_on_a_lognormal_mix(seed: int) -> None:
    docs = resolve_documents("lognormal:mean=1024", 8192, seed)
    mask = MaskSpec(documents=docs)
    zigzag = layout_work(CpProblem(heads=1, kv_heads=1, head_dim=8, seq_len=8192, ulysses=1, ring=4, layout="zigzag").masked(mask))
    balanced = layout_work(CpProblem(heads=1, kv_heads=1, head_dim=8, seq_len=8192, ulysses=1, ring=4, layout="balanced").masked(mask))
    assert balanced.padding == 0
    assert balanced.busiest_step_sum <= zigzag.busiest_step_sum
    assert balanced.imbalance <= zigzag.imbalance + 1e-9
    assert balanced.imbalance < 1.1


def test_predictions_follow_the_mask() -> None:
    shape = AttentionShape(65536, 32, 8, 128)
    plain = predict(MeshCandidate.for_shape(shape=shape, ulysses=1, ring=8, layout="contiguous"), H100, 8)
    window = predict(MeshCandidate.for_shape(shape=shape, ulysses=1, ring=8, layout="contiguous", window=4096), H100, 8)
    assert (plain.ring_steps, window.ring_steps) == (8, 2)
    assert window.forward.ring_comm_s < plain.forward.ring_comm_s / 3
    assert window.step_s < plain.step_s
    assert window.phase_time.steps == 2 * 2  # forward + backward, 2 steps each
    config = {
        "seq_len": 8192, "heads": 8, "kv_heads": 8, "head_dim": 64, "ulysses": 1, "ring": 4,
        "layout": "doc_zigzag", "dtype": "float32", "documents": [1001, 3000, 4191],
        "window": None,
    }  # fmt: skip
    candidate = MeshCandidate.from_record(config)
    assert candidate.mask == MaskSpec(documents=(1001, 3000, 4191))
    p = predict(config, load_profile("cpu-local"))
    assert p.padding == p.candidate.padding > 0 and p.kernel_seq_len == p.candidate.run_len // 4
    assert MeshCandidate.from_record({**config, "documents": None, "window": 512}).window == 512


def test_without_a_causal_mask_every_layout_costs_the_same() -> None:
    shape = AttentionShape(65536, 32, 8, 128)
    times = {
        round(predict(MeshCandidate.for_shape(shape=shape, ulysses=2, ring=8, layout=layout, causal=False), H100, 8).step_s, 12)
        for layout in LAYOUTS
    }
    assert len(times) == 1


# ---------------------------------------------------------------------- formulas, recommend


def test_formulas_report_compares_the_layouts() -> None:
    docs = resolve_documents("lognormal:mean=1024", 8192, 0)
    report = formulas_report(CpProblem(seq_len=8192, heads=32, kv_heads=8, head_dim=128, ring=4, layout="zigzag").masked(MaskSpec(documents=docs, window=1024)))
    section = report.mask
    assert section is not None
    rows = {row.layout: row for row in section.layouts if isinstance(row, LayoutRow)}
    assert set(rows) == set(LAYOUTS)
    assert rows["contiguous"].ring_steps < 4 and rows["contiguous"].hops_saved > 0
    assert rows["doc_zigzag"].padding_tokens > 0 and rows["balanced"].padding_tokens == 0
    for row in rows.values():
        config = CpProblem(seq_len=8192, heads=32, kv_heads=8, head_dim=128, ring=4, layout=row.layout).masked(MaskSpec(documents=docs, window=1024)).require_feasible()
        volume = comm_volume(config)
        assert row.bytes_forward == volume.bytes_sent("forward")
        assert row.kv_hops == row.ring_steps - 1
    assert report.work.ring_steps == rows["zigzag"].ring_steps
    dumped = report.model_dump(mode="json")
    assert json.loads(json.dumps(dumped)) == dumped and "mask" in dumped
    plain = formulas_report(CpProblem(seq_len=8192, heads=32, kv_heads=8, head_dim=128, ring=4))
    assert plain.mask is None and "mask" not in plain.model_dump(mode="json")


@pytest.fixture
def documents_file(tmp_path: Path) -> Path:
    path = tmp_path / "lengths.txt"
    lengths = resolve_documents("lognormal:mean=4096", 131072, 1)
    path.write_text("# document lengths\n" + "\n".join(str(x) for x in lengths) + "\n")
    return path


def test_recommend_cli_with_documents_and_window(documents_file: Path) -> None:
    args = ["recommend", "--heads", "32", "--kv-heads", "8", "--documents", str(documents_file)]
    result = runner.invoke(app, [*args, "--window", "4096"])
    assert result.exit_code == 0, result.output
    assert "Why:" in result.stdout and "document (" in result.stdout
    assert "Ulysses is balanced under any mask" in result.stdout or "layout runs" in result.stdout
    doc = json.loads(runner.invoke(app, [*args, "--window", "4096", "--json"]).stdout)
    assert doc["inputs"]["mask"] == "document_sliding_window" and doc["inputs"]["window"] == 4096
    assert doc["winner"]["scheme"] in ("ulysses", "ring", "usp")
    assert {c["layout"] for c in doc["candidates"]} <= set(LAYOUTS)
    assert doc["explanation"] and doc["winner"]["layout"] in LAYOUTS
    assert "ring-flash-attn" in {f["framework"] for f in doc["frameworks"]}
    assert "documents" in {c["kind"] for c in doc["frameworks"][0]["caveats"]}
    asked = RecommendRequest(heads=32, kv_heads=8, documents=str(documents_file), window=4096)
    assert "THD" in setting_note(recommend_mesh(asked).frameworks[0])


def test_recommend_ranks_every_layout_with_documents(documents_file: Path) -> None:
    rec = recommend_mesh(
        RecommendRequest(heads=32, kv_heads=8, documents=str(documents_file), gpus=8, top=0)
    )
    ring_layouts = {r.prediction.candidate.layout for r in rec.ranked if r.prediction.candidate.ring > 1}
    assert ring_layouts == set(LAYOUTS)
    why = explanation_text(rec.explanation)
    assert "global zigzag leaves ring rank" in why and "the balanced layout brings it to" in why
    assert rec.explanation is not None and rec.explanation.mask is not None
    assert set(rec.explanation.mask.layouts) == set(LAYOUTS)
    windowed = recommend_mesh(RecommendRequest(heads=32, kv_heads=8, window=4096, gpus=8, top=0))
    ring_layouts = {
        r.prediction.candidate.layout for r in windowed.ranked if r.prediction.candidate.ring > 1
    }
    assert ring_layouts == set(GLOBAL_LAYOUTS)
    assert "ring steps on contiguous" in explanation_text(windowed.explanation)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--documents", "nosuchfile.txt"], "documents 'nosuchfile.txt'"),
        (["--documents", "lognormal:mean=-3"], "lognormal needs mean=<positive number>"),
        (["--documents", "100,200"], "documents '100,200' sum to 300"),
        (["--window", "0"], "--window must be a positive number of tokens, got 0"),
        (["--window", "64", "--no-causal"], "a sliding window (64) needs a causal mask"),
    ],
)
@pytest.mark.parametrize("command", ["recommend", "formulas"])
def test_bad_documents_or_window_exit_2(command: str, args: list[str], message: str) -> None:
    result = runner.invoke(app, [command, "--heads", "32", "--kv-heads", "8", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output + result.stderr


def test_formulas_cli_with_documents_and_window(documents_file: Path) -> None:
    result = runner.invoke(
        app,
        ["formulas", "--seq-len", "131072", "--ring", "4", "--documents", str(documents_file),
         "--window", "4096", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["inputs"]["window"] == 4096 and doc["mask"]["window"] == 4096
    text = runner.invoke(
        app, ["formulas", "--seq-len", "8192", "--ring", "4", "--window", "1024"],
        terminal_width=200,
    ).stdout  # fmt: skip
    assert "Layouts under window 1024" in text and "k = ring steps the mask needs" in text
