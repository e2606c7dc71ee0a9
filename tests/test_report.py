"""The HTML report: figure builders on the synthetic fixture, page assembly (offline, escaped,
notes instead of empty charts), comparison mode and the `cpbench report` command."""

from __future__ import annotations

import copy
import json
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pytest
from plotly.offline import get_plotlyjs
from typer.testing import CliRunner

from cpbench.app.report import build_comparison, build_report, write_report
from cpbench.app.report.data import NO_PROFILE_NOTE, ComparisonData, ReportData
from cpbench.app.report.predictions import default_hardware
from cpbench.app.report.recommendation import measured_best, measured_workload
from cpbench.app.report.summary import summarize
from cpbench.cli.main import app
from cpbench.errors import CpbenchError
from cpbench.render.figures import (
    balance,
    common,
    communication,
    compare,
    memory,
    prediction,
    timing,
)
from cpbench.render.html.comparison import render_comparison
from cpbench.render.html.document import STATIC_FILES, Page, environment
from cpbench.render.html.report import render_report
from cpbench.results.frame import compare_frame
from cpbench.results.store import SOURCE_KEY, read_records, records_frame

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

FIXTURES = Path(__file__).parent / "fixtures"
SWEEP = FIXTURES / "sweep.jsonl"
AFTER = FIXTURES / "after.jsonl"
WHEN = datetime(2026, 11, 29, 20, 0, tzinfo=timezone.utc)
HOSTILE = "<script>alert(1)</script>"
BUNDLE_OPEN = '<script type="text/javascript">'
runner = CliRunner()

SERIES = {
    "U4xR1 contiguous",
    "U2xR2 contiguous",
    "U2xR2 zigzag",
    "U2xR2 striped",
    "U1xR4 contiguous",
    "U1xR4 zigzag",
    "U1xR4 striped",
}


@pytest.fixture(scope="module")
def records() -> list[dict]:
    return read_records(SWEEP)


@pytest.fixture(scope="module")
def frame(records: list[dict]) -> pd.DataFrame:
    return records_frame(records)


def _report(paths: list[Path], **kwargs) -> Page:
    """The service's data drawn as a page (what `cpbench report` writes)."""
    return render_report(build_report(paths, **kwargs))


@pytest.fixture(scope="module")
def page() -> str:
    return _report([SWEEP], generated_at=WHEN).html


def _strip(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != SOURCE_KEY}


def _write(path: Path, recs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(_strip(r)) + "\n" for r in recs))
    return path


# ------------------------------------------------------------------------------ the figures


def test_step_time_one_line_per_mesh_and_layout_and_a_facet_per_phase(frame: pd.DataFrame):
    fig = timing.step_time_figure(frame)
    assert fig is not None
    assert len(fig.data) == 14  # 7 (mesh, layout) series x 2 phases
    assert {t.name for t in fig.data} == SERIES
    assert [a.text for a in fig.layout.annotations] == ["phase fwd", "phase fwd+bwd"]
    for trace in fig.data:
        assert list(trace.x) == [1024, 2048, 4096]
        assert all(lo >= 0 for lo in trace.error_y.arrayminus)
    assert sum(bool(t.showlegend) for t in fig.data) == 7  # each series in the legend once
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    zigzag = next(t for t in fig.data if t.name == "U1xR4 zigzag" and t.xaxis == "x2")
    ok = frame[(frame["status"] == "ok") & (frame["phase"] == "fwd+bwd")]
    expect = ok[(ok["mesh"] == "U1xR4") & (ok["layout"] == "zigzag")].sort_values("seq_len")
    assert list(zigzag.y) == pytest.approx(list(expect["median_s"] * 1e3))


def test_facets_exist_only_for_phases_with_data(frame: pd.DataFrame):
    only_fwd_bwd = frame[frame["phase"] == "fwd+bwd"]
    fig = timing.step_time_figure(only_fwd_bwd)
    assert [a.text for a in fig.layout.annotations] == ["phase fwd+bwd"]
    assert len(fig.data) == 7


