"""Every results table reads whole at 80 columns (a terminal, or a pipe, where rich assumes 80):
no line wider than the console, no ellipsis, every key value present whole; at 200 columns the
whole table with all its columns."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from rich.cells import cell_len
from rich.console import Console, RenderableType
from typer.testing import CliRunner

from cpbench.app.formulas import formulas_report
from cpbench.app.formulas_schema import FormulasReport
from cpbench.app.recommend import (
    Recommendation,
    RecommendRequest,
    recommend_mesh,
    recommendation_report,
)
from cpbench.app.verify import VerifyRow
from cpbench.config.problem import CpProblem
from cpbench.render.formulas import render_formulas
from cpbench.render.recommend.calibration import render_calibration, render_validation
from cpbench.render.recommend.explanation import group_digits
from cpbench.render.recommend.frameworks import caveat_text, closest_label, is_alternative
from cpbench.render.recommend.screen import render_recommendation
from cpbench.render.tables import FitTable, results_table, verify_tables
from cpbench.results.schema import ResultRecord
from cpbench.results.store import read_records, read_results
from tests.synthetic import synthetic_probe_result

FIXTURE = Path(__file__).parent / "fixtures" / "sweep.jsonl"
BORDERS = re.compile(r"[\s│┃┆|]+")


def render(renderables: Sequence[RenderableType], width: int) -> str:
    console = Console(width=width, file=io.StringIO(), color_system=None, force_terminal=False)
    for renderable in renderables:
        console.print(renderable)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


def assert_readable(text: str, width: int) -> None:
    widest = max(cell_len(line) for line in text.splitlines())
    assert widest <= width, f"a line of {widest} characters at width {width}"
    assert "…" not in text


def words(text: str) -> set[str]:
    """The words of the rendered text, box characters removed."""
    return set(BORDERS.split(text))


def assert_words_whole(value: str, text: str) -> None:
    """Every word of `value` appears whole (cells wrap only between words; a label may end
    with the `:` that introduces its setting)."""
    seen = words(text)
    seen |= {w.removesuffix(":") for w in seen}
    missing = {w for w in value.split() if w not in seen}
    assert not missing, f"cut or missing words of {value!r}: {sorted(missing)}"


def a_line_with(text: str, *cells: str) -> bool:
    return any(all(c in line for c in cells) for line in text.splitlines())


# ------------------------------------------------------------------------ sweep / run


@pytest.fixture(scope="module")
def records() -> list[ResultRecord]:
    return read_results(FIXTURE)


SWEEP_COLUMNS = ("L", "h/kv", "UxR", "layout", "phase", "step", "TFLOP/s", "bytes/rank",
                 "overlap", "peak mem", "max err", "status")


@pytest.mark.torch_free
@pytest.mark.parametrize("width", [80, 60])
def test_results_table_narrow(records: list[ResultRecord], width: int) -> None:
    text = render([results_table(records)], width)
    assert_readable(text, width)
    ok = [r for r in records if r.status == "ok"]
    assert len(ok) >= 40
    for number, r in enumerate(records, 1):
        if r.status != "ok":
            continue
        c, t = r.config, r.timing
        assert c is not None and t is not None
        step = f"{t.median * 1e3:.1f} ms"
        # A narrow table splits into parts; the row number ties a row's parts together.
        row = f"│ {number:>2} │"
        assert a_line_with(text, row, f"{c.ulysses}x{c.ring}", c.layout, c.phase), r
        assert a_line_with(text, row, step), r
    for r in records:
        if r.status != "ok":
            assert_words_whole(str(r.error), text)
    for col in SWEEP_COLUMNS:
        assert_words_whole(col, text)


@pytest.mark.torch_free
def test_results_table_wide_keeps_every_column(records: list[ResultRecord]) -> None:
    text = render([results_table(records)], 200)
    assert_readable(text, 200)
    header = next(line for line in text.splitlines() if "bytes/rank" in line)
    for col in SWEEP_COLUMNS:
        assert col in header
    assert "(1/2)" not in text  # one table, not parts


@pytest.mark.torch_free
def test_an_ok_record_without_its_timing_is_refused_by_name(records: list[ResultRecord]) -> None:
    """The table reads typed records: an ok one that lacks a section it shows is an error that
    names the record (not a KeyError, not a silent dash)."""
    ok = next(r for r in records if r.status == "ok")
    broken = ok.model_copy(update={"timing": None})
    with pytest.raises(ValueError, match=f"ok record {re.escape(ok.id)} has no timing"):
        results_table([broken])


# ------------------------------------------------------------------------ verify


def _case(scheme: str, u: int, r: int, layout: str, causal: bool, kv: int, **extra: Any) -> dict:
    label = f"{scheme} U{u}xR{r} {layout} h8/kv{kv}"
    case = {"label": label, "scheme": scheme, "ulysses": u, "ring": r, "layout": layout,
            "causal": causal, "heads": 8, "kv_heads": kv, "passed": True, "tolerance": 2.5e-4,
            "errors": {"out": 4e-7, "dq": 7e-7, "dk": 1.2e-6, "dv": 2.3e-6}}
    case.update(extra)
    return case


VERIFY = [
    _case("ring", 1, 4, "contiguous", True, 8),
    _case("usp", 2, 2, "zigzag", False, 1),
    _case("ulysses", 4, 1, "striped", True, 2, known_issues=["flash-attn issue #123"]),
    _case("usp", 2, 2, "striped", True, 4, passed=False,
          error="RuntimeError: max abs error 3.1e-02 exceeds the tolerance 2e-04"),
    {**_case("ring", 1, 4, "zigzag", True, 8, passed=None), "errors": {},
     "skipped": "the library has no zigzag ring; needs a contiguous layout"},
]
"""Verify records as the case runners produce them."""
VERIFY_ROWS = [VerifyRow.from_record(case) for case in VERIFY]


@pytest.mark.torch_free
@pytest.mark.parametrize("width", [80, 60])
def test_verify_tables_narrow(width: int) -> None:
    text = render(verify_tables(VERIFY_ROWS, 4, "cpu", "cpbench"), width)
    assert_readable(text, width)
    for case in VERIFY:
        mask = "causal" if case["causal"] else "full"
        mesh = f"{case['ulysses']}x{case['ring']}"
        # 80 columns: parts that repeat the case on each line; 60: one block per case
        if width == 80:
            assert a_line_with(text, case["scheme"], mesh, case["layout"], mask)
        assert {case["scheme"], mesh, case["layout"], mask} <= words(text)
    for name in ("4e-07", "7e-07", "1e-06", "2e-06"):
        assert name in words(text)
    assert_words_whole(VERIFY[3]["error"], text)
    assert_words_whole(VERIFY[4]["skipped"], text)
    assert "4/5 cases passed" in text or "3/4 cases passed" in text


@pytest.mark.torch_free
def test_verify_tables_wide_keeps_every_column() -> None:
    text = render(verify_tables(VERIFY_ROWS, 4, "cpu", "cpbench"), 200)
    header = next(line for line in text.splitlines() if "scheme" in line)
    for col in ("scheme", "UxR", "layout", "mask", "h/kv", "rep", "out", "dq", "dk", "dv"):
        assert re.search(rf"\b{re.escape(col)}\b", header), col
    assert "(1/2)" not in text


# ------------------------------------------------------------------------ recommend


@pytest.fixture(scope="module", params=[{"gpus": 16, "tp": 2}, {"gpus": 64}])
def rec(request: pytest.FixtureRequest) -> Recommendation:
    return recommend_mesh(RecommendRequest(heads=32, kv_heads=8, **request.param))


@pytest.mark.torch_free
@pytest.mark.parametrize("width", [80, 60])
@pytest.mark.parametrize("explain", [False, True])
def test_recommendation_narrow(rec: Recommendation, width: int, explain: bool) -> None:
    text = render(render_recommendation(rec, explain), width)
    report = recommendation_report(rec)
    assert_readable(text, width)
    winner = report["winner"]
    assert a_line_with(text, f"{winner['ulysses']} x {winner['ring']}", winner["layout"])
    for c in report["candidates"]:
        layout = c["layout"] if c["layout_matters"] else "any"
        assert a_line_with(text, f"{c['ulysses']} x {c['ring']}", layout, f"{c['time_s'] * 1e3:.2f}")
        assert a_line_with(text, f"{c['ulysses']} x {c['ring']}", f"{c['max_seq_len']:,}")
    for f in rec.frameworks:
        if explain or not is_alternative(f):  # the all-gather alternative: --explain only
            if f.settings != "-":  # no setting: the label says `none` and why
                assert_words_whole(f.settings, text)
            assert_words_whole(closest_label(f), text)
        if explain:  # each caveat in its row, or once under the table when rows share it
            said = {w.rstrip(";.") for w in words(text)}
            for c in f.caveats:
                assert set(caveat_text(c).split()) <= said | words(text), caveat_text(c)
    for r in rec.rejected:
        assert_words_whole(group_digits(r.rule), text)
    # a flag never parts from its value (whatever value the winner's Megatron setting has)
    megatron = next(f.settings for f in rec.frameworks if f.framework == "Megatron-LM")
    comm_type = megatron.split("--cp-comm-type ", 1)[1].split()[0]
    assert a_line_with(text, f"--cp-comm-type {comm_type}")


@pytest.mark.torch_free
def test_recommendation_wide_keeps_every_column(rec: Recommendation) -> None:
    text = render(render_recommendation(rec, explain=True), 200)
    header = next(line for line in text.splitlines() if "U x R" in line and "source" in line)
    for col in ("#", "U x R", "layout", "KV rep", "time ms", "compute", "imbalance",
                "exposed comm", "intra GB", "inter GB", "mem GiB", "max L", "source"):
        assert col in header
    assert a_line_with(text, "framework", "settings", "note")


# ------------------------------------------------------------------------ formulas


@pytest.fixture(scope="module")
def formulas() -> FormulasReport:
    return formulas_report(CpProblem(seq_len=262144, heads=32, kv_heads=8, head_dim=128, ulysses=4, ring=2, layout="zigzag"))


@pytest.mark.torch_free
@pytest.mark.parametrize("width", [80, 60])
def test_formulas_narrow(formulas: FormulasReport, width: int) -> None:
    text = render(render_formulas(formulas), width)
    assert_readable(text, width)
    for phase, volume in formulas.communication.by_pass().items():
        for stage in volume.stages:
            for c in stage.collectives:
                assert_words_whole(c.formula, text)
                assert_words_whole(c.substituted, text)
                assert a_line_with(text, phase, c.name, c.kind)
    for item in formulas.memory.items:
        assert a_line_with(text, item.name)
    assert "[1, 32768, 32, 128]" in text  # a shape stays on one line


@pytest.mark.torch_free
def test_formulas_wide_is_whole_tables(formulas: FormulasReport) -> None:
    text = render(render_formulas(formulas), 240)
    assert "(1/" not in text
    assert a_line_with(text, "phase", "collective", "calls", "formula (elements sent)",
                       "substituted", "elements", "bytes")


# ------------------------------------------------------------------------ calibrate / validate


@pytest.mark.torch_free
@pytest.mark.parametrize("width", [80, 60])
def test_calibration_and_validation_narrow(width: int) -> None:
    from cpbench.app.calibrate import calibrate_results, validate_results  # noqa: PLC0415

    calibration = calibrate_results([str(FIXTURE)], None, None, None)
    text = render([render_calibration(calibration)], width)
    assert_readable(text, width)
    for fit in calibration.fits:
        for param in fit.parameters:
            assert_words_whole(param.name, text)
            assert f"{param.fitted:.4g}" in words(text)
    validation = validate_results([str(FIXTURE)], None, True, 0.5, 0, "stratified", True)
    text = render(render_validation(validation), width)
    assert_readable(text, width)
    for row in validation.rows:
        assert_words_whole(row.config, text)
        assert a_line_with(text, f"{row.measured_s * 1e3:.2f}", f"{row.error:+.1%}")


# ------------------------------------------------------------------------ FitTable itself


def _table(narrow: Any = "split") -> FitTable:
    table = FitTable(title="t", narrow=narrow, index=True)
    table.add_column("name", key=True)
    for col in ("alpha ms", "beta GiB", "gamma", "delta"):
        table.add_column(col, justify="right")
    table.add_column("note", wrap=True)
    for i in range(3):
        table.add_row(f"row{i}", "12.34", "0.75", "1000000", "x2",
                      "a rather long note that has to wrap between its words somewhere")
    return table


@pytest.mark.torch_free
@pytest.mark.parametrize("width", [100, 60, 40, 30])
@pytest.mark.parametrize("narrow", ["split", "stack"])
def test_fit_table_any_width(width: int, narrow: str) -> None:
    text = render([_table(narrow)], width)
    assert_readable(text, width)
    for value in ("row2", "12.34", "0.75", "1000000", "x2", "alpha", "beta", "GiB"):
        assert value in words(text)
    assert_words_whole("a rather long note that has to wrap between its words somewhere", text)


@pytest.mark.torch_free
def test_fit_table_wide_is_one_table() -> None:
    text = render([_table()], 150)
    assert "(1/" not in text and "#" not in text
    assert a_line_with(text, "row0", "12.34", "0.75", "1000000", "x2", "a rather long note")


# ------------------------------------------------------------------ one screen, --help


@pytest.fixture(scope="module")
def default_rec() -> Recommendation:
    return recommend_mesh(RecommendRequest(heads=32, kv_heads=8))


@pytest.mark.torch_free
def test_recommend_fits_one_screen_verdict_first(default_rec: Recommendation) -> None:
    text = render(render_recommendation(default_rec), 100)
    assert_readable(text, 100)
    lines = text.splitlines()
    assert len(lines) <= 45
    # the verdict first: the pick, its predicted time, how sure (a tie of 19, in one clause)
    assert lines[0].startswith("Pick: 8x1 any, predicted 190.43 ms ±35% (fwd+bwd): 8x1 any is faster")
    assert "--write-scenario PATH writes the tie" in " ".join(text.split())
    assert "Tie: " not in text and "4x2 zigzag all-gather hs1" not in text  # the list: --explain
    start = next(i for i, line in enumerate(lines) if line.startswith("Why: "))
    end = next(i for i, line in enumerate(lines) if "Settings for the winner" in line)
    assert 1 < end - start <= 4, lines[start:end]
    assert a_line_with(text, "--cp-comm-type a2a") and "All-gather: its best" not in text


@pytest.mark.torch_free
def test_explain_keeps_the_full_explanation(default_rec: Recommendation) -> None:
    text = render(render_recommendation(default_rec, explain=True), 100)
    flat = " ".join(text.split())
    for sentence in ("ahead of the next mesh", "Placement: each Ulysses group",
                     "All-gather: its best candidate", "Against the ring on the same mesh",
                     "The kernel works on L/R", "attention layer lower bound", "Conventions:",
                     "1x8 striped all-gather hs1; to separate them", "Settings of an alternative"):
        assert sentence in flat
    assert len(text.splitlines()) > 60


def test_recommend_command_fits_45_lines_at_100_columns() -> None:
    env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": str(Path(__file__).parents[1])}
    args = [sys.executable, "-m", "cpbench", "recommend", "--heads", "32", "--kv-heads", "8"]
    default = subprocess.run(args, env=env, capture_output=True, text=True, check=True).stdout
    assert len(default.splitlines()) <= 45
    assert max(cell_len(line) for line in default.splitlines()) <= 100
    full = subprocess.run([*args, "--explain"], env=env, capture_output=True, text=True, check=True)
    assert "Against the ring on the same mesh" in " ".join(full.stdout.split())


@pytest.mark.torch_free
def test_piped_at_80_columns_the_candidates_are_one_table(default_rec: Recommendation) -> None:
    text = render(render_recommendation(default_rec), 80)
    assert_readable(text, 80)
    assert "(1/2)" not in text
    header = next(line for line in text.splitlines() if "mesh" in line)
    assert "#" in header and "max L" in " ".join(text.split())
    assert a_line_with(text, "4 x 2 striped ag/hs1", "192.20", "6,412,800")


@pytest.mark.torch_free
def test_each_caveat_once(default_rec: Recommendation) -> None:
    assert default_rec.uncertainty
    source = default_rec.uncertainty.source
    for explain in (False, True):
        flat = " ".join(render(render_recommendation(default_rec, explain), 100).split())
        assert flat.count(source) == 1, explain
    # every framework caveat once, however many settings carry it (wide: no cell wraps)
    masked = recommend_mesh(RecommendRequest(
        heads=32, kv_heads=8, seq_len=65536, documents="4096,8192,16384,36864", window=8192))
    text = render(render_recommendation(masked, explain=True), 2000)
    texts = {caveat_text(c) for f in masked.frameworks for c in f.caveats}
    assert a_line_with(text, "Megatron-LM, DeepSpeed, yunchang, torchtitan", "sliding window: ")
    for t in texts:  # (once, and once more inside each longer caveat that quotes it)
        assert text.count(t) == 1 + sum(t in o for o in texts - {t}), t


@pytest.mark.torch_free
def test_the_winners_settings_only(default_rec: Recommendation) -> None:
    assert default_rec.winner and not default_rec.winner.prediction.candidate.all_gather
    assert any(is_alternative(f) for f in default_rec.frameworks)  # in --json
    brief = render(render_recommendation(default_rec), 100)
    assert "all-gather CP" not in brief
    full = render(render_recommendation(default_rec, explain=True), 100)
    settings = full[full.index("Settings for the winner"):full.index("Settings of an alternative")]
    assert "all-gather CP" not in settings and "Megatron-LM" in settings


@pytest.mark.torch_free
def test_counts_have_thousands_separators(default_rec: Recommendation) -> None:
    for explain in (False, True):
        text = render(render_recommendation(default_rec, explain), 100)
        assert "9,801,584" in text and "L=131,072" in text
        bare = re.findall(r"(?<![\w.,])\d{4,}(?![\w.]|,\d)", text)
        assert not bare, bare
    assert group_digits("fits 9801584 tokens, x1.18, 0.12345 ms, hs1, --top 10000.") == (
        "fits 9,801,584 tokens, x1.18, 0.12345 ms, hs1, --top 10,000."
    )


@pytest.mark.torch_free
def test_a_framework_that_cannot_express_the_pick_is_labelled(
    default_rec: Recommendation,
) -> None:
    titan = next(f for f in default_rec.frameworks if f.framework == "torchtitan")
    assert not titan.expressible  # ring-only; the pick is Ulysses 8x1
    text = render(render_recommendation(default_rec), 100)
    line = next(x for x in text.splitlines() if "torchtitan" in x)
    assert "closest: 1x8 zigzag (#" in line and "no Ulysses, U = 8" in line
    assert "(cannot express it)" not in text
    for f in default_rec.frameworks:
        if f.expressible:
            assert closest_label(f) == ""


def early_breaks(text: str) -> list[str]:
    """Line breaks that leave a line short of a word the next line starts with (a hard break
    kept from a docstring, and the orphan words it leaves): a panel's lines are measured
    against its widest line, where only the lines that start at its last column (the help
    text's continuation lines) count; the rest
    against the widest line outside panels. typer's `[required]` / `[default: ...]` go on
    their own line."""
    blocks: list[list[str]] = [[]]
    outside: list[str] = []
    for line in text.splitlines():
        if line.startswith("╭"):
            blocks.append([])
        elif line.startswith("╰"):
            blocks.append(outside)
        else:
            (blocks[-1] if "│" in line else outside).append(line.replace("│", " ").rstrip())
    found = []
    for block in [*blocks, outside]:
        lines = [line for line in block if line.strip()]
        limit = max((len(line) for line in lines), default=0)
        indent = max((len(line) - len(line.lstrip()) for line in lines), default=0)
        for before, line in zip(block, block[1:], strict=False):
            word = line.split()[0] if line.strip() else ""
            if not word or not before.strip() or word.startswith("["):
                continue
            continued = block is outside or len(line) - len(line.lstrip()) == indent
            if continued and len(before) + 1 + len(word) <= limit:
                found.append(f"{before.strip()!r} / {line.strip()!r}")
    return found


@pytest.mark.torch_free
def test_every_help_wraps_to_the_terminal() -> None:
    from typer.main import get_command  # noqa: PLC0415

    from cpbench.cli.main import app  # noqa: PLC0415

    runner = CliRunner()
    group = get_command(app)
    commands = [[]] + [[name] for name in group.commands]  # type: ignore[attr-defined]
    assert len(commands) > 10
    for command in commands:
        result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "80"})
        assert result.exit_code == 0, result.output
        assert max(cell_len(line) for line in result.output.splitlines()) <= 80
        assert not early_breaks(result.output), (command, early_breaks(result.output))


# ------------------------------------------------------------------ plan / probe / compare


@pytest.mark.torch_free
def test_plan_tables_narrow() -> None:
    """`cpbench plan` (Llama-3-8B at 128k on 16 GPUs): every table reads whole at 80 and 60
    columns, and each listed plan's TP x CP x PP x DP appears whole."""
    from cpbench.app import plan as service  # noqa: PLC0415
    from cpbench.render.plan import layout, render_plan  # noqa: PLC0415

    result = service.plan_training(
        service.PlanRequest(model="Llama-3-8B", seq_len=131072, gpus=16)
    )
    assert result.feasible, result.rejected
    for width in (80, 60):
        text = render(render_plan(result, 10), width)
        assert_readable(text, width)
        for col in ("TP", "CP", "PP", "DP"):
            assert_words_whole(col, text)
        for p in result.feasible[:10]:
            assert a_line_with(text, str(p.par.tp), layout(p)), p


@pytest.mark.torch_free
def test_probe_tables_narrow() -> None:
    """`cpbench probe`: the collectives, links and kernel tables at 80 and 60 columns, no
    line wider, nothing cut, every collective's mesh and size in a row with its kind."""
    from cpbench.app.probe.run import probe_report  # noqa: PLC0415
    from cpbench.render.probe import render_probe  # noqa: PLC0415
    from cpbench.units import format_bytes  # noqa: PLC0415

    report = probe_report(synthetic_probe_result())
    assert len(report.comm) > 10
    for width in (80, 60):
        text = render(render_probe(report), width)
        assert_readable(text, width)
        for row in report.comm:
            kind = "all-to-all" if row.kind == "all_to_all" else "send/recv"
            assert a_line_with(text, kind, row.mesh, format_bytes(row.size_bytes, ".3g"))
        for col in ("algbw (GB/s)", "busbw (GB/s)", "time (ms)"):
            assert_words_whole(col, text)


@pytest.mark.torch_free
def test_compare_table_narrow(tmp_path: Path) -> None:
    """`cpbench compare` of the fixture sweep with itself made 30% slower on every other
    record: at 80 and 60 columns nothing is cut and every verdict and mesh is whole."""
    import json  # noqa: PLC0415

    from cpbench.app.compare import compare_results  # noqa: PLC0415
    from cpbench.render.tables import compare_table  # noqa: PLC0415

    after = tmp_path / "after.jsonl"
    lines = []
    for i, r in enumerate(read_records(FIXTURE)):
        r = json.loads(json.dumps({k: v for k, v in r.items() if k != "_source"}))
        if i % 2 and r.get("timing"):
            t = r["timing"]
            for key in ("median", "ci_low", "ci_high", "p10", "p90"):
                if isinstance(t.get(key), float):
                    t[key] *= 1.3
            t["samples"] = [s * 1.3 for s in t.get("samples") or []]
        lines.append(json.dumps(r))
    after.write_text("\n".join(lines) + "\n")
    result = compare_results(FIXTURE, after, 0.05)
    assert result.matched >= 40
    verdicts = {r.verdict for r in result.rows}
    assert "slower" in verdicts
    for width in (80, 60):
        text = render([compare_table(result)], width)
        assert_readable(text, width)
        for number, r in enumerate(result.rows, 1):
            if r.verdict is not None:
                assert a_line_with(text, f"│ {number:>2} │", r.verdict), r
        for col in ("after/before", "verdict"):
            assert_words_whole(col, text)
