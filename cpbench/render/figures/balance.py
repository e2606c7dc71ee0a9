"""Load balance: per-rank time of each causal layout, and with packed documents each rank's
measured compute against the model's predicted work."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pandas as pd
import plotly.graph_objects as go

from cpbench.render.figures import common
from cpbench.results.frame import phases_of

if TYPE_CHECKING:
    from cpbench.app.report.work import WorkFit


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
    rows = common.plot_rows(frame, "seq_len")
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
    meshes = common.mesh_order(rows)
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
    facets = facets[:common.MAX_BALANCE_FACETS]
    titles = [f"{t} L={common.format_seq_len(n)}" for t, n, _ in facets]
    fig, nrows, cols = common.facet_grid(titles, vertical=0.18, horizontal=0.06)
    shown: set[str] = set()
    for i, (_title, _n, sub) in enumerate(facets):
        r, c = i // cols + 1, i % cols + 1
        for layout in common.layout_order(sub["layout"]):
            # one record per layout (sources beyond the first are not stacked)
            rec = next(sub[sub["layout"] == layout].itertuples(index=False))
            values = list(getattr(rec, column))
            mean = sum(values) / len(values)
            imbalance = max(values) / mean if mean > 0 else float("nan")
            name = str(layout)
            hover = f"{name}<br>%{{x}}: %{{y:.4g}} ms<br>max/mean {imbalance:.2f}<extra></extra>"
            bar = go.Bar(x=[f"rank {k}" for k in range(len(values))], y=[v * 1e3 for v in values],
                         name=name, legendgroup=name, showlegend=name not in shown,
                         marker_color=common.LAYOUT_COLOR.get(name, "#7f7f7f"),
                         hovertemplate=hover)
            fig.add_trace(bar, row=r, col=c)
            shown.add(name)
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="ms", col=1)
    title = f"Causal load balance: {what} (the slowest rank sets the step)"
    common.base_layout(fig, title, max(common.FIGURE_HEIGHT, 300 * nrows + 120))
    return fig


def _fmt_r(r: float | None) -> str:
    return "n/a" if r is None else f"{r:.3f}"


def work_balance_figure(fits: Sequence[WorkFit]) -> go.Figure | None:
    """Packed documents: each rank's measured compute-only time (ms) against the model's
    per-rank work (attended pairs x B x heads, in units of 1e9), one facet per layout (and
    phase), one marker shape per mesh; the least-squares line over all layouts of the phase in
    every facet. Facet titles give the layout's correlation and the padding it paid."""
    facets: list[tuple[WorkFit, str]] = []
    for fit in fits:
        for layout in common.layout_order(fit.points["layout"]):
            facets.append((fit, layout))
    if not facets:
        return None
    facets = facets[:common.MAX_BALANCE_FACETS]
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
    fig, nrows, cols = common.facet_grid(titles, vertical=0.2, horizontal=0.07, one_row=0.12)
    meshes = sorted({str(m) for fit, _ in facets for m in fit.points["mesh"]})
    symbols = {m: common.SYMBOLS[i % len(common.SYMBOLS)] for i, m in enumerate(meshes)}
    shown: set[str] = set()
    for i, (fit, layout) in enumerate(facets):
        r, c = i // cols + 1, i % cols + 1
        pts = common.escaped(fit.points[fit.points["layout"] == layout])
        for mesh in sorted(set(pts["mesh"])):
            sub, name = pts[pts["mesh"] == mesh], str(mesh)
            marker = {"symbol": symbols.get(html.unescape(name), "circle"), "size": 9,
                      "color": common.LAYOUT_COLOR.get(layout, "#7f7f7f")}
            points = go.Scatter(
                x=common.plain_values(sub["work"] / 1e9),
                y=common.plain_values(sub["compute_s"] * 1e3),
                mode="markers", name=name, legendgroup=name, showlegend=name not in shown,
                marker=marker,
                customdata=[
                    f"{rec.mesh} rank {rec.rank} ({rec.error * 100:+.0f}% from the line)"
                    for rec in sub.itertuples(index=False)
                ],
                hovertemplate="work %{x:.4g} G pair-heads<br>compute %{y:.4g} ms<br>"
                "%{customdata}<extra></extra>",
            )
            fig.add_trace(points, row=r, col=c)
            shown.add(name)
        lo, hi = float(fit.points["work"].min()), float(fit.points["work"].max())
        group = f"fit {fit.phase}"
        line = go.Scatter(
            x=[lo / 1e9, hi / 1e9], y=[(fit.slope_s * w + fit.intercept_s) * 1e3 for w in (lo, hi)],
            mode="lines", name=f"fit ({fit.phase})", legendgroup=group,
            showlegend=group not in shown, line=common.REFERENCE_LINE, hoverinfo="skip",
        )
        fig.add_trace(line, row=r, col=c)
        shown.add(group)
    fig.update_xaxes(title_text="predicted work (1e9 pairs x heads)")
    fig.update_yaxes(title_text="compute-only ms", col=1)
    summary = "; ".join(
        f"{fit.phase}: r = {_fmt_r(fit.correlation)}, largest error {fit.max_error * 100:.0f}%"
        for fit in fits
    )
    title = f"Packed documents: measured per-rank compute vs predicted work ({summary})"
    common.base_layout(fig, title, max(common.FIGURE_HEIGHT, 300 * nrows + 140))
    return fig
