"""Time and throughput: step time, achieved TFLOP/s, bus bandwidth over the sequence length, and
the step time over the U x R mesh (heatmaps)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from cpbench.render.figures import common
from cpbench.results.frame import phases_of


def step_time_figure(frame: pd.DataFrame) -> go.Figure | None:
    """Median step time (p10-p90 as error bars) vs sequence length, per mesh and layout, one
    facet per phase; log axes when the values span a wide range."""
    rows = common.plot_rows(frame, "median_s", "seq_len")
    if rows.empty:
        return None
    lo_hi = (
        ("p10_s", "p90_s") if rows["p10_s"].notna().all() and rows["p90_s"].notna().all() else None
    )
    title = "Step time vs sequence length (median, p10-p90 bars)"
    return common.line_facets(rows, "median_s", title=title, y_title="step time (ms)", scale=1e3,
                              hover_unit="ms", error_cols=lo_hi)


def throughput_figure(frame: pd.DataFrame) -> go.Figure | None:
    """Achieved TFLOP/s vs sequence length; with a `peak_fraction` column (achieved / the
    hardware profile's peak of all ranks) a second row shows the fraction of peak."""
    rows = common.plot_rows(frame, "achieved_tflops", "seq_len")
    if rows.empty:
        return None
    title = "Achieved attention TFLOP/s (all ranks)"
    if "peak_fraction" not in rows or rows["peak_fraction"].notna().sum() == 0:
        return common.line_facets(rows, "achieved_tflops", title=title, y_title="TFLOP/s",
                                  hover_unit="TFLOP/s", log_y=False)
    phases = phases_of(rows)
    titles = [f"phase {p}: TFLOP/s" for p in phases]
    titles += [f"phase {p}: % of hardware peak" for p in phases]
    fig = make_subplots(rows=2, cols=len(phases), subplot_titles=titles, vertical_spacing=0.14,
                        horizontal_spacing=0.08)
    tflops, cols = common.line_traces(rows, "achieved_tflops", phases, hover_unit="TFLOP/s")
    fig.add_traces(tflops, rows=[1] * len(tflops), cols=cols)
    known = rows[rows["peak_fraction"].notna()]
    frac, cols = common.line_traces(
        known, "peak_fraction", phases, scale=100.0, hover_unit="% of peak", legend=False
    )
    fig.add_traces(frac, rows=[2] * len(frac), cols=cols)
    common.base_layout(fig, "Achieved attention TFLOP/s and fraction of the hardware peak", 640)
    common.seq_axis(fig, rows["seq_len"])
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(title_text="TFLOP/s", row=1, col=1)
    fig.update_yaxes(title_text="% of peak", row=2, col=1)
    return fig


def bandwidth_figure(frame: pd.DataFrame) -> go.Figure | None:
    """Achieved bus bandwidth (nccl-tests busbw: bytes a rank sends / communication-only time) vs
    sequence length, per mesh and layout, one facet per phase."""
    rows = common.plot_rows(frame, "busbw_GBps", "seq_len")
    rows = rows[rows["busbw_GBps"] > 0]
    if rows.empty:
        return None
    title = (
        "Achieved communication bandwidth (nccl-tests busbw per rank: bytes sent / comm-only time)"
    )
    return common.line_facets(rows, "busbw_GBps", title=title, y_title="GB/s", hover_unit="GB/s")


def heatmap_phase(frame: pd.DataFrame) -> str | None:
    """The phase the U x R heatmaps show: fwd+bwd when measured, else the first phase."""
    phases = phases_of(common.plot_rows(frame, "median_s"))
    if not phases:
        return None
    return "fwd+bwd" if "fwd+bwd" in phases else phases[0]


def _cell_text(seconds: float, layout: str, fastest: float) -> str:
    """A heatmap cell: the mesh's fastest time, its layout and its ratio to the fastest mesh."""
    return f"{seconds * 1e3:.3g} ms<br>{layout}<br>{seconds / fastest:.2f}x"


def heatmap_figure(frame: pd.DataFrame) -> go.Figure | None:
    """One U x R heatmap of the median step time per sequence length (and workload variant,
    when several are measured): the fastest layout of each cell, named in the cell, for the
    phase `heatmap_phase` picks. The colour is the time relative to the fastest mesh of the
    same map (1 = fastest), on one shared scale."""
    phase = heatmap_phase(frame)
    if phase is None:
        return None
    rows = common.plot_rows(frame, "median_s", "seq_len", "ulysses", "ring")
    rows = rows[(rows["phase"] == phase) & (rows["median_s"] > 0)]
    maps = sorted({(str(v), int(n)) for v, n in zip(rows["variant"], rows["seq_len"], strict=True)})
    maps = maps[-common.MAX_HEATMAPS:]
    if not maps:
        return None
    us = sorted({int(u) for u in rows["ulysses"]})
    rs = sorted({int(r) for r in rows["ring"]})
    titles = [f"{v} L={common.format_seq_len(n)}".strip() for v, n in maps]
    fig, nrows, cols = common.facet_grid(titles, vertical=0.2, horizontal=0.07)
    for i, (variant, n) in enumerate(maps):
        sub = rows[(rows["seq_len"] == n) & (rows["variant"] == variant)]
        fastest = float(sub["median_s"].min())
        # the fastest layout of each mesh (the first of equal times)
        best = sub.loc[sub.groupby(["ulysses", "ring"])["median_s"].idxmin()]
        cells = {
            (int(b.ulysses), int(b.ring)): (float(b.median_s), str(b.layout))
            for b in best.itertuples()
        }
        z = [[cells[u, r][0] / fastest if (u, r) in cells else None for r in rs] for u in us]
        text = [[_cell_text(*cells[u, r], fastest) if (u, r) in cells else "" for r in rs]
                for u in us]
        heatmap = go.Heatmap(
            x=[f"R={r}" for r in rs], y=[f"U={u}" for u in us], z=z, text=text,
            texttemplate="%{text}", coloraxis="coloraxis", hoverongaps=False,
            name=f"{variant} L={common.format_seq_len(n)}".strip(),
            hovertemplate="%{y} x %{x}<br>%{text}<extra></extra>",
        )
        fig.add_trace(heatmap, row=i // cols + 1, col=i % cols + 1)
    title = (
        f"Step time over the U x R mesh, phase {phase} (fastest layout per cell; colour = "
        "time / fastest mesh at that length, darker = faster)"
    )
    common.base_layout(fig, title, max(340, 300 * nrows + 100))
    colorbar = {"title": {"text": "x fastest"}, "thickness": 14}
    fig.update_layout(coloraxis={"colorscale": "Viridis", "cmin": 1.0, "colorbar": colorbar})
    return fig