def test_every_builder_returns_none_without_data(frame: pd.DataFrame):
    failures = frame[frame["status"] != "ok"]
    builders = (
        timing.step_time_figure,
        timing.throughput_figure,
        communication.comm_bytes_figure,
        timing.bandwidth_figure,
        communication.overlap_figure,
        memory.memory_figure,
        balance.load_balance_figure,
        timing.heatmap_figure,
        prediction.prediction_figure,
    )
    for build in builders:
        assert build(failures) is None, build.__name__
        assert build(records_frame([])) is None, build.__name__


def test_throughput_adds_a_fraction_of_peak_row_when_known(frame: pd.DataFrame):
    plain = timing.throughput_figure(frame)
    assert len(plain.data) == 14 and "peak" not in plain.layout.title.text
    with_peak = frame.copy()
    with_peak["peak_fraction"] = with_peak["achieved_tflops"] / 0.312
    fig = timing.throughput_figure(with_peak)
    assert len(fig.data) == 28
    fractions = [t for t in fig.data if t.yaxis in ("y3", "y4")]
    assert len(fractions) == 14
    first = with_peak[(with_peak["status"] == "ok")].iloc[0]
    trace = next(
        t for t in fractions if t.name == f"{first['mesh']} {first['layout']}" and t.yaxis == "y3"
    )
    assert trace.y[0] == pytest.approx(first["peak_fraction"] * 100)


def test_comm_mismatch_is_a_red_cross_on_the_right_point(frame: pd.DataFrame):
    fig = communication.comm_bytes_figure(frame)
    assert fig is not None
    bad = [t for t in fig.data if t.name == "MISMATCH"]
    assert len(bad) == 1
    (trace,) = bad
    assert trace.marker.color == common.MISMATCH_COLOR and trace.marker.symbol == "x"
    row = frame[frame["comm_mismatch"].fillna(False).astype(bool)].iloc[0]
    assert list(trace.x) == [row["analytic_bwd_bytes"]]
    assert list(trace.y) == [row["measured_bwd_bytes"]]
    assert row["id"] in trace.customdata[0] and "+4,096 B" in trace.customdata[0]
    assert "1 mismatch" in fig.layout.title.text
    matching = [t for t in fig.data if t.mode == "markers" and t.name != "MISMATCH"]
    assert all(list(t.x) == list(t.y) for t in matching)
    # every ok record has a fwd point; fwd+bwd records also a bwd point
    ok = frame[frame["status"] == "ok"]
    points = sum(len(t.x) for t in fig.data if t.mode == "markers")
    assert points == len(ok) + (ok["phase"] == "fwd+bwd").sum()


def test_comm_figure_without_mismatch_has_no_red(frame: pd.DataFrame):
    clean = frame[~frame["comm_mismatch"].fillna(False).astype(bool)]
    fig = communication.comm_bytes_figure(clean)
    assert all(t.name != "MISMATCH" for t in fig.data)
    assert "mismatch" not in fig.layout.title.text


def test_bandwidth_lines(frame: pd.DataFrame):
    fig = timing.bandwidth_figure(frame)
    assert len(fig.data) == 14 and {t.name for t in fig.data} == SERIES


def test_overlap_stacks_compute_and_exposed_comm_to_the_step(frame: pd.DataFrame):
    fig = communication.overlap_figure(frame)
    assert fig.layout.barmode == "stack"
    bars = [t for t in fig.data if t.type == "bar"]
    overlap = [t for t in fig.data if t.type == "scatter"]
    assert len(bars) == 4 and len(overlap) == 2  # compute + exposed per phase, overlap markers
    compute = next(t for t in bars if t.name.startswith("compute") and t.xaxis == "x")
    exposed = next(t for t in bars if t.name.startswith("exposed") and t.xaxis == "x")
    ok = frame[(frame["status"] == "ok") & (frame["phase"] == "fwd")]
    assert len(compute.x) == len(ok) == 21
    totals = [c + e for c, e in zip(compute.y, exposed.y, strict=True)]
    steps = dict(zip(compute.x, totals, strict=True))
    label = "U1xR4 contiguous 4K"
    row = ok[(ok["mesh"] == "U1xR4") & (ok["layout"] == "contiguous") & (ok["seq_len"] == 4096)]
    assert steps[label] == pytest.approx(float(row["median_s"].iloc[0]) * 1e3)
    assert all(0 <= v <= 100 for v in overlap[0].y if v is not None)


