"""Figure builders of the HTML report: pure functions from a results frame to a plotly Figure.

Every builder takes the DataFrame of `cpbench.results.store.records_frame` (or, for comparisons,
the frame of `cpbench.results.frame.compare_frame`) and returns a `plotly.graph_objects.Figure`,
or None when the frame holds nothing to draw (the page then shows a one-line note instead of an empty chart).
Only successful records (`status == "ok"`) are plotted; facets exist only for the phases
that have data. Nothing here reads files, prints or touches the network.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from cpbench import units
from cpbench.config.vocabulary import LAYOUTS
from cpbench.results.frame import ok_rows, phases_of, with_variant
from cpbench.results.frame import value as _value

if TYPE_CHECKING:
    from cpbench.app.report import WorkFit

LAYOUT_ORDER = LAYOUTS
LAYOUT_DASH = {
    "contiguous": "solid",
    "zigzag": "dash",
    "striped": "dot",
    "doc_zigzag": "dashdot",
    "balanced": "longdash",
}
LAYOUT_COLOR = {
    "contiguous": "#d62728",
    "zigzag": "#1f77b4",
    "striped": "#2ca02c",
    "doc_zigzag": "#9467bd",
    "balanced": "#ff7f0e",
}
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#d62728",
)
MISMATCH_COLOR = "#d62728"
COMPUTE_COLOR = "#1f77b4"
EXPOSED_COLOR = "#ff7f0e"
OVERLAP_COLOR = "#2ca02c"
MAX_HEATMAPS = 12
MAX_BALANCE_FACETS = 8
FIGURE_HEIGHT = 420


# ------------------------------------------------------------------------------- small helpers


def format_seq_len(n: float) -> str:
    """1024 -> '1K', 131072 -> '128K', 1048576 -> '1M' (powers of 1024), else the number."""
    n = int(n)
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def _values(series: Iterable[Any]) -> list[Any]:
    return [_value(v) for v in series]


TEXT_COLUMNS = (
    "id",
    "mesh",
    "layout",
    "phase",
    "scheme",
    "source",
    "kernel",
    "dtype",
    "variant",
    "impl",
)
"""Record strings that end up in figure text; plotly reads a subset of HTML in text, so they
are HTML-escaped (plotly shows `&lt;` as `<`) before they get there."""


def escaped(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of `frame` whose TEXT_COLUMNS are HTML-escaped (safe as plotly text)."""
    out = frame.copy()
    for col in TEXT_COLUMNS:
        if col in out:
            out[col] = out[col].map(lambda v: html.escape(v) if isinstance(v, str) else v)
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


def _multi_source(frame: pd.DataFrame) -> bool:
    return "source" in frame and frame["source"].nunique(dropna=True) > 1


def _series_keys(frame: pd.DataFrame, base: Sequence[str]) -> list[str]:
    """`base`, plus `variant` when several workloads are present, plus `source` when the
    frame comes from several files."""
    keys = list(base)
    if "variant" in frame and frame["variant"].nunique() > 1:
        keys.append("variant")
    if _multi_source(frame):
        keys.append("source")
    return keys


def _series_name(key: tuple, keys: Sequence[str]) -> str:
    parts = []
    for k, v in zip(keys, key, strict=True):
        if v in ("", None):
            continue
        parts.append(f"[{v}]" if k == "source" else str(v))
    return " ".join(parts)


SYMBOLS = ("circle", "square", "diamond", "triangle-up", "cross", "star", "x", "pentagon")


def _variant_symbols(frame: pd.DataFrame) -> dict[str, str]:
    variants = sorted({str(v) for v in frame.get("variant", pd.Series(dtype=str)).dropna()})
    return {v: SYMBOLS[i % len(SYMBOLS)] for i, v in enumerate(variants)}


def _mesh_colors(frame: pd.DataFrame) -> dict[str, str]:
    return {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(mesh_order(frame))}


def _log_wanted(values: Iterable[Any], ratio: float = 8.0) -> bool:
    nums = [float(v) for v in values if _value(v) is not None and float(v) > 0]
    return bool(nums) and max(nums) / min(nums) >= ratio


def log_ticks(values: Iterable[Any], fmt: Any = None, base2: bool = False) -> dict[str, Any]:
    """Axis settings of a log axis with ticks at 1-2-5 x 10^k (only powers of ten over many
    decades; powers of two with `base2`) labelled in full, instead of plotly's bare minor
    digits."""
    nums = [float(v) for v in values if _value(v) is not None and float(v) > 0]
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


def _seq_axis(fig: go.Figure, seq_lens: Iterable[Any], **where: Any) -> None:
    ticks = sorted({int(v) for v in seq_lens if _value(v) is not None})
    log = len(ticks) > 1 and ticks[-1] / ticks[0] >= 4
    fig.update_xaxes(
        type="log" if log else "linear",
        tickvals=ticks,
        ticktext=[format_seq_len(t) for t in ticks],
        title_text="sequence length L (tokens)",
        **where,
    )


