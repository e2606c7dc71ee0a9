"""Page assembly of the HTML report: one self-contained file, no network access at all.

plotly.js is embedded once (inline `<script>`), every figure's JSON sits in a
`<script type="application/json">` block with `<`, `>` and `&` escaped as `\\u003c` etc., and
every string taken from a results file goes through `html.escape`. A small script draws the
figures and then sets `document.body.dataset.rendered` to their number; errors caught by
`window.onerror` (and rejected promises) are collected in `document.body.dataset.errors`.
The record table sorts on a click on a column header (a few lines of own JS, no library).
"""

from __future__ import annotations

import html
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import pandas as pd
import plotly
import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

from cpbench import __version__
from cpbench.render import figures as F

NO_PROFILE_NOTE = "no hardware profile available"
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True, "showLink": False}


def esc(value: Any) -> str:
    """HTML-escaped text of any value ('' for None/NaN)."""
    if value is None or value is pd.NA:
        return ""
    if isinstance(value, float) and math.isnan(value):
        return ""
    return html.escape(str(value), quote=True)


def script_json(data: Any) -> str:
    """JSON safe to place inside a <script> element: `<`, `>`, `&` and the JS line separators
    become \\u escapes (JSON.parse reads them back unchanged)."""
    text = data if isinstance(data, str) else json.dumps(data)
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


# ------------------------------------------------------------------------------ page content


@dataclass
class Section:
    """One section of the page: a heading, a line on how to read it, a figure (or a note
    saying why there is none) and optional extra HTML (already escaped)."""

    key: str
    title: str
    explain: str = ""
    figure: go.Figure | None = None
    note: str | None = None
    extra_html: str = ""


@dataclass
class Recommendation:
    """What the recommendation section shows (built by `cpbench.app.report`); plain text only,
    escaped when rendered."""

    summary: str = ""
    """One paragraph."""
    tables: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)
    """(caption, rows): one dict per row, keys = column titles."""
    settings: list[tuple[str, str, str]] = field(default_factory=list)
    """(framework, settings to use, note)."""
    notes: list[str] = field(default_factory=list)
    """Extra lines: the workload, the profile, rejected meshes."""


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
    v = float(value)
    for unit, size in (("GiB", 1024.0**3), ("MiB", 1024.0**2), ("KiB", 1024.0)):
        if abs(v) >= size:
            return f"{v / size:.3g} {unit}"
    return f"{v:.0f} B"


# ---------------------------------------------------------------------------------- summary


def _group_reasons(messages: Iterable[str]) -> list[tuple[int, str, int]]:
    """(count, example, variants) per message pattern (numbers ignored), most frequent first."""
    groups: dict[str, list[str]] = {}
    for msg in messages:
        key = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "#", msg or "(no reason recorded)")
        groups.setdefault(key, []).append(msg or "(no reason recorded)")
    out = [(len(v), v[0], len(set(v))) for v in groups.values()]
    return sorted(out, key=lambda t: (-t[0], t[1]))


