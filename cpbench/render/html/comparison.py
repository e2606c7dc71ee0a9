"""The before/after page (`render_comparison`): the change per configuration (matched by record
id) as a bar chart and a table, then every record of both files.
"""

from __future__ import annotations

import pandas as pd

from cpbench.app.report.data import ComparisonData
from cpbench.render.figures import compare
from cpbench.render.html.document import Page, Section, render_page
from cpbench.render.html.tables import Column, record_columns, records_table, table

COMPARE_COLUMNS = (
    *record_columns("mesh", "layout", "seq_len", "phase"),
    Column("before ms", "before_s", "ms"),
    Column("after ms", "after_s", "ms"),
    Column("after/before", "ratio", "num"),
    Column("change", "change_pct", "num"),
    Column("ratio low", "ratio_low", "num"),
    Column("ratio high", "ratio_high", "num"),
    Column("verdict", "verdict"),
    Column("status before", "status_before"),
    Column("status after", "status_after"),
    *record_columns("id"),
)


def _compare_cell_class(row: pd.Series, column: Column) -> str:
    if column.key in ("ratio", "change_pct", "verdict"):
        verdict = row.get("verdict")
        return {"slower": "bad", "faster": "good"}.get(verdict, "") if isinstance(verdict, str) else ""
    return ""


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
            "change", "Change per configuration",
            _verdict(c),
            compare.compare_figure(c.compared),
            None if c.matched else "Nothing to chart.",
        ),
        Section(
            "before-after", "Before / after",
            "Matched by record id; after/before < 1 is faster. Click a header to sort.",
            table=table(
                c.compared, COMPARE_COLUMNS, table_id="compare", cell_class=_compare_cell_class
            ),
        ),
        Section(
            "records", "All records",
            "Every record of both files, with its source. Click a column header to sort.",
            table=records_table(pd.concat([c.before, c.after], ignore_index=True)),
        ),
    ]
    return render_page(c, sections, profile_line="not used for a comparison")
