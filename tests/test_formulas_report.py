"""The `cpbench formulas` application service: its typed report, --json and rendering."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from cpbench.app.formulas import formulas_report
from cpbench.app.formulas_schema import FormulasReport
from cpbench.cli.main import app
from cpbench.config.problem import CpProblem
from cpbench.config.vocabulary import PASSES
from cpbench.errors import CpbenchError
from cpbench.model.formulas import comm_volume
from cpbench.render.formulas import render_formulas
from cpbench.units import format_bytes, format_count
from tests.formula_oracle import evaluate_formula

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

TOP_LEVEL_KEYS = {
    "schema_version",
    "inputs",
    "mesh",
    "symbols",
    "shapes",
    "communication",
    "nccl_tests",
    "flops",
    "work",
    "memory",
    "what_if",
}


@pytest.fixture(scope="module")
def usp_report() -> FormulasReport:
    return formulas_report(CpProblem(seq_len=262144, heads=32, kv_heads=8, head_dim=128, ulysses=4, ring=2, layout="zigzag"))


def test_report_is_json_with_every_section(usp_report: FormulasReport) -> None:
    dumped = usp_report.model_dump(mode="json")
    assert set(dumped) == TOP_LEVEL_KEYS
    assert json.loads(json.dumps(dumped)) == dumped
    assert FormulasReport.model_validate(dumped) == usp_report  # the JSON reads back whole
    assert dumped["schema_version"] == 1
    assert usp_report.mesh.scheme == "usp"
    assert usp_report.mesh.world_size == 8
    assert usp_report.inputs.dtype == "bfloat16"


def test_shapes_before_and_after_the_ulysses_exchange(usp_report: FormulasReport) -> None:
    # L=262144, U=4, R=2: S = 262144/8 = 32768 tokens per rank, L/R = 131072 after the exchange
    shapes = usp_report.shapes
    assert shapes.q.local == [1, 32768, 32, 128]
    assert shapes.q.after_all_to_all == [1, 131072, 8, 128]
    assert shapes.k.after_all_to_all == [1, 131072, 2, 128]
    assert shapes.ring_kv_chunk == [2, 1, 131072, 2, 128]


def test_report_numbers_match_the_model_and_the_formulas(usp_report: FormulasReport) -> None:
    config = CpProblem(seq_len=262144, heads=32, kv_heads=8, head_dim=128, ulysses=4, ring=2, layout="zigzag").require_feasible()
    volume = comm_volume(config)
    comm = usp_report.communication
    assert tuple(comm.by_pass()) == PASSES
    for phase, totals in comm.by_pass().items():
        assert totals.bytes_per_rank == volume.bytes_sent(phase)
        assert totals.global_bytes == 8 * volume.bytes_sent(phase)
        for stage in totals.stages:
            assert evaluate_formula(stage.bytes_substituted, {}) == stage.bytes_sent
            for c in stage.collectives:
                assert evaluate_formula(c.substituted, {}) == c.elements_sent
                assert evaluate_formula(c.bytes_substituted, {}) == c.bytes_sent
    assert comm.forward_backward.bytes_per_rank == sum(volume.bytes_sent(p) for p in PASSES)
    nccl = {(r.phase, r.name): r for r in usp_report.nccl_tests.collectives}
    # a2a_q hands in B*S*h*d_h = 32768*32*128 elements * 2 B = 256 MiB; busbw factor 3/4
    assert nccl["forward", "a2a_q"].size_bytes == 256 * 2**20
    assert nccl["forward", "a2a_q"].busbw_factor == 0.75
    assert nccl["forward", "a2a_q"].bus_bytes_per_call == 192 * 2**20
    assert nccl["backward", "p2p_dkv"].busbw_factor == 1.0


def test_flops_work_memory_and_what_if(usp_report: FormulasReport) -> None:
    flops, work = usp_report.flops, usp_report.work
    assert sum(flops.per_rank.forward) == pytest.approx(flops.global_.forward, 1e-9)
    assert flops.global_.forward_backward == 3.5 * flops.global_.forward
    assert "2.5" in flops.convention
    assert work.imbalance == 1.0  # zigzag
    assert work.rank_chunk_units == [16.0] * 8  # 2P per rank when balanced
    memory = usp_report.memory
    assert memory.forward.peak <= memory.forward_backward.peak
    assert sum(i.bytes for i in memory.items) == memory.forward_backward.total
    what_if = usp_report.what_if
    assert what_if.budget_gib == 80
    assert what_if.max_seq_len_forward >= what_if.max_seq_len_forward_backward > 262144
    assert what_if.max_seq_len_forward % what_if.seq_divisor == 0


@pytest.mark.parametrize(
    ("mesh", "scheme"),
    [
        ({}, "single"),
        ({"ulysses": 8}, "ulysses"),
        ({"ring": 8, "layout": "striped"}, "ring"),
        ({"ulysses": 2, "ring": 4, "layout": "contiguous", "causal": False}, "usp"),
    ],
)
def test_every_scheme_reports_and_renders(mesh: dict, scheme: str) -> None:
    report = formulas_report(CpProblem(seq_len=65536, heads=16, kv_heads=4, head_dim=64, batch=2, dtype="fp16", **mesh))
    assert report.mesh.scheme == scheme
    assert report.inputs.dtype == "float16"
    if scheme == "ulysses":
        assert report.mesh.kv_replication == 2  # 8 ranks, 4 KV heads
        assert report.shapes.k.replicated == [2, 8192, 8, 64]
    tables = render_formulas(report)
    assert tables and all(isinstance(t, Table) for t in tables)
    out = io.StringIO()
    Console(file=out, width=240).print(*tables)
    text = out.getvalue()
    assert "Communication per rank" in text
    assert "4*B*h*L^2*d_h" in text
    if scheme in {"ulysses", "usp"}:
        assert "(U-1)/U" in text


def test_long_ring_omits_the_step_matrix() -> None:
    report = formulas_report(CpProblem(seq_len=1 << 20, heads=32, kv_heads=8, head_dim=128, ring=64, layout="zigzag"))
    assert report.work.step_pairs is None
    assert len(report.work.step_max_pairs) == 64


def test_bad_input() -> None:
    with pytest.raises(CpbenchError, match=r"'int8'.*bfloat16"):
        formulas_report(CpProblem(seq_len=1024, heads=32, kv_heads=8, head_dim=128, dtype="int8"))
    with pytest.raises(CpbenchError, match=r"ulysses \(3\).*32"):
        formulas_report(CpProblem(seq_len=1024, heads=32, kv_heads=8, head_dim=128, ulysses=3))
    with pytest.raises(CpbenchError, match=r"1000.*16"):
        formulas_report(CpProblem(seq_len=1000, heads=32, kv_heads=8, head_dim=128, ulysses=4, ring=4))
    with pytest.raises(CpbenchError, match=r"30.*8"):
        formulas_report(CpProblem(seq_len=1024, heads=30, kv_heads=8, head_dim=128))
    with pytest.raises(CpbenchError, match="seq_len"):
        formulas_report(CpProblem(seq_len=0, heads=32, kv_heads=8, head_dim=128))


def test_formatting_helpers() -> None:
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(80 * 2**30) == "80.00 GiB"
    assert format_bytes(12) == "12 B"
    assert format_count(1.5e12) == "1.50 T"
    assert format_count(7) == "7"


GOLDEN = Path(__file__).parent / "fixtures" / "formulas_json.jsonl"
"""`cpbench formulas ARGS --json` of ten problems, captured before the report became typed
(`{"args": [...], "json": {...}}` a line): masks, all-gather strides, an infeasible layout row, a
ring too long for the step matrix."""


@pytest.mark.parametrize(
    "case",
    [json.loads(line) for line in GOLDEN.read_text(encoding="utf-8").splitlines()],
    ids=lambda case: " ".join(case["args"]) or "defaults",
)
def test_json_is_the_captured_shape_plus_its_version(case: dict) -> None:
    result = CliRunner().invoke(app, ["formulas", *case["args"], "--json"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith('{\n "schema_version": 1,\n')  # the first key
    document = json.loads(result.output)
    assert document.pop("schema_version") == 1
    # same keys in the same order, same values of the same JSON types (1 is not 1.0)
    assert json.dumps(document) == json.dumps(case["json"])