def test_memory_measured_and_analytic_per_mesh(frame: pd.DataFrame):
    fig = memory.memory_figure(frame)
    names = {t.name for t in fig.data}
    assert names == {
        f"{m} {w}" for m in ("U4xR1", "U2xR2", "U1xR4") for w in ("measured", "analytic")
    }
    assert len(fig.data) == 12
    analytic = [t for t in fig.data if t.name.endswith("analytic")]
    assert all(t.line.dash == "dash" for t in analytic)
    measured = next(t for t in fig.data if t.name == "U1xR4 measured" and t.xaxis == "x")
    ok = frame[(frame["status"] == "ok") & (frame["phase"] == "fwd") & (frame["mesh"] == "U1xR4")]
    expect = ok.groupby("seq_len")["peak_bytes"].max() / 1024**2
    assert list(measured.y) == pytest.approx(list(expect))


def test_load_balance_contiguous_vs_zigzag_vs_striped(frame: pd.DataFrame):
    fig = balance.load_balance_figure(frame)
    titles = [a.text for a in fig.layout.annotations]
    assert titles == [
        "U2xR2 fwd L=4K",
        "U1xR4 fwd L=4K",
        "U2xR2 fwd+bwd L=4K",
        "U1xR4 fwd+bwd L=4K",
    ]  # pure Ulysses (U4xR1) has no ring: the layout does not change its balance
    assert {t.name for t in fig.data} == {"contiguous", "zigzag", "striped"}
    assert len(fig.data) == 12
    ring = [t for t in fig.data if t.xaxis == "x2"]  # U1xR4 fwd
    spread = {t.name: max(t.y) / min(t.y) for t in ring}
    assert spread["contiguous"] > 3 and spread["zigzag"] < 1.01 and spread["striped"] < 1.01
    assert list(ring[0].x) == ["rank 0", "rank 1", "rank 2", "rank 3"]


def test_heatmap_one_per_sequence_length_relative_to_the_fastest(frame: pd.DataFrame):
    fig = timing.heatmap_figure(frame)
    assert [t.name for t in fig.data] == ["L=1K", "L=2K", "L=4K"]
    assert "fwd+bwd" in fig.layout.title.text
    for trace in fig.data:
        assert list(trace.y) == ["U=1", "U=2", "U=4"] and list(trace.x) == ["R=1", "R=2", "R=4"]
        values = [v for row in trace.z for v in row if v is not None]
        assert min(values) == pytest.approx(1.0) and len(values) == 3  # the P=4 diagonal
        assert trace.z[0][0] is None  # U=1 x R=1 was not measured
    cell = fig.data[2].text[2][0]  # U=4, R=1 at 4K: only contiguous ran
    assert "contiguous" in cell and "ms" in cell


def test_prediction_needs_predicted_times(frame: pd.DataFrame):
    assert prediction.prediction_figure(frame) is None
    with_model = frame.copy()
    with_model["predicted_s"] = with_model["median_s"] * 1.2
    fig = prediction.prediction_figure(with_model)
    errors = next(t for t in fig.data if t.type == "bar")
    ok = with_model["median_s"].notna().sum()
    assert len(errors.y) == ok and all(e == pytest.approx(20.0) for e in errors.y)
    assert "median |error| 20%" in fig.layout.title.text


def test_compare_frame_and_figure(frame: pd.DataFrame):
    after = records_frame(read_records(AFTER))
    compared = compare_frame(frame, after)
    matched = compared[compared["ratio"].notna()]
    assert len(matched) == 7 and len(compared) == len(frame)
    assert list(compared["ratio"].notna()[:7]) == [True] * 7  # matched rows first
    zig = matched[(matched["mesh"] == "U1xR4") & (matched["layout"] == "zigzag")].iloc[0]
    assert zig["ratio"] == pytest.approx(zig["after_s"] / zig["before_s"])
    assert zig["ratio"] < 0.95  # the fixture's zigzag got faster
    fig = compare.compare_figure(compared)
    (bars,) = fig.data
    assert len(bars.x) == 7
    colors = dict(zip(bars.y, bars.marker.color, strict=True))
    assert colors["U1xR4 zigzag 4K fwd+bwd"] == "#2ca02c"
    assert colors["U4xR1 contiguous 4K fwd+bwd"] == common.MISMATCH_COLOR  # slower
    assert compare.compare_figure(compare_frame(frame, frame.iloc[0:0])) is None


