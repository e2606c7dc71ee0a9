"""What every figure shares: colours, the order of meshes and layouts, escaping of record
text, log axes, the layout of a figure and the per-phase line facets."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from cpbench import units
from cpbench.config.vocabulary import LAYOUTS
from cpbench.render.text import visible
from cpbench.results.frame import ok_rows, phases_of, value, with_variant

LAYOUT_ORDER = LAYOUTS
LAYOUT_DASH = {"contiguous": "solid", "zigzag": "dash", "striped": "dot", "doc_zigzag": "dashdot",
               "balanced": "longdash"}  # fmt: skip
LAYOUT_COLOR = {"contiguous": "#d62728", "zigzag": "#1f77b4", "striped": "#2ca02c",
                "doc_zigzag": "#9467bd", "balanced": "#ff7f0e"}  # fmt: skip
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#d62728")  # fmt: skip
MISMATCH_COLOR = "#d62728"
COMPUTE_COLOR = "#1f77b4"
EXPOSED_COLOR = "#ff7f0e"
OVERLAP_COLOR = "#2ca02c"
MAX_HEATMAPS = 12
MAX_BALANCE_FACETS = 8
FIGURE_HEIGHT = 420


def format_seq_len(n: float) -> str:
    """1024 -> '1K', 131072 -> '128K', 1048576 -> '1M' (powers of 1024), else the number."""
    n = int(n)
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def plain_values(series: Iterable[Any]) -> list[Any]:
    return [value(v) for v in series]


TEXT_COLUMNS = ("id", "mesh", "layout", "phase", "scheme", "source", "kernel", "dtype", "variant",
                "impl")  # fmt: skip
"""Record strings that end up in figure text; plotly reads a subset of HTML in text, so they
are HTML-escaped (plotly shows `&lt;` as `<`), their hidden characters made visible, before
they get there."""


def escaped(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of `frame` whose TEXT_COLUMNS are HTML-escaped (safe as plotly text)."""
    out = frame.copy()
    for col in TEXT_COLUMNS:
        if col in out:
            out[col] = out[col].map(lambda v: html.escape(visible(v)) if isinstance(v, str) else v)
    return out


def plot_rows(frame: pd.DataFrame, *required: str) -> pd.DataFrame:
    """`ok_rows` with the `variant` column, escaped for use in figure text."""
    return escaped(with_variant(ok_rows(frame, *required)))


def mesh_order(frame: pd.DataFrame) -> list[str]:
    """Mesh labels (U{u}xR{r}) sorted by world size, then Ulysses degree, descending."""
    meshes = frame[["mesh", "ulysses", "ring"]].dropna().drop_duplicates("mesh")
    keyed = sorted(
        meshes.itertuples(index=False),
        key=lambda m: (int(m.ulysses) * int(m.ring), -int(m.ulysses), str(m.mesh)),
    )
    return [str(m.mesh) for m in keyed]


def layout_order(values: Iterable[str]) -> list[str]:
    present = {v for v in values if isinstance(v, str)}
    return [x for x in LAYOUT_ORDER if x in present] + sorted(present - set(LAYOUT_ORDER))


def multi_source(frame: pd.DataFrame) -> bool:
    return "source" in frame and frame["source"].nunique(dropna=True) > 1


def series_keys(frame: pd.DataFrame, base: Sequence[str]) -> list[str]:
    """`base`, plus `variant` when several workloads are present, plus `source` when the
    frame comes from several files."""
    keys = list(base)
    if "variant" in frame and frame["variant"].nunique() > 1:
        keys.append("variant")
    if multi_source(frame):
        keys.append("source")
    return keys


def series_name(key: tuple, keys: Sequence[str]) -> str:
    parts = []
    for k, v in zip(keys, key, strict=True):
        if v in ("", None):
            continue
        parts.append(f"[{v}]" if k == "source" else str(v))
    return " ".join(parts)


SYMBOLS = ("circle", "square", "diamond", "triangle-up", "cross", "star", "x", "pentagon")


