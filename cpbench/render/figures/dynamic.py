"""The report's dynamic-CP figures, from `cpbench.app.report.dynamic.dynamic_frame`: the batch's
length histogram, each policy's per-rank load and idle time in one instrumented step, and the
measured against the predicted speedup over static CP."""

from __future__ import annotations

import html

import pandas as pd
import plotly.graph_objects as go

from cpbench.render.figures import common
from cpbench.render.text import visible

POLICY_COLOR = {"static": "#7f7f7f", "megatron": "#ff7f0e", "cpbench": "#1f77b4"}
"""One colour per policy."""
BUSY_COLOR, IDLE_COLOR = "#1f77b4", "#d9d9d9"


def _measured_rows(frame: pd.DataFrame | None) -> pd.DataFrame:
    """The measured rows, the last of each id, policy and study escaped for figure text."""
    if frame is None or frame.empty:
        return pd.DataFrame()
    rows = frame[(frame["status"] == "ok") & frame["median_s"].notna()]
    rows = rows.drop_duplicates("id", keep="last").copy()
    for col in ("policy", "study"):
        rows[col] = rows[col].map(lambda v: html.escape(visible(v)) if isinstance(v, str) else v)
    return rows


def _studies(rows: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(rows["study"]))


def _policy_label(rows: pd.DataFrame, row: pd.Series) -> str:
    """The policy, with the study's number when the frame holds several."""
    studies = _studies(rows)
    policy = str(row["policy"])
    return policy if len(studies) == 1 else f"{policy} (study {studies.index(row['study']) + 1})"


def length_histogram(frame: pd.DataFrame | None) -> go.Figure | None:
    """The batch's sequence lengths (one histogram per study)."""
    if frame is None or frame.empty:
        return None
    rows = frame[frame["lengths"].map(lambda v: isinstance(v, list) and len(v) > 0)]
    rows = rows.drop_duplicates("study", keep="last")
    if rows.empty:
        return None
    fig = go.Figure()
    for i, (_, row) in enumerate(rows.iterrows()):
        lengths = [int(v) for v in row["lengths"]]
        name = f"study {i + 1}: {len(lengths)} sequences, {sum(lengths):,} tokens"
        fig.add_trace(go.Histogram(x=lengths, name=name, nbinsx=min(40, max(5, len(lengths))),
                                   opacity=0.75 if len(rows) > 1 else 1.0,
                                   marker={"color": common.PALETTE[i % len(common.PALETTE)]}))  # fmt: skip
    common.base_layout(fig, "Sequence lengths of the batch")
    fig.update_layout(barmode="overlay", showlegend=True)
    fig.update_xaxes(title_text="sequence length (tokens)")
    fig.update_yaxes(title_text="sequences")
    return fig


def rank_load_figure(frame: pd.DataFrame | None) -> go.Figure | None:
    """Each policy's ranks in one instrumented step: busy seconds (working on a group) and idle
    seconds (the step's length less them: waiting for the micro-batch's slowest group), ms."""
    rows = _measured_rows(frame)
    if not rows.empty:
        rows = rows[rows["busy_s"].map(lambda v: isinstance(v, list) and len(v) > 0)]
    if rows.empty:
        return None
    policies: list[str] = []
    ranks: list[str] = []
    busy: list[float] = []
    idle: list[float] = []
    for _, row in rows.iterrows():
        label = _policy_label(rows, row)
        step = float(row["instrumented_s"])
        for rank, seconds in enumerate(row["busy_s"]):
            policies.append(f"{label}<br>idle {row['idle_share']:.0%}")
            ranks.append(f"r{rank}")
            busy.append(float(seconds) * 1e3)
            idle.append(max(step - float(seconds), 0.0) * 1e3)
    fig = go.Figure([
        go.Bar(x=[policies, ranks], y=busy, name="busy", marker={"color": BUSY_COLOR}),
        go.Bar(x=[policies, ranks], y=idle, name="idle", marker={"color": IDLE_COLOR}),
    ])  # fmt: skip
    common.base_layout(fig, "Per-rank load of one step, by policy")
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title_text="ms of the instrumented step")
    return fig


def speedup_figure(frame: pd.DataFrame | None) -> go.Figure | None:
    """Each policy's speedup over static CP, measured (the static record's median / its own,
    with the bounds of the two 95% intervals) beside the cost model's prediction."""
    rows = _measured_rows(frame)
    if rows.empty or rows["speedup_measured"].isna().all():
        return None
    labels = [_policy_label(rows, row) for _, row in rows.iterrows()]
    static = {r["study"]: r for _, r in rows.iterrows() if r["policy"] == "static"}
    low, high = [], []
    for (_, row), value in zip(rows.iterrows(), rows["speedup_measured"], strict=True):
        base = static.get(row["study"])
        if base is None or pd.isna(value):
            low.append(0.0)
            high.append(0.0)
            continue
        low.append(max(value - float(base["ci_low_s"]) / float(row["ci_high_s"]), 0.0))
        high.append(max(float(base["ci_high_s"]) / float(row["ci_low_s"]) - value, 0.0))
    fig = go.Figure([
        go.Bar(x=labels, y=common.plain_values(rows["speedup_measured"]), name="measured",
               marker={"color": "#1f77b4"},
               error_y={"type": "data", "symmetric": False, "array": high, "arrayminus": low}),
        go.Bar(x=labels, y=common.plain_values(rows["speedup_predicted"]), name="predicted",
               marker={"color": "#ff7f0e"}),
    ])  # fmt: skip
    common.base_layout(fig, "Speedup over static CP: measured vs predicted")
    fig.update_layout(barmode="group")
    fig.add_hline(y=1.0, line={"color": "#444", "dash": "dot"})
    fig.update_yaxes(title_text="static step / policy step")
    return fig