def test_log_ticks_are_labelled_in_full():
    axis = common.log_ticks([0.02, 0.9])
    assert axis["tickvals"] == pytest.approx([0.02, 0.05, 0.1, 0.2, 0.5, 1.0])
    assert axis["ticktext"] == ["0.02", "0.05", "0.1", "0.2", "0.5", "1"]
    bytes_axis = common.log_ticks([1 << 20, 1 << 23], common.format_bytes_short, base2=True)
    assert bytes_axis["ticktext"] == ["1 MiB", "2 MiB", "4 MiB", "8 MiB"]
    assert common.format_seq_len(131072) == "128K" and common.format_seq_len(1000) == "1000"


# ---------------------------------------------------------------------------------- the page


def _without_plotly_bundle(page: str) -> str:
    start = page.index(BUNDLE_OPEN)
    end = page.index("</script>", start)
    return page[:start] + page[end:]


def test_page_is_offline_and_embeds_plotly_once(page: str):
    assert page.count(BUNDLE_OPEN) == 1  # plotly.js, inline, once
    bundle = page[page.index(BUNDLE_OPEN) :]
    assert get_plotlyjs()[:2000] in bundle
    ours = _without_plotly_bundle(page)
    assert "Plotly.newPlot" in ours
    assert not re.search(r"<script[^>]+src\s*=", ours)
    assert not re.search(r"<link\b", ours)
    assert not re.search(r"<(img|iframe|object|embed|video|audio|source)\b", ours)
    assert not re.search(r"https?://", ours)
    assert "@import" not in ours and "@font-face" not in ours and "url(" not in ours
    figures = page.count("class='figure-spec'")
    assert figures == 9
    assert f'data-figures="{figures}"' in page
    assert page.count("class='plot'") == figures


def test_header_counts_and_grouped_reasons(page: str):
    assert "cpbench report: cpu-smoke" in page
    assert "42 ran" in page and "1 failed" in page and "1 skipped" in page
    assert "1 timed out" in page
    assert "ulysses degree 3 must divide heads (8)" in page
    assert "4 x cpu: AMD EPYC 9654 96-Core Processor" in page
    assert "torch 2.13.0+cpu" in page and "python 3.12.3" in page
    assert "2026-11-29 20:00 UTC" in page
    assert "cpu-local: local CPU ranks" in page  # the default profile for CPU records


def test_record_table_lists_everything_with_errors_and_marks_the_mismatch(page: str):
    table = page[page.index("id='record-table'") :]
    table = table[: table.index("</table>")]
    assert table.count("<tr class=") == 45
    assert "st-row-failed" in table and "st-row-skipped" in table and "st-row-timeout" in table
    assert "max abs error 3.1e-02 exceeds the tolerance" in table
    assert table.count("class='bad'") == 1
    assert "data-type='num'" in table  # numeric columns sort as numbers


def test_reasons_are_grouped_by_pattern(records: list[dict]):
    skipped = [
        dict(_strip(records[-2]), id=f"s{u}", error=f"ulysses degree {u} must divide heads (8)")
        for u in (3, 5, 6)
    ]
    summary = summarize(skipped)
    assert summary.reasons["skipped"] == [(3, "ulysses degree 3 must divide heads (8)", 3)]


def test_hostile_strings_are_escaped_everywhere(records: list[dict], tmp_path: Path):
    evil = [copy.deepcopy(_strip(r)) for r in records[:6]]
    for r in evil:
        r["scenario"] = HOSTILE
        r["config"]["layout"] = HOSTILE
        r["environment"] = dict(r["environment"], devices=[HOSTILE], torch=HOSTILE)
    failed = dict(copy.deepcopy(evil[0]), id=HOSTILE, status="failed", error=HOSTILE)
    path = _write(tmp_path / "evil.jsonl", [*evil, failed])
    html_page = _report([path], title=f"title {HOSTILE}").html
    assert HOSTILE not in html_page
    assert "<script>alert" not in html_page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html_page
    # inside the embedded figure JSON the tag is \u003c-escaped (and HTML-escaped for plotly)
    assert "\\u003cscript\\u003e" in html_page or "\\u0026lt;script\\u0026gt;" in html_page
    # the only <script> elements are ours
    assert len(re.findall(r"<script\b", html_page)) == html_page.count("</script>")


