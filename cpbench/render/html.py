"""The HTML report page, drawn from the data of `cpbench.app.report`: one self-contained file
that needs no network access at all.

The page is a jinja2 template (`templates/page.html`, autoescaped: every string taken from a
results file is HTML-escaped on the way in); its CSS and scripts are the files of `static/`,
inlined. plotly.js is embedded once (inline `<script>`), every figure's JSON sits in a
`<script type="application/json">` block written by jinja2's `tojson` (`<`, `>`, `&` and `'`
escaped as `\\u003c` etc.). `static/render.js` draws the figures and then sets
`document.body.dataset.rendered` to their number; errors caught by `window.onerror` (and
rejected promises, `static/errors.js`) are collected in `document.body.dataset.errors`. The
record table sorts on a click on a column header (`static/sort.js`, no library).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from functools import cache
from importlib.resources import files
from typing import Any

import pandas as pd
import plotly
import plotly.graph_objects as go
import plotly.io as pio
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup
from plotly.offline import get_plotlyjs

from cpbench import __version__, units
from cpbench.app.report.data import (
    NO_PROFILE_NOTE,
    ComparisonData,
    Recommendation,
    ReportData,
    Summary,
)
from cpbench.render.figures import balance, communication, compare, memory, prediction, timing
from cpbench.render.recommend import explanation_text, setting_note
from cpbench.results.frame import PHASE_ORDER, ok_rows, phases_of

PLOTLY_CONFIG = {"displaylogo": False, "responsive": True, "showLink": False}
STATIC_FILES = {
    "css": "report.css",
    "errors_js": "errors.js",
    "render_js": "render.js",
    "sort_js": "sort.js",
}
"""Template name -> file of `cpbench/render/static/` inlined into the page."""


@cache
def environment() -> Environment:
    """The jinja2 environment of the report templates (autoescaped HTML, `tojson` keeps the
    key order of the figures)."""
    env = Environment(
        loader=PackageLoader("cpbench.render", "templates"),
        autoescape=select_autoescape(("html",), default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.policies["json.dumps_kwargs"] = {"sort_keys": False, "separators": (",", ":")}
    return env


@cache
def static_files() -> dict[str, Markup]:
    """The CSS and scripts inlined into the page (our own files: not escaped)."""
    folder = files("cpbench.render").joinpath("static")
    return {
        key: Markup(folder.joinpath(name).read_text(encoding="utf-8"))
        for key, name in STATIC_FILES.items()
    }


# ------------------------------------------------------------------------------ page content


@dataclass(frozen=True)
class Page:
    """A rendered page."""

    html: str
    figures: int
    """Number of figures on the page."""


@dataclass(frozen=True)
class Column:
    """A table column: title, frame column, how to show its values, CSS class of its cells."""

    title: str
    key: str
    kind: str = "text"  # text | num | bytes | ms | pct
    cls: str = ""


@dataclass(frozen=True)
class Head:
    title: str
    kind: str
    """'text' or 'num': how the column sorts."""


@dataclass(frozen=True)
class Cell:
    sort: str
    """The value the table sorts on."""
    text: str
    cls: str = ""


@dataclass(frozen=True)
class Row:
    cls: str
    cells: list[Cell]


@dataclass(frozen=True)
class Table:
    """A sortable table as the template draws it (plain text; escaped when rendered)."""

    table_id: str
    head: list[Head]
    rows: list[Row]


@dataclass(frozen=True)
class RecommendationView:
    """The recommendation section: the service's recommendation with its tables laid out."""

    recommendation: Recommendation | None
    note: str | None
    tables: list[tuple[str, Table]] = field(default_factory=list)


@dataclass
class Section:
    """One section of the page: a heading, a line on how to read it, a figure (or a note
    saying why there is none), and a table or the recommendation."""

    key: str
    title: str
    explain: str = ""
    figure: go.Figure | None = None
    note: str | None = None
    table: Table | None = None
    recommendation: RecommendationView | None = None
    plot_id: str | None = None
    """Id of the figure's element, set when the page is drawn."""


def _fmt_num(value: Any, digits: int = 4) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, (int,)) and not isinstance(value, bool):
        return str(value)
    return f"{float(value):.{digits}g}"


