"""Rich rendering of `cpbench doctor`'s report (`cpbench.app.doctor.schema.DoctorReport`): the
summary sentences, then one `FitTable` per section (versions, GPUs, interconnect, kernels,
implementations, distributed backends), each readable at 80 columns."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from cpbench.app.doctor.schema import TOPOLOGY_LEGEND, DoctorReport
from cpbench.config.vocabulary import DEFAULT_DTYPE
from cpbench.render.tables import FitTable
from cpbench.units import format_gib


def _yes(flag: bool) -> Text:
    return Text.from_markup("[green]yes[/]" if flag else "[red]no[/]")


def versions_table(report: DoctorReport) -> FitTable:
    """cpbench, Python, torch and what it was built with, the driver, the optional libraries."""
    table = FitTable(title="versions")
    table.add_columns(("component", "version", "note"), key=("component",), wrap=("note",),
                      first=("note",))
    rows: list[tuple[str, str | None, str]] = [
        ("cpbench", report.cpbench, ""),
        ("python", report.python, ""),
        ("torch", report.torch, "" if report.torch_cuda else "CPU-only build"),
        ("CUDA (torch build)", report.torch_cuda, ""),
        ("NCCL (torch)", report.nccl, ""),
        ("cuDNN (torch)", report.cudnn, ""),
        ("NVIDIA driver", report.nvml.driver_version,
         f"supports CUDA {report.nvml.cuda_driver_version}"
         if report.nvml.cuda_driver_version else ""),
    ]
    for p in report.packages:
        if p.name == "torch":
            continue
        notes = []
        if p.distribution is not None and p.distribution != p.name:
            notes.append(f"pip: {p.distribution}")
        if p.version is not None and not p.found:
            notes.append(f"module {p.module} missing")
        if p.version is None and p.found:
            notes.append(f"module {p.module} found, no metadata")
        rows.append((p.name, p.version, "; ".join(notes)))
    for name, version, note in rows:
        table.add_row(name, Text(version or "-", style="" if version else "dim"), Text(note))
    return table


def gpus_table(report: DoctorReport) -> FitTable:
    table = FitTable(title="GPUs")
    table.add_columns(("GPU", "name", "memory", "in use", "cc", "PCI bus", "NUMA"),
                      right=("memory", "in use"), key=("GPU",), wrap=("name",),
                      first=("name", "memory"))
    for g in report.gpus:
        bus = g.pci_bus_id[-12:] if g.pci_bus_id else "-"  # without NVML's 8-digit domain
        table.add_row(
            str(g.index), Text(g.name), format_gib(g.memory_total_bytes),
            format_gib(g.memory_used_bytes), g.compute_capability or "-", bus,
            "-" if g.numa_node is None else str(g.numa_node),
        )
    return table


def topology_renderables(report: DoctorReport) -> list[RenderableType]:
    """The matrix with a legend of the labels it uses, or why there is none."""
    topo = report.topology
    if not topo.matrix or topo.reason:
        return [Text(f"interconnect: {topo.reason}")]
    used = {"NV#" if cell.startswith("NV") else cell for row in topo.matrix for cell in row}
    legend = "; ".join(f"{label}: {text}" for label, text in TOPOLOGY_LEGEND.items()
                       if label in used)
    table = FitTable(title=f"GPU interconnect (from {topo.source})", caption=legend)
    table.add_column("", key=True)
    for label in topo.gpus:
        table.add_column(label, justify="center")
    table.add_column("NUMA", justify="right")
    for label, row, numa in zip(topo.gpus, topo.matrix, topo.numa, strict=True):
        table.add_row(label, *row, "-" if numa is None else str(numa))
    return [table]


def kernels_table(report: DoctorReport) -> FitTable:
    """One row per kernel: the dtypes it runs with (and the kernel that runs, where another, as
    for `auto`), and why not for the
    others (the reason at the device's default dtype; the JSON form has every dtype's)."""
    table = FitTable(title=f"local kernels on {report.device} (--kernel, backend axis)")
    table.add_columns(("kernel", "usable with (runs as)", "not usable: why"), key=("kernel",),
                      wrap=("not usable: why",), first=("not usable: why",))
    default = DEFAULT_DTYPE[report.device]
    for name in dict.fromkeys(k.name for k in report.kernels):
        rows = [k for k in report.kernels if k.name == name]
        usable = [k.dtype for k in rows if k.usable]
        refused = [k for k in rows if not k.usable]
        why = ""
        if refused:  # one reason (the default dtype's): they differ only in the dtype named
            pick = next((k for k in refused if k.dtype == default), refused[0])
            prefix = f"{', '.join(k.dtype for k in refused)}: " if usable else ""
            why = prefix + (pick.reason or "")
        runs_as = [r for r in dict.fromkeys(k.resolved for k in rows if k.resolved) if r != name]
        dtypes = "all dtypes" if len(usable) == len(rows) else ", ".join(usable)
        table.add_row(
            name,
            Text(dtypes + (f" ({', '.join(runs_as)})" if runs_as else ""))
            if usable else Text.from_markup("[red]none[/]"),
            Text(why),
        )
    return table


def impls_table(report: DoctorReport) -> FitTable:
    table = FitTable(title="implementations (--impl, impl axis)",
                     caption=f"checked on: {report.probe_config}")
    table.add_columns(("impl", "version", "usable", "not usable: why"), key=("impl",),
                      wrap=("not usable: why",), first=("not usable: why",))
    for i in report.impls:
        table.add_row(i.name, i.version or "-", _yes(i.usable), Text(i.reason or ""))
    return table


def backends_table(report: DoctorReport) -> FitTable:
    table = FitTable(title="torch.distributed backends")
    table.add_columns(("backend", "built", "usable", "not usable: why"), key=("backend",),
                      wrap=("not usable: why",))
    for b in report.backends:
        table.add_row(b.name, _yes(b.built), _yes(b.usable), Text(b.reason or ""))
    return table


def render_doctor(report: DoctorReport) -> list[RenderableType]:
    """Everything `cpbench doctor` prints, in order."""
    out: list[RenderableType] = [Text(line, style="bold") for line in report.summary]
    out.append(Text(f"host {report.hostname}: {report.platform}", style="dim"))
    out.append(versions_table(report))
    if report.gpus:
        out.append(gpus_table(report))
    out.extend(topology_renderables(report))
    nvml = report.nvml
    out.append(Text(
        "NVML: available (per-process GPU memory peaks, topology)" if nvml.available
        else f"NVML: not available ({nvml.reason})"
    ))
    out.append(kernels_table(report))
    out.append(impls_table(report))
    out.append(backends_table(report))
    out.append(Text(f"checked in {report.elapsed_seconds:.1f} s", style="dim"))
    return out