def variant_symbols(frame: pd.DataFrame) -> dict[str, str]:
    variants = sorted({str(v) for v in frame.get("variant", pd.Series(dtype=str)).dropna()})
    return {v: SYMBOLS[i % len(SYMBOLS)] for i, v in enumerate(variants)}


def mesh_colors(frame: pd.DataFrame) -> dict[str, str]:
    return {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(mesh_order(frame))}


def log_wanted(values: Iterable[Any], ratio: float = 8.0) -> bool:
    nums = [float(v) for v in values if value(v) is not None and float(v) > 0]
    return bool(nums) and max(nums) / min(nums) >= ratio


def log_ticks(values: Iterable[Any], fmt: Any = None, base2: bool = False) -> dict[str, Any]:
    """Axis settings of a log axis with ticks at 1-2-5 x 10^k (only powers of ten over many
    decades; powers of two with `base2`) labelled in full, instead of plotly's bare minor
    digits."""
    nums = [float(v) for v in values if value(v) is not None and float(v) > 0]
    if not nums:
        return {"type": "log"}
    lo, hi = min(nums), max(nums)
    if base2:
        first, last = math.floor(math.log2(lo)), math.ceil(math.log2(hi))
        step = max(1, math.ceil((last - first) / 10))
        ticks = [2.0**k for k in range(first, last + 1, step) if lo / 1.5 <= 2.0**k <= hi * 1.5]
    else:
        first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        mantissas = (1, 2, 5) if last - first <= 4 else (1,)
        ticks = [
            m * 10.0**k
            for k in range(first, last + 1)
            for m in mantissas
            if lo / 1.5 <= m * 10.0**k <= hi * 1.5
        ]
    if len(ticks) < 2:
        ticks = [lo, hi] if lo != hi else [lo]
    label = fmt or (lambda v: f"{v:g}")
    return {"type": "log", "tickvals": ticks, "ticktext": [label(t) for t in ticks]}


def format_bytes_short(v: float) -> str:
    """Axis label of a byte count: 1048576 -> '1 MiB'."""
    return units.format_bytes(v, ".3g")


def seq_axis(fig: go.Figure, seq_lens: Iterable[Any], **where: Any) -> None:
    ticks = sorted({int(v) for v in seq_lens if value(v) is not None})
    log = len(ticks) > 1 and ticks[-1] / ticks[0] >= 4
    fig.update_xaxes(type="log" if log else "linear", tickvals=ticks,
                     ticktext=[format_seq_len(t) for t in ticks],
                     title_text="sequence length L (tokens)", **where)


def base_layout(fig: go.Figure, title: str, height: int = FIGURE_HEIGHT) -> go.Figure:
    fig.update_layout(title={"text": title, "x": 0.01, "xanchor": "left"}, template="plotly_white",
                      height=height, margin={"l": 70, "r": 30, "t": 70, "b": 60},
                      legend={"font": {"size": 11}}, hoverlabel={"namelength": -1})
    return fig


def phase_facets(phases: Sequence[str], **kw: Any) -> go.Figure:
    """One facet per phase, in a row."""
    return make_subplots(rows=1, cols=len(phases), subplot_titles=[f"phase {p}" for p in phases],
                         horizontal_spacing=0.08, **kw)


def facet_grid(
    titles: Sequence[str], vertical: float, horizontal: float, one_row: float = 0.1
) -> tuple[go.Figure, int, int]:
    """Subplots of one facet per title, at most 4 a row: (figure, rows, columns); `vertical`
    is the spacing between rows (`one_row` when there is one)."""
    cols = min(len(titles), 4)
    rows = math.ceil(len(titles) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=list(titles),
                        vertical_spacing=vertical if rows > 1 else one_row,
                        horizontal_spacing=horizontal)
    return fig, rows, cols


REFERENCE_LINE = {"color": "#999", "dash": "dot", "width": 1}
"""The dotted grey line of a reference: the diagonal where two measures agree, a fitted line."""


