"""Rich tables of a `cpbench.app.formulas.formulas_report` report, each a `FitTable`: whole on a
wide console; on a narrow one (80 columns, a pipe) its columns split into parts that repeat the
row's name, so no formula, shape or number is cut."""

from __future__ import annotations

from rich.table import Table

from cpbench.app.formulas_schema import (
    Flops,
    FormulasReport,
    GatherSection,
    InfeasibleLayout,
    MaskSection,
    Memory,
    Mesh,
    NcclView,
    Shapes,
    WhatIf,
)
from cpbench.render.tables import FitTable
from cpbench.units import format_bytes, format_count


def _shape_text(shape: list[int] | None) -> str:
    return "-" if shape is None else "[" + ", ".join(str(x) for x in shape) + "]"


def render_formulas(report: FormulasReport) -> list[Table]:
    """Rich tables of a `formulas_report`, in reading order."""
    return [
        _configuration_table(report),
        _shapes_table(report.mesh, report.shapes),
        _communication_table(report),
        _nccl_table(report.nccl_tests),
        _flops_table(report.flops),
        _work_table(report),
        *([_mask_table(report.mask)] if report.mask is not None else []),
        _memory_table(report.memory),
        *([_gather_table(report.all_gather)] if report.all_gather is not None else []),
        _what_if_table(report.what_if),
    ]


def _mask_table(mask: MaskSection) -> Table:
    window = f", window {mask.window}" if mask.window else ""
    table = FitTable(
        title=(
            f"Layouts under {mask.label} ({mask.documents} documents, longest "
            f"{mask.longest_document} tokens{window}; ring of {mask.ring})"
        ),
        caption=f"{mask.convention}; {mask.hops_note}",
    )
    table.add_columns(("layout", "imbalance", "overhead", "padding", "ring steps", "K/V hops",
                       "bytes fwd+bwd"), left=("layout",), key=("layout",))
    for row in mask.layouts:
        if isinstance(row, InfeasibleLayout):
            table.add_row(row.layout, "infeasible", "", "", "", "", row.reason)
            continue
        padding = (
            f"{row.padding_tokens} tok (+{row.padding_fraction:.2%} pairs)"
            if row.padding_tokens
            else "none"
        )
        table.add_row(row.layout, f"{row.imbalance:.3f}x", f"{row.overhead:.3f}x", padding,
                      f"{row.ring_steps} of {mask.ring}", str(row.kv_hops),
                      format_bytes(row.bytes_forward_backward))
    return table


def _configuration_table(report: FormulasReport) -> Table:
    table = FitTable(title="Configuration", show_header=False)
    table.add_column("name", key=True)
    table.add_column("value", wrap=True)
    for key, value in [*report.inputs, *report.mesh]:
        table.add_row(key, str(value))
    symbols = ", ".join(f"{k}={v}" for k, v in report.symbols.items())
    table.add_row("symbols", symbols)
    return table


def _shapes_table(mesh: Mesh, shapes: Shapes) -> Table:
    table = FitTable(
        title="Per-rank tensor shapes",
        caption=f"{mesh.tokens_per_rank} tokens per rank, ring shard "
        f"{mesh.ring_shard_tokens} tokens",
    )
    table.add_columns(("tensor", "local (sequence shard)", "after all-to-all (head shard)"),
                      key=("tensor",))
    table.add_row("q", _shape_text(shapes.q.local), _shape_text(shapes.q.after_all_to_all))
    for name, kv in (("k", shapes.k), ("v", shapes.v)):
        local = _shape_text(kv.local)
        if kv.replicated != kv.local:
            local += f"\n-> replicated {_shape_text(kv.replicated)}"
        table.add_row(name, local, _shape_text(kv.after_all_to_all))
    table.add_row("o", _shape_text(shapes.o.local), _shape_text(shapes.o.heads))
    table.add_row("lse (fp32)", "", _shape_text(shapes.lse))
    table.add_row("ring K/V chunk", "", _shape_text(shapes.ring_kv_chunk))
    if shapes.gathered_kv is not None:
        table.add_row("gathered K/V (a stride)", "", _shape_text(shapes.gathered_kv))
    return table


def _gather_table(gather: GatherSection) -> Table:
    table = FitTable(
        title=(
            f"All-gather memory per rank against the head stride ({gather.kv_heads_per_rank} "
            f"KV heads per rank)"
        ),
        caption=(
            f"gathered K/V = {gather.gathered_kv_formula}; the ring holds "
            f"{format_bytes(gather.ring_kv_buffers_bytes)} of K/V buffers, peak "
            f"{format_bytes(gather.ring_peak_forward_backward)} fwd+bwd; {gather.note}"
        ),
    )
    table.add_columns(("heads_k_stride", "gathers per pass", "gathered K/V", "peak fwd+bwd"),
                      left=("heads_k_stride",), key=("heads_k_stride",))
    for row in gather.strides:
        table.add_row(f"{row.heads_k_stride}" + (" (this)" if row.selected else ""),
                      str(row.gathers), format_bytes(row.gathered_kv_bytes),
                      format_bytes(row.peak_forward_backward))
    return table