def summarize(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Header facts: scenarios, devices, hosts, software versions, environment variables,
    record time span and status counts with grouped reasons."""
    scenarios = sorted({str(r.get("scenario")) for r in records if r.get("scenario")})
    statuses = Counter(str(r.get("status")) for r in records)
    reasons = {
        status: _group_reasons(
            str(r.get("error") or "") for r in records if r.get("status") == status
        )
        for status in ("failed", "skipped", "timeout")
        if statuses.get(status)
    }
    devices: Counter[str] = Counter()
    hosts: set[str] = set()
    software: dict[str, set[str]] = {}
    env_vars: dict[str, set[str]] = {}
    for r in records:
        env = r.get("environment")
        if not isinstance(env, Mapping):
            continue
        devs = env.get("devices")
        if isinstance(devs, list):
            for name, count in Counter(map(str, devs)).items():
                devices[name] = max(devices[name], count)
        hostnames = env.get("hostnames")
        if isinstance(hostnames, list):
            hosts.update(map(str, hostnames))
        for key, value in env.items():
            if key in ("devices", "hostnames", "env"):
                continue
            if value is None or isinstance(value, (str, int, float, bool)):
                software.setdefault(str(key), set()).add("none" if value is None else str(value))
        variables = env.get("env")
        if isinstance(variables, Mapping):
            for key, value in variables.items():
                env_vars.setdefault(str(key), set()).add(str(value))
    stamps = sorted(str(r["timestamp"]) for r in records if r.get("timestamp"))
    return {
        "scenarios": scenarios,
        "total": len(records),
        "statuses": dict(statuses),
        "reasons": reasons,
        "devices": dict(devices),
        "hosts": sorted(hosts),
        "software": {k: sorted(v) for k, v in sorted(software.items())},
        "env": {k: sorted(v) for k, v in sorted(env_vars.items())},
        "first": stamps[0] if stamps else None,
        "last": stamps[-1] if stamps else None,
        "device_kinds": sorted(
            {str(_cfg(r).get("device")) for r in records if _cfg(r).get("device")}
        ),
    }


def _cfg(record: Mapping[str, Any]) -> Mapping[str, Any]:
    cfg = record.get("config")
    return cfg if isinstance(cfg, Mapping) else {}


def _header_html(
    title: str,
    summary: Mapping[str, Any],
    sources: Sequence[str],
    generated_at: datetime,
    profile_line: str,
) -> str:
    st = summary["statuses"]
    counts = (
        f"<strong>{summary['total']}</strong> configurations: "
        f"<span class='st-ok'>{st.get('ok', 0)} ran</span>, "
        f"<span class='st-failed'>{st.get('failed', 0)} failed</span>, "
        f"<span class='st-skipped'>{st.get('skipped', 0)} skipped</span>, "
        f"<span class='st-timeout'>{st.get('timeout', 0)} timed out</span>"
    )
    others = {k: v for k, v in st.items() if k not in ("ok", "failed", "skipped", "timeout")}
    if others:
        counts += ", " + ", ".join(f"{v} {esc(k)}" for k, v in sorted(others.items()))
    reason_items = []
    for status, groups in summary["reasons"].items():
        for count, example, variants in groups:
            more = f" <span class='muted'>({variants} variants)</span>" if variants > 1 else ""
            reason_items.append(
                f"<li><span class='st-{esc(status)}'>{esc(status)}</span> x{count}: "
                f"{esc(example)}{more}</li>"
            )
    devices = ", ".join(f"{n} x {esc(name)}" for name, n in summary["devices"].items()) or "unknown"
    hosts = summary["hosts"]
    host_text = (
        f"{len(hosts)} host(s): "
        + ", ".join(esc(h) for h in hosts[:8])
        + (" ..." if len(hosts) > 8 else "")
        if hosts
        else "unknown"
    )
    software = "; ".join(f"{esc(k)} {esc(', '.join(v))}" for k, v in summary["software"].items())
    software = (software + "; " if software else "") + (
        f"report: cpbench {esc(__version__)}, plotly {esc(plotly.__version__)}"
    )
    span = (
        f"{esc(summary['first'])} to {esc(summary['last'])}"
        if summary["first"] and summary["first"] != summary["last"]
        else esc(summary["first"] or "unknown")
    )
    env_rows = "".join(
        f"<tr><td>{esc(k)}</td><td>{esc(', '.join(v))}</td></tr>" for k, v in summary["env"].items()
    )
    env_html = (
        f"<details><summary>environment variables ({len(summary['env'])})</summary>"
        f"<table class='plain'>{env_rows}</table></details>"
        if env_rows
        else ""
    )
    return f"""<header>
<h1>{esc(title)}</h1>
<dl class="facts">
<dt>scenario</dt><dd>{esc(", ".join(summary["scenarios"]) or "unknown")}</dd>
<dt>results</dt><dd>{esc(", ".join(sources))}</dd>
<dt>hardware</dt><dd>{devices}; {host_text}</dd>
<dt>profile</dt><dd>{esc(profile_line)}</dd>
<dt>software</dt><dd>{software}</dd>
<dt>measured</dt><dd>{span}</dd>
<dt>report</dt><dd>generated {esc(generated_at.strftime("%Y-%m-%d %H:%M %Z").strip())}</dd>
<dt>status</dt><dd>{counts}</dd>
</dl>
{"<ul class='reasons'>" + "".join(reason_items) + "</ul>" if reason_items else ""}
{env_html}
</header>"""


# ------------------------------------------------------------------------------------ tables


@dataclass(frozen=True)
class Column:
    title: str
    key: str
    kind: str = "text"  # text | num | bytes | ms | pct
    cls: str = ""


RECORD_COLUMNS = (
    Column("status", "status"),
    Column("impl", "impl"),
    Column("mesh", "mesh"),
    Column("layout", "layout"),
    Column("L", "seq_len", "num"),
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


def table_html(
    frame: pd.DataFrame,
    columns: Sequence[Column],
    *,
    table_id: str,
    row_class: Any = None,
    cell_class: Any = None,
) -> str:
    """A sortable table of `frame` (columns missing or all empty are left out); every value is
    escaped. `row_class(row) -> str` and `cell_class(row, column) -> str` add CSS classes."""
    cols = [c for c in columns if c.key in frame and frame[c.key].notna().any()]
    head = "".join(
        f"<th scope='col' data-type='{'text' if c.kind == 'text' else 'num'}'>{esc(c.title)}</th>"
        for c in cols
    )
    body = []
    for _, row in frame.iterrows():
        cells = []
        for c in cols:
            sort, text = _cell(row[c.key], c.kind)
            classes = " ".join(x for x in (c.cls, cell_class(row, c) if cell_class else "") if x)
            attr = f" class='{esc(classes)}'" if classes else ""
            cells.append(f"<td data-sort='{esc(sort)}'{attr}>{esc(text)}</td>")
        rcls = row_class(row) if row_class else ""
        body.append(f"<tr class='{esc(rcls)}'>" + "".join(cells) + "</tr>")
    return (
        f"<div class='table-wrap'><table class='sortable' id='{esc(table_id)}'>"
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
    )


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


def records_table_html(frame: pd.DataFrame) -> str:
    """Every record (failures included, with their errors), sortable by any column."""
    impls = set(frame["impl"].dropna()) if "impl" in frame else set()
    hide = {"source"} if frame["source"].nunique() < 2 else set()
    if impls <= {"cpbench"}:
        hide.add("impl")  # shown when an external implementation is in the results
    columns = [c for c in RECORD_COLUMNS if c.key not in hide]
    return table_html(
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
    Column("status before", "status_before"),
    Column("status after", "status_after"),
    Column("id", "id", cls="id"),
)


def _compare_cell_class(row: pd.Series, column: Column) -> str:
    if column.key in ("ratio", "change_pct"):
        ratio = row.get("ratio")
        if ratio is not None and not pd.isna(ratio):
            return "bad" if ratio > 1.05 else ("good" if ratio < 0.95 else "")
    return ""


def recommendation_html(rec: Recommendation | None, note: str | None) -> str:
    if rec is None:
        return f"<p class='note'>{esc(note or NO_PROFILE_NOTE)}</p>"
    parts = []
    if rec.summary:
        parts.append(f"<p class='summary'>{esc(rec.summary)}</p>")
    if rec.settings:
        items = "".join(
            f"<dt>{esc(fw)}</dt><dd><code>{esc(text)}</code>"
            + (f"<div class='muted'>{esc(why)}</div>" if why else "")
            + "</dd>"
            for fw, text, why in rec.settings
        )
        parts.append(f"<h3>Framework settings</h3><dl class='settings'>{items}</dl>")
    for i, (caption, rows) in enumerate(rec.tables):
        if not rows:
            continue
        keys = list(dict.fromkeys(k for row in rows for k in row))
        frame = pd.DataFrame(rows, columns=keys)
        parts.append(f"<h3>{esc(caption)}</h3>")
        parts.append(
            table_html(frame, [Column(k, k) for k in keys], table_id=f"recommendation-table-{i}")
        )
    parts.extend(f"<p class='note'>{esc(n)}</p>" for n in rec.notes)
    if note:
        parts.append(f"<p class='note'>{esc(note)}</p>")
    return "\n".join(parts)


# ------------------------------------------------------------------------------------- page


CSS = """
:root { --fg: #1d232a; --muted: #66707a; --line: #dde2e7; --bad: #c62828; --good: #2e7d32; }
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 1360px; padding: 16px 24px 48px; color: var(--fg);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
h1 { font-size: 22px; margin: 8px 0 12px; }
h2 { font-size: 17px; margin: 28px 0 4px; padding-top: 8px; border-top: 1px solid var(--line); }
h3 { font-size: 14px; margin: 14px 0 4px; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 0; }
dl.facts dt { color: var(--muted); }
dl.facts dd { margin: 0; }
ul.reasons { margin: 6px 0; padding-left: 20px; }
nav.toc { margin: 12px 0; font-size: 13px; }
nav.toc a { margin-right: 12px; color: #1565c0; text-decoration: none; }
p.explain { color: var(--muted); margin: 2px 0 6px; }
p.note { color: var(--muted); font-style: italic; margin: 4px 0; }
.plot { width: 100%; min-height: 320px; }
.st-ok { color: var(--good); } .st-failed, .st-timeout { color: var(--bad); }
.st-skipped { color: #8d6e00; } .muted { color: var(--muted); }
.table-wrap { overflow-x: auto; max-height: 640px; overflow-y: auto; border: 1px solid var(--line); }
table.sortable { border-collapse: collapse; font-size: 12px; white-space: nowrap; }
table.sortable th { position: sticky; top: 0; background: #f3f5f7; cursor: pointer; user-select: none;
  padding: 4px 8px; border-bottom: 1px solid var(--line); text-align: left; }
table.sortable th[aria-sort="ascending"]::after { content: " \\25B2"; }
table.sortable th[aria-sort="descending"]::after { content: " \\25BC"; }
table.sortable td { padding: 3px 8px; border-bottom: 1px solid #eef1f4; }
table.sortable tr.st-row-failed, table.sortable tr.st-row-timeout { background: #fff4f4; }
table.sortable tr.st-row-skipped { background: #fffbea; }
td.bad { background: #ffcdd2; color: var(--bad); font-weight: 600; }
td.good { color: var(--good); font-weight: 600; }
td.err { white-space: normal; min-width: 260px; max-width: 520px; }
td.id { color: var(--muted); font-family: ui-monospace, Menlo, Consolas, monospace; }
table.plain td { padding: 1px 10px 1px 0; font-size: 12px; }
dl.settings dt { font-weight: 600; margin-top: 6px; }
dl.settings dd { margin: 2px 0 0 16px; }
code { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; background: #f3f5f7;
  padding: 1px 4px; white-space: pre-wrap; }
p.summary { font-size: 15px; }
"""

ERRORS_JS = """
(function () {
  function record(message) {
    var body = document.body;
    var prev = body.dataset.errors ? body.dataset.errors + "\\n" : "";
    body.dataset.errors = prev + String(message);
  }
  window.__cpbenchRecordError = record;
  window.addEventListener("error", function (e) {
    record((e && e.message) || "error loading " + ((e && e.target && e.target.src) || "a resource"));
  }, true);
  window.addEventListener("unhandledrejection", function (e) {
    record("unhandled rejection: " + (e && e.reason && (e.reason.stack || e.reason)));
  });
})();
"""

RENDER_JS = """
(function () {
  var specs = document.querySelectorAll("script.figure-spec");
  var config = JSON.parse(document.getElementById("plotly-config").textContent);
  var jobs = [];
  specs.forEach(function (node) {
    var spec = JSON.parse(node.textContent);
    var target = document.getElementById(node.dataset.target);
    jobs.push(Plotly.newPlot(target, spec.data, spec.layout || {}, config));
  });
  Promise.all(jobs).then(function () {
    document.body.dataset.rendered = String(jobs.length);
  }, function (err) {
    window.__cpbenchRecordError("plot failed: " + (err && (err.stack || err)));
  });
})();
"""

SORT_JS = """
(function () {
  function key(cell) {
    return cell.hasAttribute("data-sort") ? cell.getAttribute("data-sort") : cell.textContent.trim();
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    var heads = table.querySelectorAll("thead th");
    heads.forEach(function (th, col) {
      th.tabIndex = 0;
      function sort() {
        var ascending = th.getAttribute("aria-sort") !== "ascending";
        heads.forEach(function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
        var numeric = th.dataset.type === "num";
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = key(a.cells[col]), y = key(b.cells[col]);
          if (x === "" || y === "") { return x === y ? 0 : (x === "" ? 1 : -1); }
          var c = numeric ? parseFloat(x) - parseFloat(y)
                          : x.localeCompare(y, undefined, {numeric: true});
          return ascending ? c : -c;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      }
      th.addEventListener("click", sort);
      th.addEventListener("keydown", function (e) {
        if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sort(); }
      });
    });
  });
})();
"""


def figure_json(fig: go.Figure) -> str:
    """The figure as JSON safe to embed in a <script> element."""
    return script_json(pio.to_json(fig, validate=False, pretty=False))


def render_page(
    *,
    title: str,
    header_html: str,
    sections: Sequence[Section],
) -> str:
    """The whole HTML document: header, table of contents, sections (figures drawn from
    embedded JSON by the one embedded copy of plotly.js)."""
    toc = " ".join(f"<a href='#{esc(s.key)}'>{esc(s.title)}</a>" for s in sections)
    body: list[str] = []
    specs: list[str] = []
    count = 0
    for s in sections:
        body.append(f"<section id='{esc(s.key)}'><h2>{esc(s.title)}</h2>")
        if s.explain:
            body.append(f"<p class='explain'>{esc(s.explain)}</p>")
        if s.note:
            body.append(f"<p class='note'>{esc(s.note)}</p>")
        if s.figure is not None:
            target = f"fig-{count}"
            count += 1
            body.append(f"<div class='plot' id='{target}'></div>")
            specs.append(
                f"<script type='application/json' class='figure-spec' data-target='{target}'>"
                f"{figure_json(s.figure)}</script>"
            )
        if s.extra_html:
            body.append(s.extra_html)
        body.append("</section>")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="cpbench {esc(__version__)}">
<title>{esc(title)}</title>
<style>{CSS}</style>
</head>
<body data-figures="{count}" data-errors="">
<script>{ERRORS_JS}</script>
{header_html}
<nav class="toc">{toc}</nav>
{"".join(body)}
<script type="application/json" id="plotly-config">{script_json(PLOTLY_CONFIG)}</script>
{"".join(specs)}
<script>{SORT_JS}</script>
<script type="text/javascript">{get_plotlyjs() if count else ""}</script>
<script>{RENDER_JS if count else 'document.body.dataset.rendered = "0";'}</script>
</body>
</html>
"""


def _missing_phases_note(frame: pd.DataFrame) -> str | None:
    present = set(F.phases_of(F.ok_rows(frame, "median_s")))
    if not present:
        return None
    missing = [p for p in F.PHASE_ORDER if p not in present]
    if not missing:
        return None
    return (
        f"No successful {' or '.join(missing)} measurement: "
        f"the {' and '.join(missing)} facets are left out of every chart."
    )


def report_sections(
    frame: pd.DataFrame,
    *,
    prediction_note: str | None = None,
    recommendation: Recommendation | None = None,
    recommendation_note: str | None = None,
    flops_convention: str | None = None,
    peak_note: str | None = None,
) -> list[Section]:
    """The sections of a report, in page order."""
    phase_note = _missing_phases_note(frame)
    heat_phase = F.heatmap_phase(frame)
    sections = [
        Section(
            "step-time",
            "Step time",
            "Median over iterations of the slowest rank's step time; bars span p10-p90. "
            "Colour = U x R mesh, dash = layout.",
            F.step_time_figure(frame),
            phase_note or None,
        ),
        Section(
            "throughput",
            "Achieved TFLOP/s",
            "Global attention FLOPs / median step time. "
            + (f"Convention: {flops_convention}." if flops_convention else ""),
            F.throughput_figure(frame),
            peak_note,
        ),
        Section(
            "communication",
            "Communication volume: analytic vs measured",
            "Bytes a rank sends per layer (forward, backward) from the formulas vs counted by "
            "the instrumented communicator; they must agree: a mismatch is a red cross.",
            F.comm_bytes_figure(frame),
        ),
        Section(
            "bandwidth",
            "Achieved bandwidth",
            "Measured bytes per rank / communication-only time (algorithm bandwidth).",
            F.bandwidth_figure(frame),
        ),
        Section(
            "overlap",
            "Compute / communication overlap",
            "Compute-only time plus exposed communication (step - compute) per configuration; "
            "overlap = (compute + comm - step) / min(compute, comm).",
            F.overlap_figure(frame),
        ),
        Section(
            "memory",
            "Peak memory per rank",
            "Measured peak per rank (max over ranks) against the analytic lower bound "
            "(activations of one attention layer, no model weights).",
            F.memory_figure(frame),
        ),
        Section(
            "load-balance",
            "Causal load balance",
            "Per-rank time under a causal mask: contiguous leaves early ranks idle, zigzag and "
            "striped spread the work.",
            F.load_balance_figure(frame),
        ),
        Section(
            "mesh-heatmap",
            "U x R mesh",
            f"Median step time of each Ulysses x Ring mesh per sequence length (phase {heat_phase})."
            if heat_phase
            else "",
            F.heatmap_figure(frame),
        ),
        Section(
            "prediction",
            "Predicted vs measured",
            "Cost-model step time for the hardware profile vs the measurement.",
            F.prediction_figure(frame),
            prediction_note,
        ),
        Section(
            "recommendation",
            "Recommendation",
            "The best configuration for the measured workload and the settings to reproduce it.",
            None,
            None,
            recommendation_html(recommendation, recommendation_note),
        ),
        Section(
            "records",
            "All records",
            "Click a column header to sort. Failed, skipped and timed-out configurations are "
            "listed with their error.",
            None,
            None,
            records_table_html(frame),
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
        "mesh-heatmap": "No successful configuration has a step time: no U x R map.",
        "prediction": NO_PROFILE_NOTE,
    }
    for s in sections:
        if s.figure is None and s.key in defaults and not s.note:
            s.note = defaults[s.key]
    return sections


def render_report(
    records: Sequence[Mapping[str, Any]],
    frame: pd.DataFrame,
    *,
    title: str | None = None,
    sources: Sequence[str] = (),
    profile_line: str = NO_PROFILE_NOTE,
    prediction_note: str | None = None,
    recommendation: Recommendation | None = None,
    recommendation_note: str | None = None,
    peak_note: str | None = None,
    generated_at: datetime | None = None,
) -> str:
    """The HTML report of `records` (whose frame is `frame`, possibly with `predicted_s` and
    `peak_fraction` columns added by the cost model)."""
    summary = summarize(records)
    title = title or "cpbench report: " + (", ".join(summary["scenarios"]) or "results")
    conventions = {
        str(r["flops"]["convention"])
        for r in records
        if isinstance(r.get("flops"), Mapping) and r["flops"].get("convention")
    }
    sections = report_sections(
        frame,
        prediction_note=prediction_note,
        recommendation=recommendation,
        recommendation_note=recommendation_note,
        flops_convention="; ".join(sorted(conventions)) or None,
        peak_note=peak_note,
    )
    header = _header_html(
        title,
        summary,
        list(sources) or sorted({str(s) for s in frame["source"].dropna()}),
        generated_at or datetime.now(timezone.utc),
        profile_line,
    )
    return render_page(title=title, header_html=header, sections=sections)


def render_compare(
    before_records: Sequence[Mapping[str, Any]],
    after_records: Sequence[Mapping[str, Any]],
    before: pd.DataFrame,
    after: pd.DataFrame,
    *,
    title: str | None = None,
    sources: Sequence[str] = ("before", "after"),
    generated_at: datetime | None = None,
) -> str:
    """A before/after page: the change per configuration (matched by record id) as a bar
    chart and a table, then every record of both files."""
    compared = F.compare_frame(before, after)
    matched = compared[compared["ratio"].notna()]
    summary = summarize([*before_records, *after_records])
    title = title or f"cpbench comparison: {sources[0]} -> {sources[1]}"
    if matched.empty:
        verdict = "No configuration ran successfully in both files: nothing to compare."
    else:
        geo = math.exp(float(pd.Series(matched["ratio"]).apply(math.log).mean()))
        slower = int((matched["ratio"] > 1.05).sum())
        faster = int((matched["ratio"] < 0.95).sum())
        verdict = (
            f"{len(matched)} configuration(s) in both files: {faster} faster, {slower} slower "
            f"(more than 5%); geometric mean after/before {geo:.3f}."
        )
    only = len(compared) - len(matched)

    def side(name: str, recs: Sequence[Mapping[str, Any]]) -> str:
        ok = sum(1 for r in recs if r.get("status") == "ok")
        return f"{name}: {len(recs)} records, {ok} ok"

    verdict = f"{side(sources[0], before_records)}; {side(sources[1], after_records)}. " + verdict
    sections = [
        Section(
            "change",
            "Change per configuration",
            verdict
            + (f" {only} id(s) present in one file only or not ok on both sides." if only else ""),
            F.compare_figure(compared),
            None if not matched.empty else "Nothing to chart.",
        ),
        Section(
            "before-after",
            "Before / after",
            "Matched by record id; after/before < 1 is faster. Click a header to sort.",
            None,
            None,
            table_html(
                compared, COMPARE_COLUMNS, table_id="compare", cell_class=_compare_cell_class
            ),
        ),
        Section(
            "records",
            "All records",
            "Every record of both files, with its source. Click a column header to sort.",
            None,
            None,
            records_table_html(pd.concat([before, after], ignore_index=True)),
        ),
    ]
    header = _header_html(
        title,
        summary,
        list(sources),
        generated_at or datetime.now(timezone.utc),
        "not used for a comparison",
    )
    return render_page(title=title, header_html=header, sections=sections)