def diagonal(lo: float, hi: float, name: str) -> go.Scatter:
    """The y = x reference line from below `lo` to above `hi`."""
    span = [lo * 0.8, hi * 1.25]
    return go.Scatter(x=span, y=span, mode="lines", name=name, line=REFERENCE_LINE,
                      hoverinfo="skip")


def line_traces(
    rows: pd.DataFrame,
    y: str,
    phases: Sequence[str],
    *,
    scale: float = 1.0,
    hover_unit: str = "",
    error_cols: tuple[str, str] | None = None,
    legend: bool = True,
) -> tuple[list[go.Scatter], list[int]]:
    """Lines over the sequence length, one per (mesh, layout[, source]) and phase (colour =
    mesh, dash = layout), with the facet column (1-based position in `phases`) of each."""
    colors = mesh_colors(rows)
    symbols = variant_symbols(rows)
    keys = series_keys(rows, ("mesh", "layout"))
    meshes = mesh_order(rows)
    shown: set[str] = set()
    traces: list[go.Scatter] = []
    cols: list[int] = []
    for col, phase in enumerate(phases, start=1):
        sub = rows[rows["phase"] == phase]
        groups = sorted(
            sub.groupby(keys, dropna=False),
            key=lambda kv: (
                meshes.index(kv[0][0]) if kv[0][0] in meshes else 99,
                LAYOUT_ORDER.index(kv[0][1]) if kv[0][1] in LAYOUT_ORDER else 9,
                str(kv[0][2:]),
            ),
        )
        for key, g in groups:
            g = g.sort_values("seq_len")
            name = series_name(key, keys)
            error_y = None
            if error_cols is not None:
                lo, hi = error_cols
                error_y = {"type": "data", "symmetric": False,
                           "array": plain_values((g[hi] - g[y]) * scale),
                           "arrayminus": plain_values((g[y] - g[lo]) * scale),
                           "thickness": 1, "width": 3}
            traces.append(go.Scatter(
                x=plain_values(g["seq_len"]), y=plain_values(g[y] * scale), mode="lines+markers",
                name=name, legendgroup=name, showlegend=legend and name not in shown,
                line={"color": colors.get(key[0], "#444"), "dash": LAYOUT_DASH.get(key[1])},
                marker={"symbol": symbols.get(str(g["variant"].iloc[0]), "circle")},
                error_y=error_y, customdata=plain_values(g["id"]),
                hovertemplate=f"{name} ({phase})<br>L=%{{x}}<br>%{{y:.4g}} {hover_unit}"
                "<br>%{customdata}<extra></extra>",
            ))
            cols.append(col)
            shown.add(name)
    return traces, cols


def y_scale(fig: go.Figure, values: pd.Series, log_y: bool | None, **where: Any) -> None:
    if log_y is None:
        log_y = log_wanted(values)
    if log_y:
        fig.update_yaxes(**log_ticks(values), **where)
    else:
        fig.update_yaxes(type="linear", rangemode="tozero", **where)


def line_facets(
    rows: pd.DataFrame,
    y: str,
    *,
    title: str,
    y_title: str,
    scale: float = 1.0,
    hover_unit: str = "",
    error_cols: tuple[str, str] | None = None,
    log_y: bool | None = None,
) -> go.Figure:
    """One facet per phase, one line per (mesh, layout[, source]) over the sequence length;
    colour = mesh, dash = layout."""
    phases = phases_of(rows)
    fig = phase_facets(phases, shared_yaxes=False)
    traces, cols = line_traces(rows, y, phases, scale=scale, hover_unit=hover_unit,
                               error_cols=error_cols)
    fig.add_traces(traces, rows=[1] * len(traces), cols=cols)
    base_layout(fig, title)
    seq_axis(fig, rows["seq_len"])
    y_scale(fig, rows[y] * scale, log_y)
    fig.update_yaxes(title_text=y_title, col=1)
    return fig


def config_label(rec: Any, with_phase: bool = False) -> str:
    label = f"{rec.mesh} {rec.layout} {format_seq_len(rec.seq_len)}"
    variant = getattr(rec, "variant", "")
    if variant:
        label += f" {variant}"
    return f"{label} {rec.phase}" if with_phase else label