def _communication_table(report: FormulasReport) -> Table:
    comm, inputs = report.communication, report.inputs
    caption = comm.convention
    if inputs.ring > 1 and inputs.cp_comm == "all_gather":
        caption += f"; {comm.hops_note}"
    elif inputs.ring > 1:
        caption += f"; {comm.hops_note} (here k = {comm.ring_steps})"
    table = FitTable(title="Communication per rank, one layer", caption=caption)
    table.add_column("phase", key=True)
    table.add_column("collective", key=True, wrap=True)
    table.add_column("calls", priority=0)
    table.add_column("formula (elements sent)", wrap=True)
    table.add_column("substituted", wrap=True, priority=2)
    table.add_column("elements", justify="right", priority=0)
    table.add_column("bytes", justify="right", priority=0)
    for phase, totals in comm.by_pass().items():
        for stage in totals.stages:
            for c in stage.collectives:
                table.add_row(phase, f"{c.name} ({c.kind})", str(c.calls), c.formula,
                              c.substituted, format_count(c.elements_sent),
                              format_bytes(c.bytes_sent))
            table.add_row(phase, f"{stage.stage} total", "", stage.bytes_formula + " bytes",
                          stage.bytes_substituted, format_count(stage.elements_sent),
                          format_bytes(stage.bytes_sent), style="bold")
        table.add_row(
            phase, "per rank / all ranks", "", "", "", format_count(totals.elements_per_rank),
            f"{format_bytes(totals.bytes_per_rank)} / {format_bytes(totals.global_bytes)}",
            style="bold", end_section=True,
        )
    return table


def _nccl_table(nccl: NcclView) -> Table:
    table = FitTable(title="nccl-tests view (per call)", caption=nccl.convention)
    table.add_columns(("phase", "collective", "kind", "n", "calls", "size", "busbw / algbw",
                       "bus bytes"), right=("size", "busbw / algbw", "bus bytes"),
                      key=("phase", "collective"))
    for row in nccl.collectives:
        table.add_row(row.phase, row.name, row.kind, str(row.group_size), str(row.calls),
                      format_bytes(row.size_bytes), f"{row.busbw_factor:.4g}",
                      format_bytes(row.bus_bytes_per_call))
    return table


def _flops_table(flops: Flops) -> Table:
    table = FitTable(title="Attention FLOPs, one layer", caption=flops.convention)
    table.add_columns(("", "forward", "backward", "forward+backward"), left=(), key=("",))
    g, slow = flops.global_, flops.slowest_rank
    table.add_row("all ranks", format_count(g.forward), format_count(g.backward),
                  format_count(g.forward_backward))
    table.add_row("slowest rank", format_count(slow.forward), "",
                  format_count(slow.forward_backward))
    return table


def _work_table(report: FormulasReport) -> Table:
    work, flops, mesh = report.work, report.flops, report.mesh
    u = report.inputs.ulysses
    table = FitTable(
        title=f"Work per rank ({work.layout}, {work.mask})",
        caption=f"imbalance (slowest / mean) = {work.imbalance:.4f}; ring steps "
        f"{work.ring_steps}; padding {work.padding_tokens} tokens; unit: {work.unit}",
    )
    table.add_columns(("ring rank", "global ranks", "pairs per rank", "chunk units",
                       "fwd FLOPs per rank"), left=("ring rank", "global ranks"),
                      key=("ring rank",))
    for j, pairs in enumerate(work.ring_rank_pairs):
        p = j * u
        table.add_row(
            str(j),
            f"{p}..{p + u - 1}" if u > 1 else str(p),
            format_count(pairs / u),
            f"{work.rank_chunk_units[p]:.6g}",
            format_count(flops.per_rank.forward[p]),
        )
    table.add_row("world", str(mesh.world_size), format_count(work.total_pairs), "", "")
    return table


def _memory_table(memory: Memory) -> Table:
    table = FitTable(title="Memory per rank, one layer (lower bound)")
    table.add_columns(("item", "shape", "dtype", "phase", "bytes", "alive in"), right=("bytes",),
                      key=("item",), wrap=("item", "alive in"))
    for item in memory.items:
        table.add_row(item.name, _shape_text(item.shape), item.dtype, item.phase,
                      format_bytes(item.bytes), ", ".join(item.stages))
    for phase, m in (("forward", memory.forward), ("forward_backward", memory.forward_backward)):
        table.add_row(f"{phase} total / peak", "", "", "",
                      f"{format_bytes(m.total)} / {format_bytes(m.peak)}",
                      f"peak in {m.peak_stage}", style="bold")
    return table


def _what_if_table(what_if: WhatIf) -> Table:
    table = FitTable(
        title=f"Largest sequence fitting {what_if.budget_gib} GiB per rank (attention only)",
        caption=f"multiples of {what_if.seq_divisor}",
    )
    table.add_column("phase")
    table.add_column("max seq_len", justify="right")
    table.add_row("forward", f"{what_if.max_seq_len_forward:,}")
    table.add_row("forward+backward", f"{what_if.max_seq_len_forward_backward:,}")
    return table