def format_bytes(value: Any) -> str:
    """1536 -> '1.5 KiB' (binary units), '' for missing."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return ""
    return units.format_bytes(float(value), ".3g")


# ------------------------------------------------------------------------------------ tables


RECORD_COLUMNS = (
    Column("status", "status"),
    Column("impl", "impl"),
    Column("mesh", "mesh"),
    Column("layout", "layout"),
    Column("mask", "mask"),
    Column("L", "seq_len", "num"),
    Column("padding", "padding", "num"),
    Column("phase", "phase"),
    Column("scheme", "scheme"),
    Column("kernel", "kernel"),
    Column("dtype", "dtype"),
    Column("median ms", "median_s", "ms"),
    Column("p10 ms", "p10_s", "ms"),
    Column("p90 ms", "p90_s", "ms"),
    Column("TFLOP/s", "achieved_tflops", "num"),
    Column("% peak", "peak_fraction", "pct"),
    Column("overlap", "overlap", "pct"),
    Column("fwd bytes analytic", "analytic_fwd_bytes", "bytes"),
    Column("fwd bytes measured", "measured_fwd_bytes", "bytes"),
    Column("bwd bytes analytic", "analytic_bwd_bytes", "bytes"),
    Column("bwd bytes measured", "measured_bwd_bytes", "bytes"),
    Column("GB/s", "busbw_GBps", "num"),
    Column("peak mem", "peak_bytes", "bytes"),
    Column("analytic mem", "analytic_peak_bytes", "bytes"),
    Column("max abs err", "max_abs_error", "num"),
    Column("predicted ms", "predicted_s", "ms"),
    Column("scenario", "scenario"),
    Column("source", "source"),
    Column("error", "error", cls="err"),
    Column("id", "id", cls="id"),
)


def _cell(value: Any, kind: str) -> tuple[str, str]:
    """(data-sort value, display text), both unescaped."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return "", ""
    if kind == "bytes":
        return repr(float(value)), format_bytes(value)
    if kind == "ms":
        return repr(float(value)), f"{float(value) * 1e3:.4g}"
    if kind == "pct":
        return repr(float(value)), f"{float(value) * 100:.1f}%"
    if kind == "num":
        return repr(float(value)), _fmt_num(value.item() if hasattr(value, "item") else value)
    if isinstance(value, bool):
        return str(value), str(value)
    return str(value), str(value)


def table(
    frame: pd.DataFrame,
    columns: Sequence[Column],
    *,
    table_id: str,
    row_class: Callable[[pd.Series], str] | None = None,
    cell_class: Callable[[pd.Series, Column], str] | None = None,
) -> Table:
    """A sortable table of `frame` (columns missing or all empty are left out).
    `row_class(row) -> str` and `cell_class(row, column) -> str` add CSS classes."""
    cols = [c for c in columns if c.key in frame and frame[c.key].notna().any()]
    rows = []
    for _, row in frame.iterrows():
        cells = []
        for c in cols:
            sort, text = _cell(row[c.key], c.kind)
            classes = " ".join(x for x in (c.cls, cell_class(row, c) if cell_class else "") if x)
            cells.append(Cell(sort, text, classes))
        rows.append(Row(row_class(row) if row_class else "", cells))
    head = [Head(c.title, "text" if c.kind == "text" else "num") for c in cols]
    return Table(table_id, head, rows)


def _record_row_class(row: pd.Series) -> str:
    return f"st-row-{row.get('status')}"


def _record_cell_class(row: pd.Series, column: Column) -> str:
    if column.key == "status":
        return f"st-{row.get('status')}"
    for direction in ("fwd", "bwd"):
        if column.key == f"measured_{direction}_bytes":
            flag = row.get(f"comm_{direction}_mismatch")
            if flag is not None and not pd.isna(flag) and bool(flag):
                return "bad"
    return ""


def records_table(frame: pd.DataFrame) -> Table:
    """Every record (failures included, with their errors), sortable by any column."""
    impls = set(frame["impl"].dropna()) if "impl" in frame else set()
    hide = {"source"} if frame["source"].nunique() < 2 else set()
    if impls <= {"cpbench"}:
        hide.add("impl")  # shown when an external implementation is in the results
    masks = set(frame["mask"].dropna()) if "mask" in frame else set()
    if masks <= {"causal"}:
        hide.add("mask")  # shown when a record has another mask
    if "padding" in frame and not frame["padding"].fillna(0).astype(bool).any():
        hide.add("padding")  # shown when a layout padded
    columns = [c for c in RECORD_COLUMNS if c.key not in hide]
    return table(
        frame,
        columns,
        table_id="record-table",
        row_class=_record_row_class,
        cell_class=_record_cell_class,
    )