def test_script_json_cannot_close_its_element():
    value = {"a": "</script><b>&amp;'", "b": "\u2028"}
    text = environment().from_string("{{ v | tojson }}").render(v=value)
    assert "<" not in text and ">" not in text and "&" not in text and "'" not in text
    assert "\u2028" not in text  # JSON escapes it (a line break inside a <script> element)
    assert json.loads(text) == value


def test_static_files_are_inlined_and_the_service_returns_data(page: str):
    from importlib.resources import files  # noqa: PLC0415

    for name in STATIC_FILES.values():
        text = files("cpbench.render").joinpath("static", name).read_text(encoding="utf-8")
        assert len(text) > 100 and text in page, name
    data = build_report([SWEEP], generated_at=WHEN)
    assert isinstance(data, ReportData) and not hasattr(data, "html")
    assert data.records == 45 and data.profile == "cpu-local"
    assert data.title == "cpbench report: cpu-smoke"
    assert {"predicted_s", "peak_fraction"} <= set(data.frame.columns)
    assert data.summary.statuses == {"ok": 42, "failed": 1, "skipped": 1, "timeout": 1}
    comparison = build_comparison(SWEEP, AFTER, generated_at=WHEN)
    assert isinstance(comparison, ComparisonData)
    assert (comparison.matched, comparison.unmatched) == (7, 38)


def test_missing_phase_and_empty_sections_get_a_note(records: list[dict], tmp_path: Path):
    only = [
        r for r in records if r["config"]["phase"] == "fwd+bwd" and r["config"]["seq_len"] < 4096
    ]
    html_page = _report([_write(tmp_path / "fb.jsonl", only)]).html
    assert "No successful fwd measurement" in html_page
    assert "phase fwd+bwd" in html_page

    failures = [r for r in records if r["status"] != "ok"]
    empty = _report([_write(tmp_path / "bad.jsonl", failures)])
    assert empty.figures == 0
    assert "class='plot'" not in empty.html and "plotly.js v" not in empty.html
    for note in (
        "No successful configuration has a step time",
        "No configuration reports its peak memory",
        "No causal multi-rank configuration has per-rank timings",
        "No successful configuration: nothing to recommend.",
    ):
        assert note in empty.html
    assert 'document.body.dataset.rendered = "0"' in empty.html


def test_recommendation_names_the_fastest_measured_mesh(frame: pd.DataFrame, page: str):
    best = measured_best(frame)
    top = best[(best["phase"] == "fwd+bwd") & (best["L"] == 4096)].iloc[0]
    ok = frame[
        (frame["status"] == "ok") & (frame["phase"] == "fwd+bwd") & (frame["seq_len"] == 4096)
    ]
    fastest = ok.loc[ok["median_s"].idxmin()]
    assert top["best"] == f"{fastest['mesh']} {fastest['layout']}"
    speedup = ok["median_s"].max() / ok["median_s"].min()
    assert top["speedup vs slowest"] == pytest.approx(speedup, rel=1e-3)
    section = page[page.index("id='recommendation'") : page.index("id='records'")]
    assert "Fastest measured configuration per phase and sequence length" in section
    # the recommendation service, calibrated on the results, ranks the measured meshes
    winner = f"{fastest['ulysses']}x{fastest['ring']} {fastest['layout']} is measured fastest"
    assert winner in section
    assert "--context-parallel-size 4" in section and "--cp-comm-type" in section
    assert "set_seq_parallel_pg(" in section and "context_parallel_degree" in section
    assert "Workload: h=8, h_kv=2, d_h=64, B=1, float32, causal, L=4096" in section


