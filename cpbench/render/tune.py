"""The screen of `cpbench tune`: the pick with its probability, every candidate's status, what
was measured against measuring everything, and the pick's framework settings."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from cpbench.app.tune import TuneReport
from cpbench.render.tables import FitTable

STOPS = {
    "known": "no candidate is more than {margin:.0%} faster with probability 5% or more",
    "measured": "every candidate that could beat the pick is measured",
    "budget": "the budget is spent",
}
"""Why the loop stopped, in words."""


def _candidates(report: TuneReport) -> FitTable:
    table = FitTable(
        title="Candidates: ms per step (median when measured); P = probability, under the "
        "model's uncertainty and the measurements",
        narrow="split",
    )
    table.add_columns(("candidate", "status", "measured", "predicted", "P fastest", "P < pick"),
                      left=("candidate", "status"), key=("candidate",))
    for c in report.candidates:
        pick = c.label == report.pick
        table.add_row(
            f"{c.label} (pick)" if pick else c.label, c.status,
            "-" if c.measured_ms is None else f"{c.measured_ms:.3f}", f"{c.predicted_ms:.3f}",
            f"{c.p_fastest:.2f}", "-" if pick else f"{c.p_faster_than_pick:.2f}",
        )
    return table


def render_tune(report: TuneReport) -> list[RenderableType]:
    """What `cpbench tune` prints."""
    source = f"replayed from {report.oracle}" if report.oracle else "measured here"
    share = (
        f", {report.exhaustive_share:.0%} of measuring every candidate"
        if report.exhaustive_share is not None
        else ""
    )
    lines = [
        Text(f"pick: {report.pick}, fastest with probability {report.p_pick_fastest:.2f}"
             f" ({'measured' if report.pick_measured else 'not measured: predicted'}); "
             f"another is more than {report.margin:.0%} faster with probability "
             f"{report.p_beaten:.2f}"),  # fmt: skip
        Text(f"stopped: {STOPS[report.stop].format(margin=report.margin)}"),
        Text(f"measured {report.runs} of {len(report.candidates)} candidates ({source}): "
             f"{report.measured_seconds:.4g} s of measurement{share}; the model "
             f"({report.profile}) corrected by x{report.scale:.3f}"),  # fmt: skip
    ]
    if report.misfit:
        lines.append(Text(f"warning: {report.misfit}"))
    out: list[RenderableType] = [*lines, _candidates(report)]
    settings = FitTable(title="Settings of the pick", narrow="split")
    settings.add_columns(("framework", "settings"), key=("framework",))
    for f in report.frameworks:
        settings.add_row(f.framework, f.settings)
    out.append(settings)
    if report.profile_written:
        out.append(Text(f"wrote {report.profile_written}: use it with `cpbench recommend "
                        f"--hardware {report.profile_written}`"))  # fmt: skip
    for line in out:
        if isinstance(line, Text):
            line.no_wrap = False
    return out