COMPARE_COLUMNS = (
    Column("mesh", "mesh"),
    Column("layout", "layout"),
    Column("L", "seq_len", "num"),
    Column("phase", "phase"),
    Column("before ms", "before_s", "ms"),
    Column("after ms", "after_s", "ms"),
    Column("after/before", "ratio", "num"),
    Column("change", "change_pct", "num"),
    Column("ratio low", "ratio_low", "num"),
    Column("ratio high", "ratio_high", "num"),
    Column("verdict", "verdict"),
    Column("status before", "status_before"),
    Column("status after", "status_after"),
    Column("id", "id", cls="id"),
)


def _compare_cell_class(row: pd.Series, column: Column) -> str:
    if column.key in ("ratio", "change_pct", "verdict"):
        verdict = row.get("verdict")
        return {"slower": "bad", "faster": "good"}.get(verdict, "") if isinstance(verdict, str) else ""
    return ""


def recommendation_view(rec: Recommendation | None, note: str | None) -> RecommendationView:
    """The recommendation with its tables (those with rows) laid out."""
    if rec is None:
        return RecommendationView(None, note)
    if rec.explanation is not None or rec.frameworks:
        settings = [(f.framework, f.settings, setting_note(asdict(f))) for f in rec.frameworks]
        summary = explanation_text(asdict(rec.explanation)) if rec.explanation else rec.summary
        rec = replace(rec, summary=summary, settings=settings)
    tables = []
    for i, (caption, rows) in enumerate(rec.tables):
        if not rows:
            continue
        keys = list(dict.fromkeys(k for row in rows for k in row))
        frame = pd.DataFrame(rows, columns=keys)
        columns = [Column(k, k) for k in keys]
        tables.append((caption, table(frame, columns, table_id=f"recommendation-table-{i}")))
    return RecommendationView(rec, note, tables)


# ------------------------------------------------------------------------------------- page


def figure_data(fig: go.Figure) -> Any:
    """The figure as plain JSON data (plotly's own serialisation: NaN -> null, arrays ->
    lists), for the template's `tojson`."""
    return json.loads(pio.to_json(fig, validate=False, pretty=False))


def render_page(
    *,
    title: str,
    summary: Summary,
    sources: Sequence[str],
    generated_at: datetime,
    profile_line: str,
    sections: Sequence[Section],
) -> Page:
    """The whole HTML document: header, table of contents, sections (figures drawn from
    embedded JSON by the one embedded copy of plotly.js)."""
    specs: list[dict[str, Any]] = []
    for s in sections:
        if s.figure is not None:
            s.plot_id = f"fig-{len(specs)}"
            specs.append({"target": s.plot_id, "figure": figure_data(s.figure)})
    html = (
        environment()
        .get_template("page.html")
        .render(
            title=title,
            summary=summary,
            sources=list(sources),
            generated_at=generated_at,
            profile_line=profile_line,
            sections=sections,
            specs=specs,
            static=static_files(),
            plotly_config=PLOTLY_CONFIG,
            plotly_js=Markup(get_plotlyjs()) if specs else "",
            version=__version__,
            plotly_version=plotly.__version__,
            no_profile_note=NO_PROFILE_NOTE,
        )
    )
    return Page(html, len(specs))


def _missing_phases_note(frame: pd.DataFrame) -> str | None:
    present = set(phases_of(ok_rows(frame, "median_s")))
    if not present:
        return None
    missing = [p for p in PHASE_ORDER if p not in present]
    if not missing:
        return None
    return (
        f"No successful {' or '.join(missing)} measurement: "
        f"the {' and '.join(missing)} facets are left out of every chart."
    )


WORK_COLUMNS = (
    Column("phase", "phase"),
    Column("layout", "layout"),
    Column("mesh", "mesh"),
    Column("L", "seq_len", "num"),
    Column("mask", "mask"),
    Column("documents", "documents", "num"),
    Column("padding tokens", "padding", "num"),
    Column("run length", "run_seq_len", "num"),
    Column("step median ms", "median_s", "ms"),
    Column("slowest compute ms", "compute_s", "ms"),
    Column("work max/mean", "work_imbalance", "num"),
    Column("compute max/mean", "compute_imbalance", "num"),
    Column("r (ranks)", "correlation", "num"),
    Column("id", "id", cls="id"),
)