def test_recommendation_without_the_service_falls_back_to_the_measurements(
    monkeypatch: pytest.MonkeyPatch, records: list[dict], tmp_path: Path
):
    monkeypatch.setitem(sys.modules, "cpbench.app.recommend", None)  # import fails
    fwd_bwd = [r for r in records if r["config"]["phase"] == "fwd+bwd"]
    page = _report([_write(tmp_path / "fb.jsonl", fwd_bwd)]).html
    section = page[page.index("id='recommendation'") : page.index("id='records'")]
    assert "For the longest measured sequence (L=4096, phase fwd+bwd)" in section
    assert "recommendation service not available" in section


def test_measured_workload(frame: pd.DataFrame):
    workload = measured_workload(frame)
    assert workload == {
        "heads": 8,
        "kv_heads": 2,
        "head_dim": 64,
        "batch": 1,
        "dtype": "float32",
        "causal": True,
        "seq_len": 4096,
        "phase": "fwd+bwd",
        "gpus": 4,
        "gpus_per_node": 4,
        "shapes": 1,
    }
    assert measured_workload(frame[frame["status"] != "ok"]) is None


def test_hardware_profile_choice(records: list[dict]):
    assert default_hardware(records) == "cpu-local"
    gpu = copy.deepcopy(records[:1])
    gpu[0]["config"]["device"] = "cuda"
    gpu[0]["environment"]["devices"] = ["NVIDIA H100 80GB HBM3"] * 8
    assert default_hardware(gpu) == "h100-sxm"
    gpu[0]["environment"]["devices"] = ["Some Future Accelerator"]
    assert default_hardware(gpu) is None


def test_unknown_gpu_gets_the_no_profile_note(records: list[dict], tmp_path: Path):
    recs = [copy.deepcopy(_strip(r)) for r in records[:8]]
    for r in recs:
        r["config"]["device"] = "cuda"
        r["environment"] = dict(r["environment"], devices=["Some Future Accelerator"])
    report = build_report([_write(tmp_path / "gpu.jsonl", recs)])
    html_page = render_report(report).html
    assert report.profile is None
    assert NO_PROFILE_NOTE in html_page
    assert "id='prediction'" in html_page
    assert any(NO_PROFILE_NOTE in n for n in report.notes)


def test_predicted_vs_measured_with_the_default_cpu_profile(page: str):
    assert "Cost model: predicted vs measured step time" in page
    assert "% of hardware peak" in page


def test_comparison_page(tmp_path: Path):
    report = render_comparison(build_comparison(SWEEP, AFTER, generated_at=WHEN))
    assert report.figures == 1
    assert "sweep.jsonl" in report.html and "after.jsonl" in report.html
    assert "7 configuration(s) in both files" in report.html
    table = report.html[report.html.index("id='compare'") :]
    table = table[: table.index("</table>")]
    assert table.count("<tr class=") == 45
    assert "class='good'" in table and "class='bad'" in table


# ------------------------------------------------------------------------------ the command


