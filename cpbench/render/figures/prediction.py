"""The cost model against the measurements: predicted vs measured step time and the error."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from cpbench.render.figures import common


def prediction_figure(frame: pd.DataFrame) -> go.Figure | None:
    """Predicted (`predicted_s` column, from the cost model) vs measured median step time,
    log-log with the diagonal, and the relative error per configuration."""
    if "predicted_s" not in frame:
        return None
    rows = common.plot_rows(frame, "median_s", "predicted_s")
    rows = rows[(rows["median_s"] > 0) & (rows["predicted_s"] > 0)]
    if rows.empty:
        return None
    rows = rows.copy()
    rows["error"] = rows["predicted_s"] / rows["median_s"] - 1.0
    titles = ["predicted vs measured", "error (predicted / measured - 1)"]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.45, 0.55], subplot_titles=titles,
                        horizontal_spacing=0.1)
    colors = common.mesh_colors(rows)
    lo = min(rows["median_s"].min(), rows["predicted_s"].min()) * 1e3
    hi = max(rows["median_s"].max(), rows["predicted_s"].max()) * 1e3
    fig.add_trace(common.diagonal(lo, hi, "predicted = measured"), row=1, col=1)
    for mesh in common.mesh_order(rows):
        sub = rows[rows["mesh"] == mesh]
        points = go.Scatter(
            x=common.plain_values(sub["median_s"] * 1e3),
            y=common.plain_values(sub["predicted_s"] * 1e3),
            mode="markers", name=mesh, legendgroup=mesh,
            marker={"color": colors[mesh], "size": 8},
            customdata=[
                f"{common.config_label(r, True)} ({r.error * 100:+.0f}%)"
                for r in sub.itertuples(index=False)
            ],
            hovertemplate="measured %{x:.4g} ms<br>predicted %{y:.4g} ms<br>%{customdata}"
            "<extra></extra>",
        )
        fig.add_trace(points, row=1, col=1)
    ordered = rows.sort_values("error")
    errors = go.Bar(
        x=[common.config_label(r, True) for r in ordered.itertuples(index=False)],
        y=common.plain_values(ordered["error"] * 100),
        marker_color=[common.MISMATCH_COLOR if abs(e) > 0.5 else "#7f7f7f" for e in ordered["error"]],
        name="error %", showlegend=False, hovertemplate="%{x}<br>%{y:+.1f}%<extra></extra>",
    )
    fig.add_trace(errors, row=1, col=2)
    axis = common.log_ticks([lo, hi]) if common.log_wanted([lo, hi]) else {}
    fig.update_xaxes(title_text="measured (ms)", row=1, col=1, **axis)
    fig.update_yaxes(title_text="predicted (ms)", row=1, col=1, **axis)
    fig.update_xaxes(tickangle=-45, tickfont={"size": 9}, row=1, col=2)
    fig.update_yaxes(title_text="error %", row=1, col=2)
    median_err = float(rows["error"].abs().median())
    title = f"Cost model: predicted vs measured step time (median |error| {median_err * 100:.0f}%)"
    common.base_layout(fig, title, 480)
    return fig