def work_section(report: ReportData) -> Section:
    """Packed documents: the per-rank work figure and, per record, the padding each layout
    paid, its predicted and measured balance and its step time."""
    fits = report.work
    rows = (
        pd.concat([fit.records.assign(phase=fit.phase) for fit in fits], ignore_index=True)
        if fits
        else pd.DataFrame()
    )
    explain = (
        "Each rank's median compute-only time (communication removed) against the model's "
        "work for it: attended (query, key) pairs of its ring rank x B x its heads "
        "(cpbench.config.geometry.rank_pairs, a causal diagonal pair counts 1/2). The dotted "
        "line is the least-squares fit over every rank of the phase; r is Pearson's "
        "correlation, the largest error is |fit / measured - 1|. Padding is the tokens the "
        "layout added (doc_zigzag pads every document to a multiple of 2R)."
    )
    if fits:
        explain += " " + " ".join(
            f"Phase {fit.phase}: r = {'n/a' if fit.correlation is None else f'{fit.correlation:.3f}'} "
            f"over {len(fit.points)} ranks, largest error {fit.max_error * 100:.1f}%."
            for fit in fits
        )
    return Section(
        "packed-documents",
        "Packed documents: per-rank work and padding",
        explain,
        balance.work_balance_figure(fits),
        table=table(rows, WORK_COLUMNS, table_id="work-table") if not rows.empty else None,
    )


def report_sections(report: ReportData) -> list[Section]:
    """The sections of a report, in page order."""
    frame = report.frame
    phase_note = _missing_phases_note(frame)
    heat_phase = timing.heatmap_phase(frame)
    sections = [
        Section(
            "step-time",
            "Step time",
            "Median over iterations of the slowest rank's step time; bars span p10-p90. "
            "Colour = U x R mesh, dash = layout.",
            timing.step_time_figure(frame),
            phase_note or None,
        ),
        Section(
            "throughput",
            "Achieved TFLOP/s",
            "Global attention FLOPs / median step time. "
            + (f"Convention: {report.flops_convention}." if report.flops_convention else ""),
            timing.throughput_figure(frame),
            report.peak_note,
        ),
        Section(
            "communication",
            "Communication volume: analytic vs measured",
            "Bytes a rank sends per layer (forward, backward) from the formulas vs counted by "
            "the instrumented communicator; they must agree: a mismatch is a red cross.",
            communication.comm_bytes_figure(frame),
        ),
        Section(
            "bandwidth",
            "Achieved bandwidth",
            "Measured bytes per rank / communication-only time (algorithm bandwidth).",
            timing.bandwidth_figure(frame),
        ),
        Section(
            "overlap",
            "Compute / communication overlap",
            "Compute-only time plus exposed communication (step - compute) per configuration; "
            "overlap = (compute + comm - step) / min(compute, comm).",
            communication.overlap_figure(frame),
        ),
        Section(
            "memory",
            "Peak memory per rank",
            "Measured peak per rank (max over ranks) against the analytic lower bound "
            "(activations of one attention layer, no model weights).",
            memory.memory_figure(frame),
        ),
        Section(
            "load-balance",
            "Causal load balance",
            "Per-rank time under a causal mask: contiguous leaves early ranks idle, zigzag and "
            "striped spread the work.",
            balance.load_balance_figure(frame),
        ),
        work_section(report),
        Section(
            "mesh-heatmap",
            "U x R mesh",
            f"Median step time of each Ulysses x Ring mesh per sequence length (phase {heat_phase})."
            if heat_phase
            else "",
            timing.heatmap_figure(frame),
        ),
        Section(
            "prediction",
            "Predicted vs measured",
            "Cost-model step time for the hardware profile vs the measurement.",
            prediction.prediction_figure(frame),
            report.prediction_note,
        ),
        Section(
            "recommendation",
            "Recommendation",
            "The best configuration for the measured workload and the settings to reproduce it.",
            recommendation=recommendation_view(report.recommendation, report.recommendation_note),
        ),
        *plan_sections(report),
        Section(
            "records",
            "All records",
            "Click a column header to sort. Failed, skipped and timed-out configurations are "
            "listed with their error.",
            table=records_table(frame),
        ),
    ]
    defaults = {
        "step-time": "No successful configuration has a step time: nothing to plot.",
        "throughput": "No successful configuration reports achieved TFLOP/s.",
        "communication": "No configuration has both analytic and measured communication bytes.",
        "bandwidth": "No configuration reports an achieved bandwidth.",
        "overlap": "No configuration has compute-only and communication-only timings.",
        "memory": "No configuration reports its peak memory.",
        "load-balance": "No causal multi-rank configuration has per-rank timings.",
        "packed-documents": "No configuration with packed documents has per-rank compute "
        "times and predicted work.",
        "mesh-heatmap": "No successful configuration has a step time: no U x R map.",
        "prediction": NO_PROFILE_NOTE,
    }
    for s in sections:
        if s.figure is None and s.key in defaults and not s.note:
            s.note = defaults[s.key]
    return sections