def _base_layout(fig: go.Figure, title: str, height: int = FIGURE_HEIGHT) -> go.Figure:
    fig.update_layout(
        title={"text": title, "x": 0.01, "xanchor": "left"},
        template="plotly_white",
        height=height,
        margin={"l": 70, "r": 30, "t": 70, "b": 60},
        legend={"font": {"size": 11}},
        hoverlabel={"namelength": -1},
    )
    return fig


def _facets(phases: Sequence[str], titles: Sequence[str] | None = None, **kw: Any) -> go.Figure:
    return make_subplots(
        rows=1,
        cols=len(phases),
        subplot_titles=list(titles or [f"phase {p}" for p in phases]),
        horizontal_spacing=0.08,
        **kw,
    )


def _line_traces(
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
    colors = _mesh_colors(rows)
    symbols = _variant_symbols(rows)
    keys = _series_keys(rows, ("mesh", "layout"))
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
            name = _series_name(key, keys)
            error_y = None
            if error_cols is not None:
                lo, hi = error_cols
                error_y = {
                    "type": "data",
                    "symmetric": False,
                    "array": _values((g[hi] - g[y]) * scale),
                    "arrayminus": _values((g[y] - g[lo]) * scale),
                    "thickness": 1,
                    "width": 3,
                }
            traces.append(
                go.Scatter(
                    x=_values(g["seq_len"]),
                    y=_values(g[y] * scale),
                    mode="lines+markers",
                    name=name,
                    legendgroup=name,
                    showlegend=legend and name not in shown,
                    line={"color": colors.get(key[0], "#444"), "dash": LAYOUT_DASH.get(key[1])},
                    marker={"symbol": symbols.get(str(g["variant"].iloc[0]), "circle")},
                    error_y=error_y,
                    customdata=_values(g["id"]),
                    hovertemplate=(
                        f"{name} ({phase})<br>L=%{{x}}<br>%{{y:.4g}} {hover_unit}"
                        "<br>%{customdata}<extra></extra>"
                    ),
                )
            )
            cols.append(col)
            shown.add(name)
    return traces, cols


def _y_scale(fig: go.Figure, values: pd.Series, log_y: bool | None, **where: Any) -> None:
    if log_y is None:
        log_y = _log_wanted(values)
    if log_y:
        fig.update_yaxes(**log_ticks(values), **where)
    else:
        fig.update_yaxes(type="linear", rangemode="tozero", **where)


def _line_facets(
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
    fig = _facets(phases, shared_yaxes=False)
    traces, cols = _line_traces(
        rows, y, phases, scale=scale, hover_unit=hover_unit, error_cols=error_cols
    )
    fig.add_traces(traces, rows=[1] * len(traces), cols=cols)
    _base_layout(fig, title)
    _seq_axis(fig, rows["seq_len"])
    _y_scale(fig, rows[y] * scale, log_y)
    fig.update_yaxes(title_text=y_title, col=1)
    return fig


# ------------------------------------------------------------------------------------ figures


def step_time_figure(frame: pd.DataFrame) -> go.Figure | None:
    """Median step time (p10-p90 as error bars) vs sequence length, per mesh and layout, one
    facet per phase; log axes when the values span a wide range."""
    rows = plot_rows(frame, "median_s", "seq_len")
    if rows.empty:
        return None
    lo_hi = (
        ("p10_s", "p90_s") if rows["p10_s"].notna().all() and rows["p90_s"].notna().all() else None
    )
    return _line_facets(
        rows,
        "median_s",
        title="Step time vs sequence length (median, p10-p90 bars)",
        y_title="step time (ms)",
        scale=1e3,
        hover_unit="ms",
        error_cols=lo_hi,
    )


def throughput_figure(frame: pd.DataFrame) -> go.Figure | None:
    """Achieved TFLOP/s vs sequence length; with a `peak_fraction` column (achieved / the
    hardware profile's peak of all ranks) a second row shows the fraction of peak."""
    rows = plot_rows(frame, "achieved_tflops", "seq_len")
    if rows.empty:
        return None
    title = "Achieved attention TFLOP/s (all ranks)"
    if "peak_fraction" not in rows or rows["peak_fraction"].notna().sum() == 0:
        return _line_facets(
            rows,
            "achieved_tflops",
            title=title,
            y_title="TFLOP/s",
            hover_unit="TFLOP/s",
            log_y=False,
        )
    phases = phases_of(rows)
    fig = make_subplots(
        rows=2,
        cols=len(phases),
        subplot_titles=[f"phase {p}: TFLOP/s" for p in phases]
        + [f"phase {p}: % of hardware peak" for p in phases],
        vertical_spacing=0.14,
        horizontal_spacing=0.08,
    )
    tflops, cols = _line_traces(rows, "achieved_tflops", phases, hover_unit="TFLOP/s")
    fig.add_traces(tflops, rows=[1] * len(tflops), cols=cols)
    known = rows[rows["peak_fraction"].notna()]
    frac, cols = _line_traces(
        known, "peak_fraction", phases, scale=100.0, hover_unit="% of peak", legend=False
    )
    fig.add_traces(frac, rows=[2] * len(frac), cols=cols)
    _base_layout(fig, "Achieved attention TFLOP/s and fraction of the hardware peak", 640)
    _seq_axis(fig, rows["seq_len"])
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(title_text="TFLOP/s", row=1, col=1)
    fig.update_yaxes(title_text="% of peak", row=2, col=1)
    return fig


def comm_bytes_figure(frame: pd.DataFrame) -> go.Figure | None:
    """Measured bytes per rank (max over ranks) against the analytic bytes, forward and
    backward, one marker per configuration and direction; a diagonal marks agreement and any
    mismatch is drawn as a large red cross. External implementations (impl other than cpbench)
    are their own series and never a mismatch: the analytic model describes cpbench's
    implementation, and their bytes are plotted against it for comparison only."""
    rows = plot_rows(frame)
    points = []
    for direction in ("fwd", "bwd"):
        a, m = f"analytic_{direction}_bytes", f"measured_{direction}_bytes"
        flag = f"comm_{direction}_mismatch"
        if a not in rows or m not in rows:
            continue
        sub = rows[rows[a].notna() & rows[m].notna() & ((rows[a] > 0) | (rows[m] > 0))]
        for rec in sub.itertuples(index=False):
            impl = _value(getattr(rec, "impl", None)) or "cpbench"
            differs = _value(getattr(rec, flag, None))
            if differs is None:
                differs = float(getattr(rec, a)) != float(getattr(rec, m))
            record_level = bool(_value(rec.comm_mismatch)) and not (
                _value(rec.comm_fwd_mismatch) or _value(rec.comm_bwd_mismatch)
            )
            external = impl != "cpbench"
            points.append(
                {
                    "direction": direction,
                    "scheme": rec.scheme if not external else f"{impl} ({rec.scheme})",
                    "analytic": float(getattr(rec, a)),
                    "measured": float(getattr(rec, m)),
                    "mismatch": not external and (bool(differs) or record_level),
                    "id": rec.id,
                }
            )
    if not points:
        return None
    pts = pd.DataFrame(points)
    fig = go.Figure()
    positive = [v for v in [*pts["analytic"], *pts["measured"]] if v > 0]
    lo, hi = min(positive), max(positive)
    fig.add_trace(
        go.Scatter(
            x=[lo * 0.8, hi * 1.25],
            y=[lo * 0.8, hi * 1.25],
            mode="lines",
            name="measured = analytic",
            line={"color": "#999", "dash": "dot", "width": 1},
            hoverinfo="skip",
        )
    )
    symbols = {"fwd": "circle", "bwd": "diamond"}
    schemes = sorted({str(s) for s in pts["scheme"]})
    for i, scheme in enumerate(schemes):
        for direction in ("fwd", "bwd"):
            sub = pts[
                (pts["scheme"] == scheme) & (pts["direction"] == direction) & ~pts["mismatch"]
            ]
            if sub.empty:
                continue
            fig.add_trace(
                go.Scatter(
                    x=list(sub["analytic"]),
                    y=list(sub["measured"]),
                    mode="markers",
                    name=f"{scheme} {direction}",
                    marker={
                        "color": PALETTE[i % len(PALETTE)],
                        "symbol": symbols[direction],
                        "size": 9,
                        "opacity": 0.8,
                    },
                    customdata=list(sub["id"]),
                    hovertemplate=(
                        f"{scheme} {direction}<br>analytic %{{x:,}} B<br>measured %{{y:,}} B"
                        "<br>%{customdata}<extra></extra>"
                    ),
                )
            )
    bad = pts[pts["mismatch"]]
    if not bad.empty:
        fig.add_trace(
            go.Scatter(
                x=list(bad["analytic"]),
                y=list(bad["measured"]),
                mode="markers",
                name="MISMATCH",
                marker={
                    "color": MISMATCH_COLOR,
                    "symbol": "x",
                    "size": 16,
                    "line": {"width": 1, "color": "#600"},
                },
                customdata=[
                    f"{r.id} ({r.direction}: {r.measured - r.analytic:+,.0f} B)"
                    for r in bad.itertuples(index=False)
                ],
                hovertemplate=(
                    "<b>analytic != measured</b><br>analytic %{x:,} B<br>measured %{y:,} B"
                    "<br>%{customdata}<extra></extra>"
                ),
            )
        )
    title = "Communication per rank: analytic vs measured bytes"
    if not bad.empty:
        title += f" — <span style='color:{MISMATCH_COLOR}'>{len(bad)} mismatch(es)</span>"
    _base_layout(fig, title)
    axis = log_ticks(positive, format_bytes_short, base2=True) if _log_wanted(positive, 4) else {}
    fig.update_xaxes(title_text="analytic bytes per rank", **axis)
    fig.update_yaxes(title_text="measured bytes (max over ranks)", **axis)
    return fig


def bandwidth_figure(frame: pd.DataFrame) -> go.Figure | None:
    """Achieved bus bandwidth (nccl-tests busbw: bytes a rank sends / communication-only time) vs
    sequence length, per mesh and layout, one facet per phase."""
    rows = plot_rows(frame, "busbw_GBps", "seq_len")
    rows = rows[rows["busbw_GBps"] > 0]
    if rows.empty:
        return None
    return _line_facets(
        rows,
        "busbw_GBps",
        title="Achieved communication bandwidth (nccl-tests busbw per rank: bytes sent / comm-only time)",
        y_title="GB/s",
        hover_unit="GB/s",
    )


def _config_label(rec: Any, with_phase: bool = False) -> str:
    label = f"{rec.mesh} {rec.layout} {format_seq_len(rec.seq_len)}"
    variant = getattr(rec, "variant", "")
    if variant:
        label += f" {variant}"
    return f"{label} {rec.phase}" if with_phase else label


def overlap_figure(frame: pd.DataFrame) -> go.Figure | None:
    """Per configuration: compute-only time and exposed communication stacked (their sum is
    the step), with the overlap fraction (right axis) as markers; one row per phase."""
    rows = plot_rows(frame, "compute_only_s", "seq_len")
    rows = rows[rows["exposed_comm_s"].notna() | rows["median_s"].notna()]
    if rows.empty:
        return None
    phases = phases_of(rows)
    fig = make_subplots(
        rows=len(phases),
        cols=1,
        subplot_titles=[f"phase {p}" for p in phases],
        specs=[[{"secondary_y": True}] for _ in phases],
        vertical_spacing=0.22 if len(phases) > 1 else 0.1,
    )
    meshes = mesh_order(rows)
    for r, phase in enumerate(phases, start=1):
        sub = rows[rows["phase"] == phase].copy()
        sub["_m"] = [meshes.index(m) if m in meshes else 99 for m in sub["mesh"]]
        sub["_l"] = [LAYOUT_ORDER.index(x) if x in LAYOUT_ORDER else 9 for x in sub["layout"]]
        sub = sub.sort_values(["_m", "_l", "variant", "seq_len"])
        labels = [_config_label(rec) for rec in sub.itertuples(index=False)]
        if _multi_source(rows):
            labels = [f"{lab} [{s}]" for lab, s in zip(labels, sub["source"], strict=True)]
        exposed = [
            _value(e) if _value(e) is not None else max(0.0, float(m) - float(c))
            for e, m, c in zip(
                sub["exposed_comm_s"], sub["median_s"], sub["compute_only_s"], strict=True
            )
        ]
        first = r == 1
        fig.add_trace(
            go.Bar(
                x=labels,
                y=_values(sub["compute_only_s"] * 1e3),
                name="compute (no communication)",
                legendgroup="compute",
                showlegend=first,
                marker_color=COMPUTE_COLOR,
                hovertemplate="%{x}<br>compute %{y:.4g} ms<extra></extra>",
            ),
            row=r,
            col=1,
        )
        fig.add_trace(
            go.Bar(
                x=labels,
                y=[None if e is None else e * 1e3 for e in exposed],
                name="exposed communication",
                legendgroup="exposed",
                showlegend=first,
                marker_color=EXPOSED_COLOR,
                hovertemplate="%{x}<br>exposed comm %{y:.4g} ms<extra></extra>",
            ),
            row=r,
            col=1,
        )
        overlap = _values(sub["overlap"] * 100)
        if any(v is not None for v in overlap):
            fig.add_trace(
                go.Scatter(
                    x=labels,
                    y=overlap,
                    mode="markers",
                    name="overlap fraction (right axis)",
                    legendgroup="overlap",
                    showlegend=first,
                    marker={"color": OVERLAP_COLOR, "symbol": "diamond", "size": 9},
                    hovertemplate="%{x}<br>overlap %{y:.0f}%<extra></extra>",
                ),
                row=r,
                col=1,
                secondary_y=True,
            )
        fig.update_yaxes(title_text="time (ms)", row=r, col=1, secondary_y=False)
        fig.update_yaxes(
            title_text="overlap %",
            range=[0, 105],
            tickvals=[0, 25, 50, 75, 100],
            ticksuffix="%",
            row=r,
            col=1,
            secondary_y=True,
            showgrid=False,
        )
    fig.update_layout(barmode="stack")
    fig.update_xaxes(tickangle=-45, tickfont={"size": 10})
    _base_layout(
        fig,
        "Overlap: compute + exposed communication = step time",
        max(FIGURE_HEIGHT, 330 * len(phases) + 120),
    )
    return fig


def _bytes_unit(values: Iterable[Any]) -> tuple[str, float]:
    nums = [float(v) for v in values if _value(v) is not None]
    top = max(nums) if nums else 0.0
    for unit, size in (("GiB", 1024.0**3), ("MiB", 1024.0**2), ("KiB", 1024.0)):
        if top >= size:
            return unit, size
    return "B", 1.0


def memory_figure(frame: pd.DataFrame) -> go.Figure | None:
    """Peak memory per rank (max over ranks and layouts) vs sequence length per mesh, solid,
    with the analytic lower bound of `cpbench.model.memory` dashed in the same colour."""
    rows = plot_rows(frame, "seq_len")
    rows = rows[rows["peak_bytes"].notna() | rows["analytic_peak_bytes"].notna()]
    if rows.empty:
        return None
    unit, size = _bytes_unit([*rows["peak_bytes"], *rows["analytic_peak_bytes"]])
    phases = phases_of(rows)
    fig = _facets(phases)
    colors = _mesh_colors(rows)
    symbols = _variant_symbols(rows)
    keys = _series_keys(rows, ("mesh",))
    shown: set[str] = set()
    for col, phase in enumerate(phases, start=1):
        sub = rows[rows["phase"] == phase]
        for key, g in sub.groupby(keys, dropna=False, sort=False):
            key = key if isinstance(key, tuple) else (key,)
            name = _series_name(key, keys)
            per_len = g.groupby("seq_len")[["peak_bytes", "analytic_peak_bytes"]].max().sort_index()
            color = colors.get(key[0], "#444")
            symbol = symbols.get(str(g["variant"].iloc[0]), "circle")
            for what, column, dash in (
                ("measured", "peak_bytes", "solid"),
                ("analytic", "analytic_peak_bytes", "dash"),
            ):
                series = per_len[column].dropna()
                if series.empty:
                    continue
                label = f"{name} {what}"
                fig.add_trace(
                    go.Scatter(
                        x=[int(v) for v in series.index],
                        y=_values(series / size),
                        mode="lines+markers" if what == "measured" else "lines",
                        name=label,
                        legendgroup=label,
                        showlegend=label not in shown,
                        line={"color": color, "dash": dash},
                        marker={"size": 7, "symbol": symbol},
                        hovertemplate=(
                            f"{label} ({phase})<br>L=%{{x}}<br>%{{y:.4g}} {unit}<extra></extra>"
                        ),
                    ),
                    row=1,
                    col=col,
                )
                shown.add(label)
    _base_layout(fig, "Peak memory per rank: measured (solid) vs analytic lower bound (dashed)")
    _seq_axis(fig, rows["seq_len"])
    both = [*rows["peak_bytes"], *rows["analytic_peak_bytes"]]
    if _log_wanted(both):
        fig.update_yaxes(**log_ticks([v / size for v in both if _value(v) is not None]))
    fig.update_yaxes(title_text=f"peak per rank ({unit})", col=1)
    return fig


def _per_rank_column(rows: pd.DataFrame) -> tuple[str, str] | None:
    for col, label in (
        ("compute_only_per_rank_s", "compute-only time per rank"),
        ("per_rank_median_s", "median step time per rank"),
    ):
        if col in rows and rows[col].notna().any():
            return col, label
    return None


def load_balance_figure(frame: pd.DataFrame) -> go.Figure | None:
    """Causal load balance: per-rank time of each layout (contiguous vs zigzag vs striped),
    one facet per mesh (with a ring, R > 1, or several layouts measured) and phase at the
    longest sequence measured with the most layouts. Uses
    the compute-only time per rank (the work) when recorded, else each rank's median step."""
    rows = plot_rows(frame, "seq_len")
    if "causal" in rows:
        rows = rows[rows["causal"].fillna(False).astype(bool)]
    rows = rows[rows["world_size"].fillna(1) > 1]
    # The layout acts on the ring: show meshes with a ring, or with several layouts measured.
    layouts = rows.groupby("mesh")["layout"].nunique()
    rows = rows[(rows["ring"].fillna(1) > 1) | rows["mesh"].map(layouts).gt(1)]
    chosen = _per_rank_column(rows)
    if rows.empty or chosen is None:
        return None
    column, what = chosen
    rows = rows[rows[column].notna()]
    facets = []
    meshes = mesh_order(rows)
    variants = sorted(set(rows["variant"]))
    for phase in phases_of(rows):
        for variant in variants:
            for mesh in meshes:
                sub = rows[
                    (rows["phase"] == phase) & (rows["mesh"] == mesh) & (rows["variant"] == variant)
                ]
                if sub.empty:
                    continue
                counts = sub.groupby("seq_len")["layout"].nunique()
                best = max(counts.index, key=lambda n: (counts[n], n))
                title = " ".join(x for x in (mesh, variant, phase) if x)
                facets.append((title, int(best), sub[sub["seq_len"] == best]))
    if not facets:
        return None
    facets = facets[:MAX_BALANCE_FACETS]
    cols = min(len(facets), 4)
    nrows = math.ceil(len(facets) / cols)
    fig = make_subplots(
        rows=nrows,
        cols=cols,
        subplot_titles=[f"{t} L={format_seq_len(n)}" for t, n, _ in facets],
        vertical_spacing=0.18 if nrows > 1 else 0.1,
        horizontal_spacing=0.06,
    )
    shown: set[str] = set()
    for i, (_title, _n, sub) in enumerate(facets):
        r, c = i // cols + 1, i % cols + 1
        for layout in layout_order(sub["layout"]):
            for rec in sub[sub["layout"] == layout].itertuples(index=False):
                values = list(getattr(rec, column))
                mean = sum(values) / len(values)
                imbalance = max(values) / mean if mean > 0 else float("nan")
                name = str(layout)
                fig.add_trace(
                    go.Bar(
                        x=[f"rank {k}" for k in range(len(values))],
                        y=[v * 1e3 for v in values],
                        name=name,
                        legendgroup=name,
                        showlegend=name not in shown,
                        marker_color=LAYOUT_COLOR.get(name, "#7f7f7f"),
                        hovertemplate=(
                            f"{name}<br>%{{x}}: %{{y:.4g}} ms<br>max/mean {imbalance:.2f}"
                            "<extra></extra>"
                        ),
                    ),
                    row=r,
                    col=c,
                )
                shown.add(name)
                break  # one record per layout (sources beyond the first are not stacked)
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="ms", col=1)
    _base_layout(
        fig,
        f"Causal load balance: {what} (the slowest rank sets the step)",
        max(FIGURE_HEIGHT, 300 * nrows + 120),
    )
    return fig


def _fmt_r(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def work_balance_figure(fits: Sequence[WorkFit]) -> go.Figure | None:
    """Packed documents: each rank's measured compute-only time (ms) against the model's
    per-rank work (attended pairs x B x heads, in units of 1e9), one facet per layout (and
    phase), one marker shape per mesh; the least-squares line over all layouts of the phase in
    every facet. Facet titles give the layout's correlation and the padding it paid."""
    facets: list[tuple[WorkFit, str]] = []
    for fit in fits:
        for layout in layout_order(fit.points["layout"]):
            facets.append((fit, layout))
    if not facets:
        return None
    facets = facets[:MAX_BALANCE_FACETS]
    cols = min(len(facets), 4)
    nrows = math.ceil(len(facets) / cols)
    titles = []
    for fit, layout in facets:
        pts = fit.points[fit.points["layout"] == layout]
        recs = fit.records[fit.records["layout"] == layout]
        pads = sorted({int(p) for p in recs["padding"].dropna()})
        pad = "/".join(str(p) for p in pads) if pads else "?"
        r = None
        if len(pts) >= 3 and pts["work"].std() > 0 and pts["compute_s"].std() > 0:
            r = float(pts["work"].corr(pts["compute_s"]))
        phase = f" {fit.phase}" if len(fits) > 1 else ""
        titles.append(f"{html.escape(layout)}{phase}: r={_fmt_r(r)}, padding {pad} tok")
    fig = make_subplots(
        rows=nrows,
        cols=cols,
        subplot_titles=titles,
        vertical_spacing=0.2 if nrows > 1 else 0.12,
        horizontal_spacing=0.07,
    )
    meshes = sorted({str(m) for fit, _ in facets for m in fit.points["mesh"]})
    symbols = {m: SYMBOLS[i % len(SYMBOLS)] for i, m in enumerate(meshes)}
    shown: set[str] = set()
    for i, (fit, layout) in enumerate(facets):
        r, c = i // cols + 1, i % cols + 1
        pts = escaped(fit.points[fit.points["layout"] == layout])
        for mesh in sorted(set(pts["mesh"])):
            sub = pts[pts["mesh"] == mesh]
            fig.add_trace(
                go.Scatter(
                    x=_values(sub["work"] / 1e9),
                    y=_values(sub["compute_s"] * 1e3),
                    mode="markers",
                    name=str(mesh),
                    legendgroup=str(mesh),
                    showlegend=str(mesh) not in shown,
                    marker={
                        "symbol": symbols.get(html.unescape(str(mesh)), "circle"),
                        "size": 9,
                        "color": LAYOUT_COLOR.get(layout, "#7f7f7f"),
                    },
                    customdata=[
                        f"{rec.mesh} rank {rec.rank} ({rec.error * 100:+.0f}% from the line)"
                        for rec in sub.itertuples(index=False)
                    ],
                    hovertemplate=(
                        "work %{x:.4g} G pair-heads<br>compute %{y:.4g} ms<br>%{customdata}"
                        "<extra></extra>"
                    ),
                ),
                row=r,
                col=c,
            )
            shown.add(str(mesh))
        lo, hi = float(fit.points["work"].min()), float(fit.points["work"].max())
        fig.add_trace(
            go.Scatter(
                x=[lo / 1e9, hi / 1e9],
                y=[(fit.slope_s * w + fit.intercept_s) * 1e3 for w in (lo, hi)],
                mode="lines",
                name=f"fit ({fit.phase})",
                legendgroup=f"fit {fit.phase}",
                showlegend=f"fit {fit.phase}" not in shown,
                line={"color": "#999", "dash": "dot", "width": 1},
                hoverinfo="skip",
            ),
            row=r,
            col=c,
        )
        shown.add(f"fit {fit.phase}")
    fig.update_xaxes(title_text="predicted work (1e9 pairs x heads)")
    fig.update_yaxes(title_text="compute-only ms", col=1)
    summary = "; ".join(
        f"{fit.phase}: r = {_fmt_r(fit.correlation)}, largest error {fit.max_error * 100:.0f}%"
        for fit in fits
    )
    _base_layout(
        fig,
        f"Packed documents: measured per-rank compute vs predicted work ({summary})",
        max(FIGURE_HEIGHT, 300 * nrows + 140),
    )
    return fig


def heatmap_phase(frame: pd.DataFrame) -> str | None:
    """The phase the U x R heatmaps show: fwd+bwd when measured, else the first phase."""
    phases = phases_of(plot_rows(frame, "median_s"))
    if not phases:
        return None
    return "fwd+bwd" if "fwd+bwd" in phases else phases[0]


def heatmap_figure(frame: pd.DataFrame) -> go.Figure | None:
    """One U x R heatmap of the median step time per sequence length (and workload variant,
    when several are measured): the fastest layout of each cell, named in the cell, for the
    phase `heatmap_phase` picks. The colour is the time relative to the fastest mesh of the
    same map (1 = fastest), on one shared scale."""
    phase = heatmap_phase(frame)
    if phase is None:
        return None
    rows = plot_rows(frame, "median_s", "seq_len", "ulysses", "ring")
    rows = rows[(rows["phase"] == phase) & (rows["median_s"] > 0)]
    maps = sorted({(str(v), int(n)) for v, n in zip(rows["variant"], rows["seq_len"], strict=True)})
    maps = maps[-MAX_HEATMAPS:]
    if not maps:
        return None
    us = sorted({int(u) for u in rows["ulysses"]})
    rs = sorted({int(r) for r in rows["ring"]})
    cols = min(len(maps), 4)
    nrows = math.ceil(len(maps) / cols)
    fig = make_subplots(
        rows=nrows,
        cols=cols,
        subplot_titles=[f"{v} L={format_seq_len(n)}".strip() for v, n in maps],
        horizontal_spacing=0.07,
        vertical_spacing=0.2 if nrows > 1 else 0.1,
    )
    for i, (variant, n) in enumerate(maps):
        sub = rows[(rows["seq_len"] == n) & (rows["variant"] == variant)]
        fastest = float(sub["median_s"].min())
        z: list[list[float | None]] = []
        text: list[list[str]] = []
        for u in us:
            zrow: list[float | None] = []
            trow: list[str] = []
            for r in rs:
                cell = sub[(sub["ulysses"] == u) & (sub["ring"] == r)]
                if cell.empty:
                    zrow.append(None)
                    trow.append("")
                    continue
                best = cell.loc[cell["median_s"].idxmin()]
                zrow.append(float(best["median_s"]) / fastest)
                trow.append(
                    f"{float(best['median_s']) * 1e3:.3g} ms<br>{best['layout']}"
                    f"<br>{float(best['median_s']) / fastest:.2f}x"
                )
            z.append(zrow)
            text.append(trow)
        fig.add_trace(
            go.Heatmap(
                x=[f"R={r}" for r in rs],
                y=[f"U={u}" for u in us],
                z=z,
                text=text,
                texttemplate="%{text}",
                coloraxis="coloraxis",
                hoverongaps=False,
                name=f"{variant} L={format_seq_len(n)}".strip(),
                hovertemplate="%{y} x %{x}<br>%{text}<extra></extra>",
            ),
            row=i // cols + 1,
            col=i % cols + 1,
        )
    _base_layout(
        fig,
        f"Step time over the U x R mesh, phase {phase} (fastest layout per cell; colour = "
        "time / fastest mesh at that length, darker = faster)",
        max(340, 300 * nrows + 100),
    )
    fig.update_layout(
        coloraxis={
            "colorscale": "Viridis",
            "cmin": 1.0,
            "colorbar": {"title": {"text": "x fastest"}, "thickness": 14},
        }
    )
    return fig


def prediction_figure(frame: pd.DataFrame) -> go.Figure | None:
    """Predicted (`predicted_s` column, from the cost model) vs measured median step time,
    log-log with the diagonal, and the relative error per configuration."""
    if "predicted_s" not in frame:
        return None
    rows = plot_rows(frame, "median_s", "predicted_s")
    rows = rows[(rows["median_s"] > 0) & (rows["predicted_s"] > 0)]
    if rows.empty:
        return None
    rows = rows.copy()
    rows["error"] = rows["predicted_s"] / rows["median_s"] - 1.0
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.45, 0.55],
        subplot_titles=["predicted vs measured", "error (predicted / measured - 1)"],
        horizontal_spacing=0.1,
    )
    colors = _mesh_colors(rows)
    lo = min(rows["median_s"].min(), rows["predicted_s"].min()) * 1e3
    hi = max(rows["median_s"].max(), rows["predicted_s"].max()) * 1e3
    fig.add_trace(
        go.Scatter(
            x=[lo * 0.8, hi * 1.25],
            y=[lo * 0.8, hi * 1.25],
            mode="lines",
            name="predicted = measured",
            line={"color": "#999", "dash": "dot", "width": 1},
            hoverinfo="skip",
        ),
        row=1,
        col=1,
    )
    for mesh in mesh_order(rows):
        sub = rows[rows["mesh"] == mesh]
        fig.add_trace(
            go.Scatter(
                x=_values(sub["median_s"] * 1e3),
                y=_values(sub["predicted_s"] * 1e3),
                mode="markers",
                name=mesh,
                legendgroup=mesh,
                marker={"color": colors[mesh], "size": 8},
                customdata=[
                    f"{_config_label(r, True)} ({r.error * 100:+.0f}%)"
                    for r in sub.itertuples(index=False)
                ],
                hovertemplate=(
                    "measured %{x:.4g} ms<br>predicted %{y:.4g} ms<br>%{customdata}<extra></extra>"
                ),
            ),
            row=1,
            col=1,
        )
    ordered = rows.sort_values("error")
    fig.add_trace(
        go.Bar(
            x=[_config_label(r, True) for r in ordered.itertuples(index=False)],
            y=_values(ordered["error"] * 100),
            marker_color=[MISMATCH_COLOR if abs(e) > 0.5 else "#7f7f7f" for e in ordered["error"]],
            name="error %",
            showlegend=False,
            hovertemplate="%{x}<br>%{y:+.1f}%<extra></extra>",
        ),
        row=1,
        col=2,
    )
    axis = log_ticks([lo, hi]) if _log_wanted([lo, hi]) else {}
    fig.update_xaxes(title_text="measured (ms)", row=1, col=1, **axis)
    fig.update_yaxes(title_text="predicted (ms)", row=1, col=1, **axis)
    fig.update_xaxes(tickangle=-45, tickfont={"size": 9}, row=1, col=2)
    fig.update_yaxes(title_text="error %", row=1, col=2)
    median_err = float(rows["error"].abs().median())
    _base_layout(
        fig,
        f"Cost model: predicted vs measured step time (median |error| {median_err * 100:.0f}%)",
        480,
    )
    return fig


