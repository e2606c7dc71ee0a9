"""Peak memory per rank, measured against the analytic lower bound."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from cpbench.render.figures import common
from cpbench.results.frame import phases_of, value


def _bytes_unit(values: Iterable[Any]) -> tuple[str, float]:
    nums = [float(v) for v in values if value(v) is not None]
    top = max(nums) if nums else 0.0
    for unit, size in (("GiB", 1024.0**3), ("MiB", 1024.0**2), ("KiB", 1024.0)):
        if top >= size:
            return unit, size
    return "B", 1.0


def memory_figure(frame: pd.DataFrame) -> go.Figure | None:
    """Peak memory per rank (max over ranks and layouts) vs sequence length per mesh, solid,
    with the analytic lower bound of `cpbench.model.memory` dashed in the same colour."""
    rows = common.plot_rows(frame, "seq_len")
    rows = rows[rows["peak_bytes"].notna() | rows["analytic_peak_bytes"].notna()]
    if rows.empty:
        return None
    unit, size = _bytes_unit([*rows["peak_bytes"], *rows["analytic_peak_bytes"]])
    phases = phases_of(rows)
    fig = common.phase_facets(phases)
    colors = common.mesh_colors(rows)
    symbols = common.variant_symbols(rows)
    keys = common.series_keys(rows, ("mesh",))
    shown: set[str] = set()
    for col, phase in enumerate(phases, start=1):
        sub = rows[rows["phase"] == phase]
        for key, g in sub.groupby(keys, dropna=False, sort=False):
            key = key if isinstance(key, tuple) else (key,)
            name = common.series_name(key, keys)
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
                line = go.Scatter(
                    x=[int(v) for v in series.index], y=common.plain_values(series / size),
                    mode="lines+markers" if what == "measured" else "lines", name=label,
                    legendgroup=label, showlegend=label not in shown,
                    line={"color": color, "dash": dash}, marker={"size": 7, "symbol": symbol},
                    hovertemplate=f"{label} ({phase})<br>L=%{{x}}<br>%{{y:.4g}} {unit}"
                    "<extra></extra>",
                )
                fig.add_trace(line, row=1, col=col)
                shown.add(label)
    title = "Peak memory per rank: measured (solid) vs analytic lower bound (dashed)"
    common.base_layout(fig, title)
    common.seq_axis(fig, rows["seq_len"])
    both = [*rows["peak_bytes"], *rows["analytic_peak_bytes"]]
    if common.log_wanted(both):
        fig.update_yaxes(**common.log_ticks([v / size for v in both if value(v) is not None]))
    fig.update_yaxes(title_text=f"peak per rank ({unit})", col=1)
    return fig