def test_cli_writes_the_report(records: list[dict], tmp_path: Path):
    small = _write(tmp_path / "small.jsonl", [r for r in records if r["config"]["seq_len"] == 1024])
    out = tmp_path / "sub" / "r.html"
    result = runner.invoke(app, ["report", str(small), "-o", str(out), "--title", "T", "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer == {
        "output": str(out),
        "records": 15,
        "figures": 9,
        "profile": "cpu-local",
        "notes": [],
        "warnings": [],
    }
    assert out.read_text().count("<h1>T</h1>") == 1


def test_cli_compare_and_its_argument_check(tmp_path: Path):
    out = tmp_path / "c.html"
    result = runner.invoke(app, ["report", str(SWEEP), str(AFTER), "--compare", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote" in result.stdout and out.exists()
    result = runner.invoke(app, ["report", str(SWEEP), "--compare", "-o", str(out)])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "cpbench: error: --compare needs exactly two results files (BEFORE AFTER), got 1"
    ]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing.jsonl", "missing.jsonl does not exist"),
        (lambda d: _text(d / "e.jsonl", "\n\n"), "no results records to report"),
        (lambda d: _text(d / "m.jsonl", '{"id": 1}\n{bad\n{"id": 2}\n'), "m.jsonl:2: malformed"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path: Path, make, message: str):
    path = make(tmp_path)
    result = runner.invoke(app, ["report", str(path), "-o", str(tmp_path / "x.html")])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("cpbench: error:")


def test_cli_unknown_hardware_is_an_error(tmp_path: Path):
    result = runner.invoke(
        app, ["report", str(SWEEP), "--hardware", "nope", "-o", str(tmp_path / "x.html")]
    )
    assert result.exit_code == 2
    assert "hardware 'nope' is neither a built-in profile" in result.stderr


def test_cli_warns_about_a_torn_last_line(tmp_path: Path):
    path = tmp_path / "torn.jsonl"
    path.write_text("\n".join(SWEEP.read_text().splitlines()[:2]) + '\n{"id": "half')
    result = runner.invoke(app, ["report", str(path), "-o", str(tmp_path / "x.html")])
    assert result.exit_code == 0, result.output
    assert "cpbench: warning:" in result.stderr and "torn last line" in result.stderr


def _text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_write_report_refuses_a_directory(tmp_path: Path):
    with pytest.raises(CpbenchError, match="is a directory"):
        write_report("<html></html>", tmp_path)
    assert write_report("<p>x</p>", tmp_path / "a" / "b.html").read_text() == "<p>x</p>"


def test_odd_values_in_valid_json_do_not_crash_the_report(tmp_path: Path) -> None:
    """Hand-edited or foreign files: a null config, non-integral sizes and a string where a bool
    belongs still give a page (the odd values become missing), exit 0. (An impossible value of
    the right type, seq_len 10**30 or a step of 0 s, is refused: test_hostile_input.py.)"""
    ok = [r for r in read_records(FIXTURES / "sweep.jsonl") if r["status"] == "ok"]
    no_config, weird = (copy.deepcopy(r) for r in ok[:2])
    no_config["config"] = None
    weird["config"].update(ulysses=2.5, causal="false")
    path = tmp_path / "odd.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (no_config, weird, *ok[3:6])))
    frame = records_frame(read_records(path))
    assert frame["ulysses"].isna().sum() >= 2 and frame["causal"].isna().sum() >= 2
    out = tmp_path / "odd.html"
    result = CliRunner().invoke(app, ["report", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.stat().st_size > 100_000


def test_a_model_adds_the_whole_model_plan_section(tmp_path: Path) -> None:
    """`report --model` puts `cpbench plan`'s answer on the page: the feasible plans with their
    step time and attention share, and the rejected ones with the component that overflows."""
    from typer.testing import CliRunner  # noqa: PLC0415

    from cpbench.cli.main import app  # noqa: PLC0415

    out = tmp_path / "r.html"
    result = CliRunner().invoke(
        app,
        ["report", str(FIXTURES / "sweep.jsonl"), "--model", "llama3-8b", "--seq-len", "262144",
         "--gpus", "16", "--gpus-per-node", "8", "-o", str(out)],
    )
    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert "Whole-model plan" in html and "plan-table" in html and "plan-rejected-table" in html
    assert "activations" in html  # a rejection names its overflowing component
    bad = CliRunner().invoke(app, ["report", str(FIXTURES / "sweep.jsonl"), "--seq-len", "4096",
                                   "-o", str(out)])
    assert bad.exit_code == 2 and "--model" in bad.output


HIDDEN = "\u202eevil\u2066\x1b[31m"
"""Right-to-left override, an isolate and a terminal escape: they reorder or hide text."""


def test_hidden_characters_in_records_are_shown_visibly(records: list[dict], tmp_path: Path):
    sneaky = [copy.deepcopy(_strip(r)) for r in records[:6]]
    for r in sneaky:
        r["scenario"] = HIDDEN
        r["config"]["layout"] = HIDDEN
    failed = dict(copy.deepcopy(sneaky[0]), id=HIDDEN, status="failed", error=HIDDEN)
    html_page = _report([_write(tmp_path / "sneaky.jsonl", [*sneaky, failed])]).html
    for char in "\u202e\u2066\x1b":
        assert char not in html_page, hex(ord(char))
    assert "\\u202eevil\\u2066\\u001b[31m" in html_page  # as text, in a table
    # and in the figures' JSON, where plotly would decode an escaped character back
    assert "\\\\u202eevil" in html_page
