"""Tables of `cpbench probe`: the timed collectives (nccl-tests columns), the fitted link
lines against the prior, and the kernel efficiency; every table fits 80 columns (`FitTable`)."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from cpbench.app.probe.schema import CommRow, Kernel, LinkRow, ProbeReport, Settings
from cpbench.render.tables import FitTable
from cpbench.units import format_bytes


def _collective(kind: str) -> str:
    return "all-to-all" if kind == "all_to_all" else "send/recv"


def _collectives(rows: list[CommRow]) -> FitTable:
    table = FitTable(
        title="Collectives: median per call of the max over ranks; GB = 1e9 bytes",
        narrow="split",
    )
    table.add_columns(("collective", "UxR", "size", "time (ms)", "algbw (GB/s)", "busbw (GB/s)"),
                      left=("collective", "UxR"), key=("collective", "UxR"))
    table.add_column("reps", justify="right", priority=2)
    for row in rows:
        table.add_row(_collective(row.kind), row.mesh, format_bytes(row.size_bytes, ".3g"),
                      f"{row.time_s * 1e3:.3f}", f"{row.algbw_GBps:.2f}",
                      f"{row.busbw_GBps:.2f}", str(row.repetitions))
    return table


def _links(rows: list[LinkRow]) -> FitTable:
    table = FitTable(
        title="Links: least-squares latency + bytes / busbw (busbw in GB/s, 1e9 bytes)",
        narrow="split",
    )
    table.add_columns(("tier", "collective", "points", "latency (us)", "prior (us)", "busbw",
                       "prior", "RMS err"), left=("tier", "collective"), key=("tier", "collective"))
    for row in rows:
        table.add_row(row.tier, _collective(row.kind), str(row.points), f"{row.latency_us:.1f}",
                      f"{row.prior_latency_us:.1f}", f"{row.busbw_GBps:.3g}",
                      f"{row.prior_busbw_GBps:.3g}", f"{row.residual:.1%}")
    return table


def _kernels(kernel: Kernel, settings: Settings) -> FitTable:
    peak = kernel.peak_tflops
    table = FitTable(
        title=(
            f"Kernel {kernel.family}, causal {settings.phase}, "
            f"{kernel.ranks_at_once} rank(s) at once: efficiency = FLOPs (2*B*h*n^2*d_h "
            f"forward causal, x3.5 fwd+bwd) / (peak {peak:g} TFLOP/s x time)"
        ),
        narrow="split",
    )
    table.add_column("L/R", key=True, justify="right")
    table.add_column("heads/rank", justify="right")
    table.add_column("meshes", wrap=True, priority=2)
    table.add_columns(("time (ms)", "TFLOP/s", "efficiency"), left=())
    for row in kernel.shapes:
        table.add_row(str(row.seq_len), f"{row.heads}/{row.kv_heads}", ", ".join(row.meshes),
                      f"{row.time_s * 1e3:.1f}", f"{row.tflops:.4f}", f"{row.efficiency:.1%}")
    return table


def render_probe(report: ProbeReport) -> list[RenderableType]:
    """The probe's tables and a summary: machine, prior, wall time, where the profile went."""
    s = report.settings
    head = Text(
        f"cpbench probe on {report.machine} ({report.date}): {s.world_size} ranks, "
        f"h={s.heads} h_kv={s.kv_heads} d_h={s.head_dim} L="
        f"{', '.join(str(n) for n in s.seq_lens)} {s.dtype}; prior {report.prior.name} "
        f"({report.prior.reason})"
    )
    curve = report.kernel.curve
    points = ", ".join(
        f"{n}: {e:.1%}" for n, e in zip(curve.seq_len, curve.efficiency, strict=True)
    )
    out: list[RenderableType] = [
        head, _collectives(report.comm), _links(report.links), _kernels(report.kernel, s),
        Text(f"Efficiency curve written (L/R: efficiency): {points}"),
        *(Text(f"note: {note}", style="dim") for note in report.notes),
    ]
    timing = (
        f"Wall time {report.wall_s:.1f} s (measurement {report.measure_s:.1f} s, the rest "
        f"starting the ranks)."
    )
    if report.output:
        where = (
            f"Profile {report.profile} written to {report.output}: use it with "
            f"`cpbench recommend --hardware {report.output}` or as the prior of "
            f"`cpbench calibrate`."
        )
    else:
        where = "No profile written: pass -o FILE.toml to write it."
    out.append(Text(f"{timing} {where}"))
    return out