PLAN_COLUMNS = [
    Column("#", "rank", "num"),
    Column("plan", "label"),
    Column("step (s per optimizer step)", "step_s", "num"),
    Column("attention share", "attention_share", "pct"),
    Column("tokens/s/GPU", "tokens_per_s_per_gpu", "num"),
    Column("MFU", "mfu", "pct"),
    Column("memory / rank", "memory_bytes", "bytes"),
    Column("longest L", "max_seq_len", "num"),
]


def plan_sections(report: ReportData) -> list[Section]:
    """The whole-model plan (`cpbench report --model`): feasible plans by step time, the
    rejected ones with the component that overflows. None without a model."""
    plan = report.plan
    if plan is None:
        return []
    inputs, conventions = plan["inputs"], plan["conventions"]
    feasible = pd.DataFrame(plan["feasible"])
    model = inputs.get("model", "")
    name = model.get("name", "") if isinstance(model, dict) else model
    explain = (
        f"{name} at L = {inputs.get('seq_len', '')} on "
        f"{inputs.get('gpus', '')} GPUs ({inputs.get('hardware', '')}): every TP x CP x PP x DP "
        f"x recompute plan that fits, fastest first. Step in seconds per optimizer step (the "
        f"plan's parts: {conventions.get('time', '')}); "
        f"{conventions.get('mfu', '')}; {conventions.get('memory', '')}."
    )
    note = None if not feasible.empty else "No plan fits: see the rejected plans."
    rejected = pd.DataFrame(plan["rejected"])
    sections = [
        Section(
            "plan",
            "Whole-model plan",
            explain,
            note=note,
            table=None if feasible.empty else table(feasible, PLAN_COLUMNS, table_id="plan-table"),
        )
    ]
    if not rejected.empty:
        columns = [Column("plan", "label"), Column("why rejected", "rule")]
        sections.append(
            Section(
                "plan-rejected",
                "Plans that do not fit",
                "The component that overflows, with the longest sequence the plan holds.",
                table=table(rejected, columns, table_id="plan-rejected-table"),
            )
        )
    return sections


def render_report(report: ReportData) -> Page:
    """The HTML report page of `report` (`cpbench.app.report.build_report`)."""
    return render_page(
        title=report.title,
        summary=report.summary,
        sources=report.sources,
        generated_at=report.generated_at,
        profile_line=report.profile_line,
        sections=report_sections(report),
    )


def _verdict(comparison: ComparisonData) -> str:
    c = comparison
    if c.geomean is None:
        verdict = "No configuration ran successfully in both files: nothing to compare."
    else:
        verdict = (
            f"{c.matched} configuration(s) in both files: {c.faster} faster, {c.slower} slower "
            f"(95% intervals of the medians apart, as `cpbench compare`), the rest no "
            f"significant change; geometric mean after/before {c.geomean:.3f}."
        )
    before, after = c.sources
    return (
        f"{before}: {c.before_records} records, {c.before_ok} ok; "
        f"{after}: {c.after_records} records, {c.after_ok} ok. "
        + verdict
        + (
            f" {c.unmatched} id(s) present in one file only or not ok on both sides."
            if c.unmatched
            else ""
        )
    )


def render_comparison(comparison: ComparisonData) -> Page:
    """A before/after page (`cpbench.app.report.build_comparison`): the change per
    configuration (matched by record id) as a bar chart and a table, then every record of
    both files."""
    c = comparison
    sections = [
        Section(
            "change",
            "Change per configuration",
            _verdict(c),
            compare.compare_figure(c.compared),
            None if c.matched else "Nothing to chart.",
        ),
        Section(
            "before-after",
            "Before / after",
            "Matched by record id; after/before < 1 is faster. Click a header to sort.",
            table=table(
                c.compared, COMPARE_COLUMNS, table_id="compare", cell_class=_compare_cell_class
            ),
        ),
        Section(
            "records",
            "All records",
            "Every record of both files, with its source. Click a column header to sort.",
            table=records_table(pd.concat([c.before, c.after], ignore_index=True)),
        ),
    ]
    return render_page(
        title=c.title,
        summary=c.summary,
        sources=c.sources,
        generated_at=c.generated_at,
        profile_line="not used for a comparison",
        sections=sections,
    )
