"""A before/after comparison: after / before step time per configuration."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from cpbench.render.figures import common
from cpbench.results.frame import value


def compare_figure(compared: pd.DataFrame, threshold: float = 0.05) -> go.Figure | None:
    """Horizontal bars of after/before per configuration present on both sides; slower than
    1 + threshold in red, faster than 1 - threshold in green."""
    rows = common.escaped(compared[compared["ratio"].notna()])
    if rows.empty:
        return None
    labels = [
        f"{r.mesh} {r.layout} {common.format_seq_len(r.seq_len)} {r.phase}"
        if value(r.seq_len) is not None
        else str(r.id)
        for r in rows.itertuples(index=False)
    ]
    ratios = [float(v) for v in rows["ratio"]]
    if "verdict" in rows:  # the statistical verdict (cpbench.results.frame.compare_frame)
        colors = [
            {"slower": common.MISMATCH_COLOR, "faster": "#2ca02c"}.get(str(v), "#7f7f7f")
            for v in rows["verdict"]
        ]
    else:
        colors = [
            common.MISMATCH_COLOR if v > 1 + threshold
            else ("#2ca02c" if v < 1 - threshold else "#7f7f7f")
            for v in ratios
        ]
    bars = go.Bar(
        y=labels, x=ratios, orientation="h", marker_color=colors,
        customdata=[
            [b * 1e3, a * 1e3, i]
            for b, a, i in zip(rows["before_s"], rows["after_s"], rows["id"], strict=True)
        ],
        text=[f"{v:.2f}x" for v in ratios], textposition="outside", name="after / before",
        hovertemplate="%{y}<br>before %{customdata[0]:.4g} ms<br>after %{customdata[1]:.4g} ms"
        "<br>after/before %{x:.3f}<br>%{customdata[2]}<extra></extra>",
    )
    fig = go.Figure(bars)
    fig.add_vline(x=1.0, line_dash="dot", line_color="#444")
    title = (
        "Step time after / before (below 1 = faster; red = significantly slower, green = "
        "significantly faster: 95% intervals apart)"
    )
    common.base_layout(fig, title, max(300, 26 * len(rows) + 140))
    fig.update_xaxes(title_text="after / before", range=[0, max(1.2, max(ratios) * 1.15)])
    fig.update_yaxes(autorange="reversed", tickfont={"size": 10})
    fig.update_layout(margin={"l": 220})
    return fig
