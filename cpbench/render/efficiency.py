"""Tables of `cpbench efficiency` (fitting 80 columns) and of its step profile."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import RenderableType
from rich.text import Text

from cpbench.render.tables import FitTable
from cpbench.units import format_number, format_seconds

if TYPE_CHECKING:  # app.efficiency imports torch
    from cpbench.app.efficiency.cases import CaseTiming, EfficiencyCase, EfficiencyReport
    from cpbench.app.efficiency.profile import StepProfile


def _label(case: EfficiencyCase) -> str:
    if case.impl == "single":
        return "single process"
    return f"{case.impl} U{case.ulysses}xR{case.ring} {case.layout}"


def efficiency_tables(report: EfficiencyReport) -> list[RenderableType]:
    """One table per (world size, dtype): every measured case with best and median step (ms),
    spread (%), efficiency (best, median) and cpbench's ratio to the fastest library on the
    same mesh; then what was skipped or failed and why; then the convention."""
    s = report.settings
    out: list[RenderableType] = []
    for g in report.groups:
        load0, load1 = g.load_average
        table = FitTable(
            title=(
                f"P = {g.world_size}, {g.dtype}: causal fwd+bwd L={s.seq_len} "
                f"h={s.heads} h_kv={s.kv_heads} d={s.head_dim} B={s.batch}, "
                f"{s.rounds} rounds (load {load0:.1f} -> {load1:.1f})"
            ),
        )
        table.add_columns(("case", "best ms", "median ms", "spread %", "eff best", "eff med",
                           "vs peer"), left=("case",), key=("case",))
        for t in (g.baseline, *g.cases):
            if t.status != "ok":
                continue
            vs = "-" if t.vs_peer is None else f"{t.vs_peer:.2f} {t.peer}"
            table.add_row(
                _label(t.case),
                format_seconds(t.best, 0, unit=False),
                format_seconds(t.median, 0, unit=False),
                "-" if t.spread is None else f"{t.spread * 100:.0f}",
                format_number(t.efficiency_best, 2),
                format_number(t.efficiency_median, 2),
                vs,
            )
        out.append(table)
        # what was skipped or failed, one line per implementation, status and reason
        others: dict[tuple[str, str, str], list[CaseTiming]] = {}
        for t in g.cases:
            if t.status != "ok":
                others.setdefault((t.case.impl, t.status, t.reason or ""), []).append(t)
        if others:
            lines = Text()
            for t, *more in others.values():
                lines.append(
                    f"{t.status}: {_label(t.case)}"
                    + (f" (and {len(more)} more)" if more else "")
                    + f": {t.reason}\n"
                )
            out.append(lines)
    out.append(Text(report.convention))
    return out


def profile_table(profiles: Sequence[StepProfile], dtype: str) -> FitTable:
    """Milliseconds (and % of the step's wall time) per bucket, one column per case: its
    median step of those profiled (rank 0's self times; device time too on a GPU), with the
    wall times of every profiled step below."""
    steps = max((len(p.walls) for p in profiles), default=0)
    of = f", the median of {steps} profiled steps" if steps > 1 else ""
    table = FitTable(
        title=f"Where one step's time goes (rank 0, {dtype}, self time ms and % of the wall "
        f"time{of})"
    )
    table.add_column("bucket", key=True)
    device = any(p.device for p in profiles)
    for p in profiles:
        table.add_column(Text(p.label), justify="right")
    buckets = list(profiles[0].cpu) if profiles else []
    for b in buckets:
        table.add_row(b, *(f"{p.cpu[b] * 1e3:.1f} ({p.cpu[b] / p.wall:.1%})"
                           for p in profiles))
    if device:
        for b in buckets:
            table.add_row(f"{b} (device)",
                          *(f"{p.device.get(b, 0.0) * 1e3:.1f}" for p in profiles))
    table.add_row("wall (step)", *(f"{p.wall * 1e3:.1f}" for p in profiles))
    if steps > 1:
        table.add_row("walls profiled", *(" ".join(f"{w * 1e3:.0f}" for w in p.walls)
                                          for p in profiles))
    return table