# -------------------------------------------------------------------------------- comparison


def compare_figure(compared: pd.DataFrame, threshold: float = 0.05) -> go.Figure | None:
    """Horizontal bars of after/before per configuration present on both sides; slower than
    1 + threshold in red, faster than 1 - threshold in green."""
    rows = escaped(compared[compared["ratio"].notna()])
    if rows.empty:
        return None
    labels = [
        f"{r.mesh} {r.layout} {format_seq_len(r.seq_len)} {r.phase}"
        if _value(r.seq_len) is not None
        else str(r.id)
        for r in rows.itertuples(index=False)
    ]
    ratios = [float(v) for v in rows["ratio"]]
    if "verdict" in rows:  # the statistical verdict (cpbench.results.frame.compare_frame)
        colors = [
            {"slower": MISMATCH_COLOR, "faster": "#2ca02c"}.get(str(v), "#7f7f7f")
            for v in rows["verdict"]
        ]
    else:
        colors = [
            MISMATCH_COLOR if v > 1 + threshold else ("#2ca02c" if v < 1 - threshold else "#7f7f7f")
            for v in ratios
        ]
    fig = go.Figure(
        go.Bar(
            y=labels,
            x=ratios,
            orientation="h",
            marker_color=colors,
            customdata=[
                [b * 1e3, a * 1e3, i]
                for b, a, i in zip(rows["before_s"], rows["after_s"], rows["id"], strict=True)
            ],
            text=[f"{v:.2f}x" for v in ratios],
            textposition="outside",
            name="after / before",
            hovertemplate=(
                "%{y}<br>before %{customdata[0]:.4g} ms<br>after %{customdata[1]:.4g} ms"
                "<br>after/before %{x:.3f}<br>%{customdata[2]}<extra></extra>"
            ),
        )
    )
    fig.add_vline(x=1.0, line_dash="dot", line_color="#444")
    _base_layout(
        fig,
        "Step time after / before (below 1 = faster; red = significantly slower, green = "
        "significantly faster: 95% intervals apart)",
        max(300, 26 * len(rows) + 140),
    )
    fig.update_xaxes(title_text="after / before", range=[0, max(1.2, max(ratios) * 1.15)])
    fig.update_yaxes(autorange="reversed", tickfont={"size": 10})
    fig.update_layout(margin={"l": 220})
    return fig
