"""Communication: measured against analytic bytes per rank, and how much of it compute hides
(compute + exposed communication = step)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from cpbench.render.figures import common
from cpbench.results.frame import phases_of, value


def comm_bytes_figure(frame: pd.DataFrame) -> go.Figure | None:
    """Measured (max over ranks) against analytic bytes per rank, a marker per configuration
    and direction, the diagonal where they agree, a mismatch a large red cross. External
    implementations are their own series and never a mismatch (the model is cpbench's)."""
    rows = common.plot_rows(frame)
    points = []
    for direction in ("fwd", "bwd"):
        a, m = f"analytic_{direction}_bytes", f"measured_{direction}_bytes"
        flag = f"comm_{direction}_mismatch"
        if a not in rows or m not in rows:
            continue
        sub = rows[rows[a].notna() & rows[m].notna() & ((rows[a] > 0) | (rows[m] > 0))]
        for rec in sub.itertuples(index=False):
            impl = value(getattr(rec, "impl", None)) or "cpbench"
            analytic, measured = float(getattr(rec, a)), float(getattr(rec, m))
            differs = value(getattr(rec, flag, None))
            if differs is None:
                differs = analytic != measured
            record_level = bool(value(rec.comm_mismatch)) and not (
                value(rec.comm_fwd_mismatch) or value(rec.comm_bwd_mismatch)
            )
            external = impl != "cpbench"
            points.append({
                "direction": direction,
                "scheme": rec.scheme if not external else f"{impl} ({rec.scheme})",
                "analytic": analytic,
                "measured": measured,
                "mismatch": not external and (bool(differs) or record_level),
                "id": rec.id,
            })
    if not points:
        return None
    pts = pd.DataFrame(points)
    fig = go.Figure()
    positive = [v for v in [*pts["analytic"], *pts["measured"]] if v > 0]
    lo, hi = min(positive), max(positive)
    fig.add_trace(common.diagonal(lo, hi, "measured = analytic"))
    symbols = {"fwd": "circle", "bwd": "diamond"}
    schemes = sorted({str(s) for s in pts["scheme"]})
    for i, scheme in enumerate(schemes):
        for direction in ("fwd", "bwd"):
            sub = pts[
                (pts["scheme"] == scheme) & (pts["direction"] == direction) & ~pts["mismatch"]
            ]
            if sub.empty:
                continue
            marker = {"color": common.PALETTE[i % len(common.PALETTE)],
                      "symbol": symbols[direction], "size": 9, "opacity": 0.8}
            fig.add_trace(_bytes_points(sub, f"{scheme} {direction}", marker, list(sub["id"]),
                                        f"{scheme} {direction}"))
    bad = pts[pts["mismatch"]]
    if not bad.empty:
        marker = {"color": common.MISMATCH_COLOR, "symbol": "x", "size": 16,
                  "line": {"width": 1, "color": "#600"}}
        ids = [
            f"{r.id} ({r.direction}: {r.measured - r.analytic:+,.0f} B)"
            for r in bad.itertuples(index=False)
        ]
        fig.add_trace(_bytes_points(bad, "MISMATCH", marker, ids, "<b>analytic != measured</b>"))
    title = "Communication per rank: analytic vs measured bytes"
    if not bad.empty:
        title += f" — <span style='color:{common.MISMATCH_COLOR}'>{len(bad)} mismatch(es)</span>"
    common.base_layout(fig, title)
    axis = {}
    if common.log_wanted(positive, 4):
        axis = common.log_ticks(positive, common.format_bytes_short, base2=True)
    fig.update_xaxes(title_text="analytic bytes per rank", **axis)
    fig.update_yaxes(title_text="measured bytes (max over ranks)", **axis)
    return fig


def _bytes_points(
    pts: pd.DataFrame, name: str, marker: dict[str, Any], ids: list[str], what: str
) -> go.Scatter:
    """Markers of measured against analytic bytes, hovering `what`, the bytes and `ids`."""
    return go.Scatter(
        x=list(pts["analytic"]), y=list(pts["measured"]), mode="markers", name=name,
        marker=marker, customdata=ids,
        hovertemplate=f"{what}<br>analytic %{{x:,}} B<br>measured %{{y:,}} B<br>%{{customdata}}"
        "<extra></extra>",
    )


def overlap_figure(frame: pd.DataFrame) -> go.Figure | None:
    """Per configuration: compute-only time and exposed communication stacked (their sum is
    the step), with the overlap fraction (right axis) as markers; one row per phase."""
    rows = common.plot_rows(frame, "compute_only_s", "seq_len")
    rows = rows[rows["exposed_comm_s"].notna() | rows["median_s"].notna()]
    if rows.empty:
        return None
    phases = phases_of(rows)
    fig = make_subplots(rows=len(phases), cols=1, subplot_titles=[f"phase {p}" for p in phases],
                        specs=[[{"secondary_y": True}] for _ in phases],
                        vertical_spacing=0.22 if len(phases) > 1 else 0.1)
    meshes = common.mesh_order(rows)
    for r, phase in enumerate(phases, start=1):
        sub = rows[rows["phase"] == phase].copy()
        sub["_m"] = [meshes.index(m) if m in meshes else 99 for m in sub["mesh"]]
        order = common.LAYOUT_ORDER
        sub["_l"] = [order.index(x) if x in order else 9 for x in sub["layout"]]
        sub = sub.sort_values(["_m", "_l", "variant", "seq_len"])
        labels = [common.config_label(rec) for rec in sub.itertuples(index=False)]
        if common.multi_source(rows):
            labels = [f"{lab} [{s}]" for lab, s in zip(labels, sub["source"], strict=True)]
        exposed = [
            value(e) if value(e) is not None else max(0.0, float(m) - float(c))
            for e, m, c in zip(
                sub["exposed_comm_s"], sub["median_s"], sub["compute_only_s"], strict=True
            )
        ]
        first = r == 1
        bars = (
            ("compute", "compute (no communication)", "compute", common.COMPUTE_COLOR,
             common.plain_values(sub["compute_only_s"] * 1e3)),
            ("exposed", "exposed communication", "exposed comm", common.EXPOSED_COLOR,
             [None if e is None else e * 1e3 for e in exposed]),
        )
        for group, name, what, color, ms in bars:
            bar = go.Bar(x=labels, y=ms, name=name, legendgroup=group, showlegend=first,
                         marker_color=color,
                         hovertemplate=f"%{{x}}<br>{what} %{{y:.4g}} ms<extra></extra>")
            fig.add_trace(bar, row=r, col=1)
        overlap = common.plain_values(sub["overlap"] * 100)
        if any(v is not None for v in overlap):
            marker = {"color": common.OVERLAP_COLOR, "symbol": "diamond", "size": 9}
            points = go.Scatter(x=labels, y=overlap, mode="markers",
                                name="overlap fraction (right axis)", legendgroup="overlap",
                                showlegend=first, marker=marker,
                                hovertemplate="%{x}<br>overlap %{y:.0f}%<extra></extra>")
            fig.add_trace(points, row=r, col=1, secondary_y=True)
        fig.update_yaxes(title_text="time (ms)", row=r, col=1, secondary_y=False)
        fig.update_yaxes(title_text="overlap %", range=[0, 105], tickvals=[0, 25, 50, 75, 100],
                         ticksuffix="%", row=r, col=1, secondary_y=True, showgrid=False)
    fig.update_layout(barmode="stack")
    fig.update_xaxes(tickangle=-45, tickfont={"size": 10})
    title = "Overlap: compute + exposed communication = step time"
    common.base_layout(fig, title, max(common.FIGURE_HEIGHT, 330 * len(phases) + 120))
    return fig
