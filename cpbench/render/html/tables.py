"""Sortable HTML tables: columns and cells as the template draws them (plain text, escaped when
rendered), `table` from a data frame, and the table of every record.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from cpbench import units


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


def record_columns(*keys: str) -> tuple[Column, ...]:
    """The columns of the records table that show these frame columns, in this order."""
    by_key = {c.key: c for c in RECORD_COLUMNS}
    return tuple(by_key[k] for k in keys)


def _sort_and_text(value: Any, kind: str) -> tuple[str, str]:
    """(data-sort value, display text), both unescaped."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return "", ""
    if kind not in ("bytes", "ms", "pct", "num"):
        return str(value), str(value)
    number = float(value)
    if kind == "bytes":
        text = units.format_bytes(number, ".3g")
    elif kind == "ms":
        text = f"{number * 1e3:.4g}"
    elif kind == "pct":
        text = f"{number * 100:.1f}%"
    else:  # a count as it is, any other number in 4 digits
        plain = value.item() if hasattr(value, "item") else value
        whole = isinstance(plain, int) and not isinstance(plain, bool)
        text = str(plain) if whole else f"{number:.4g}"
    return repr(number), text


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
            sort, text = _sort_and_text(row[c.key], c.kind)
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
