"""The report's inference figures, from `cpbench.app.report.inference.inference_frame`: time to
first token against the prompt per scheme, decode latency per token against the CP degree,
and the KV cache a rank holds (measured tensors against the model) against the context."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from cpbench.render.figures import common

SCHEME_COLOR = {"pass_kv": "#1f77b4", "pass_q": "#ff7f0e", "all_gather": "#2ca02c",
                "ulysses": "#9467bd", "contiguous": "#d62728", "interleaved": "#17becf"}  # fmt: skip
"""One colour per prefill scheme and decode cache layout."""
CACHE_DASH = ("solid", "dash", "dot", "dashdot", "longdash")
"""One dash per cached length (prefill) or batch (decode), in order."""


def _ok(frame: pd.DataFrame | None, phase: str | None, column: str) -> pd.DataFrame:
    if frame is None or frame.empty:
        return pd.DataFrame()
    rows = frame[(frame["status"] == "ok") & frame[column].notna()]
    return rows if phase is None else rows[rows["phase"] == phase]


SHAPE_KEYS = ("world_size", "batch", "heads", "kv_heads", "head_dim", "dtype", "device")
"""What else tells two records apart: a line never mixes records that differ in one of these."""


def _lines(
    rows: pd.DataFrame, x: str, y: str, series: tuple[str, ...], scale: float
) -> list[go.Scatter]:
    """One line per distinct (how, the series keys, `SHAPE_KEYS` but `x`), x sorted, y = median
    of `y` x `scale` over the repeats of one point; coloured by how, dashed by the second key,
    named by how, the second key and every other key whose value differs between lines."""
    keys = [k for k in (*series, *SHAPE_KEYS) if k != x and k in rows]
    varying = [k for k in keys[2:] if rows[k].nunique(dropna=False) > 1]
    second = sorted(rows[series[1]].dropna().unique().tolist())
    traces = []
    for values, g in rows.groupby(keys, sort=True, dropna=False):
        by_key = dict(zip(keys, values, strict=True))
        per_x = g.groupby(x)[y].median().sort_index()
        name = " ".join(
            [str(by_key[series[0]])]
            + [f"{k.replace('_', ' ')} {by_key[k]}" for k in (series[1], *varying)]
        )
        line = {"color": SCHEME_COLOR.get(str(by_key[series[0]]), "#444"),
                "dash": CACHE_DASH[second.index(by_key[series[1]]) % len(CACHE_DASH)]}
        traces.append(go.Scatter(x=[int(v) for v in per_x.index],
                                 y=common.plain_values(per_x * scale), mode="lines+markers",
                                 name=name, line=line))
    return traces


def ttft_figure(frame: pd.DataFrame | None) -> go.Figure | None:
    """TTFT (ms, median over iterations of the slowest rank) against new tokens T, one line
    per scheme and cached length P."""
    rows = _ok(frame, "prefill", "ttft_s")
    if rows.empty:
        return None
    fig = go.Figure(_lines(rows, "new_tokens", "ttft_s", ("how", "cached_len"), 1e3))
    common.base_layout(fig, "Time to first token by scheme")
    fig.update_xaxes(title_text="new tokens T (prompt)", **common.log_ticks(rows["new_tokens"]))
    fig.update_yaxes(title_text="TTFT (ms per prefill)")
    common.y_scale(fig, rows["ttft_s"] * 1e3, None)
    return fig


def decode_latency_figure(frame: pd.DataFrame | None) -> go.Figure | None:
    """Per-token decode latency (ms: step / T) against the CP degree W, one line per cache
    layout and batch."""
    rows = _ok(frame, "decode", "per_token_latency_s")
    if rows.empty:
        return None
    fig = go.Figure(_lines(rows, "world_size", "per_token_latency_s", ("how", "batch", "new_tokens"), 1e3))
    common.base_layout(fig, "Decode latency per token by CP degree")
    fig.update_xaxes(title_text="CP degree W (ranks)", type="linear", dtick=1)
    fig.update_yaxes(title_text="latency (ms per token)")
    common.y_scale(fig, rows["per_token_latency_s"] * 1e3, None)
    return fig


def kv_capacity_figure(frame: pd.DataFrame | None) -> go.Figure | None:
    """KV-cache bytes a rank holds (one layer: K and V) against the context P + T: the measured
    tensors (markers, max over ranks) and the model's ceil(N / W) tokens (dashed), per W and
    batch B."""
    rows = _ok(frame, None, "kv_cache_bytes_measured")
    if rows.empty:
        return None
    unit, size = "KiB", 1024.0
    if rows["kv_cache_bytes_measured"].max() >= 2**20:
        unit, size = "MiB", 2.0**20
    fig = go.Figure()
    for i, ((world, batch), g) in enumerate(rows.groupby(["world_size", "batch"], sort=True)):
        columns = ["kv_cache_bytes_measured", "kv_cache_bytes_analytic"]
        per = g.groupby("context")[columns].max().sort_index()
        color = common.PALETTE[i % len(common.PALETTE)]
        x = [int(v) for v in per.index]
        fig.add_trace(go.Scatter(x=x, y=common.plain_values(per["kv_cache_bytes_measured"] / size),
                                 mode="markers", name=f"W {world} B {batch} measured",
                                 marker={"color": color, "size": 9}))  # fmt: skip
        fig.add_trace(go.Scatter(x=x, y=common.plain_values(per["kv_cache_bytes_analytic"] / size),
                                 mode="lines", name=f"W {world} B {batch} analytic",
                                 line={"color": color, "dash": "dash"}))  # fmt: skip
    common.base_layout(fig, "KV cache per rank (one layer)")
    fig.update_xaxes(title_text="context P + T (tokens)", **common.log_ticks(rows["context"]))
    fig.update_yaxes(title_text=f"KV-cache bytes per rank ({unit})")
    return fig
