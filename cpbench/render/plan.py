"""Rich renderables of a `cpbench.app.plan.PlanResult`, readable at 80
columns (every table is a `FitTable`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import RenderableType
from rich.text import Text

from cpbench.config.vocabulary import canonical_dtype
from cpbench.render.tables import FitTable
from cpbench.units import format_gib, format_percent, format_seconds

if TYPE_CHECKING:
    from cpbench.app.calibrate_schema import PlanSection
    from cpbench.app.plan import Plan, PlanRejection, PlanResult
    from cpbench.app.recommend.types import FrameworkSetting

MEMORY_ORDER = ("weights", "gradients", "optimizer", "ZeRO-3 gathered weights", "activations",
                "recompute working set", "attention buffers", "logits/loss", "runtime reserve")


def _seconds(value: float) -> str:
    """Seconds with 3 significant digits (a step runs from ms to minutes)."""
    return f"{value:.3g}"


def render_plan(result: PlanResult, top: int = 10) -> list[RenderableType]:
    """The renderables of a plan: header, feasible plans, the winner's step and memory,
    the shortest CP, rejected plans, framework settings, conventions."""
    from cpbench.app.plan import CONVENTIONS  # noqa: PLC0415 - the service's imports behind

    q, m, capacity = result.request, result.model, result.profile.memory_bytes
    header = Text(
        f"{m.name} ({m.total_params / 1e9:.2f} B parameters) at L = {q.seq_len} tokens, "
        f"global batch {result.global_batch} x micro-batch {q.micro_batch} | {q.gpus} GPUs, "
        f"{result.gpus_per_node} per node, {result.profile.name} "
        f"({format_gib(capacity, 1)} each) | {canonical_dtype(q.dtype)}, ZeRO {q.zero}, "
        f"recompute {q.recompute or 'search'}"
    )
    out: list[RenderableType] = [header]
    if result.documents is not None:
        out.append(Text(_documents_line(result)))
    feasible, counts, winner, shortest = (
        result.feasible, result.counts, result.winner, result.shortest_cp
    )
    if winner is not None and shortest is not None:
        total = counts.feasible if counts else None
        out.append(_feasible_table(feasible, top, total, q.rank_by))
        out.append(_step_table(winner))
        tiers = _tiers_text(winner)
        if tiers:
            out.append(Text(tiers))
        out.append(_plan_memory_table(winner, capacity))
        rank = next((i for i, p in enumerate(feasible, 1) if p is shortest), None)
        where = (f"rank {rank}" if rank is not None
                 else f"step {_seconds(shortest.time.total_s)} s, below the plans listed")
        out.append(Text(
            f"Shortest CP that fits: CP {shortest.par.cp} ({shortest.par.label()}, {where}). The "
            f"winner holds sequences up to L = {winner.max_seq_len} tokens."
        ))
    else:
        out.append(Text("No plan fits: see the rejected plans.", style="bold red"))
    if result.rejected:
        out.extend(_rejected(result.rejected, top, counts.rejected_by_memory if counts else None))
    if counts:
        out.append(Text(
            f"Search: {counts.enumerated} plans, {counts.rejected_by_memory} over memory, "
            f"{counts.feasible} fit; {counts.priced} priced, {counts.pruned} pruned "
            f"(a lower bound of their step cannot rank).", style="dim"))
    if result.frameworks:
        out.append(_plan_frameworks_table(result.frameworks))
    out += [Text(f"note: {n}", style="dim") for n in result.notes]
    c = CONVENTIONS
    out.append(Text(
        f"Conventions: {c['time']}. {c['mfu']}. {c['memory']}. {c['tokens']}.", style="dim"
    ))
    return out


def _documents_line(result: PlanResult) -> str:
    """Which documents each sequence packs and how the fastest step moved from one sequence."""
    d, winner = result.documents, result.winner
    assert d is not None
    line = (f"Packed documents ({d.source}, seed {d.seed}): {d.count} per sequence of "
            f"{result.request.seq_len} tokens, mean {d.mean:,.0f}, longest {d.longest:,}; "
            f"attention priced under their document mask.")
    if winner is not None and d.single_step_s is not None:
        change = winner.time.total_s / d.single_step_s - 1
        line += (f" Fastest step {_seconds(winner.time.total_s)} s ({winner.par.label()}) vs "
                 f"{_seconds(d.single_step_s)} s on one causal sequence ({d.single_label}): "
                 f"{change:+.1%}.")
    elif d.single_step_s is None:
        line += " No plan fits one causal sequence of L either."
    return line


def _feasible_table(plans: Sequence[Plan], top: int,
                    feasible_total: int | None = None, rank_by: str = "step") -> FitTable:
    shown = plans[:top] if top else plans
    total = feasible_total if feasible_total is not None else len(plans)
    more = f" (top {len(shown)} of {total}; --top 0 lists all)" if len(shown) < total else ""
    table = FitTable(
        title=("Feasible plans, fastest step first" if rank_by == "step" else
               "Feasible plans, longest safe sequence first") + more,
        caption="step s per optimizer step; attn = attention's share of the step; mem GiB on "
        "the busiest rank; max L = longest sequence in tokens that fits; safe L = longest "
        "whose tensors stay within 80% of the device memory; tok/s per GPU",
    )
    table.add_columns(("#", "TP", "CP UxR", "layout", "PP", "DP", "recompute", "step s", "attn",
                       "tok/s", "MFU", "mem GiB", "max L", "safe L"),
                      left=("CP UxR", "layout", "recompute"), key=("#", "TP", "CP UxR"))
    for rank, p in enumerate(shown, 1):
        par, t = p.par, p.time
        table.add_row(
            str(rank), str(par.tp), f"{par.ulysses}x{par.ring}", layout(p), str(par.pp),
            str(par.dp), par.recompute, _seconds(t.total_s), format_percent(t.attention_share, 0),
            f"{t.tokens_per_s_per_gpu:.0f}", format_percent(t.mfu, 1),
            format_gib(p.peak.total, 1, unit=False), str(p.max_seq_len), str(p.max_seq_len_safe),
        )
    return table


def layout(plan: Plan) -> str:
    """The plan's layout, `any` without a ring."""
    return plan.par.layout if plan.par.ring > 1 else "any"


PART_LABELS = {
    "gemm": "GEMMs (QKV, out, MLP, logits)",
    "attention": "attention (cpbench cost model)",
    "tp_comm": "TP + SP all-gather / reduce-scatter",
    "pp_comm": "pipeline sends",
    "bubble": "pipeline bubble",
    "dp_comm": "DP gradient reduction",
    "optimizer": "optimizer (Adam)",
}
"""The parts of a step (`StepTime.<part>_s`), in words."""


def _step_table(plan: Plan) -> FitTable:
    t = plan.time
    table = FitTable(
        title=f"Winner {plan.par.label()}, {plan.par.recompute} recompute: step "
        f"{_seconds(t.total_s)} s, attention {format_percent(t.attention_share)} "
        f"of it, MFU {format_percent(t.mfu)}",
        caption=f"{plan.par.micro_batches} micro-batch(es) per DP rank; bubble fraction "
        f"{format_percent(t.bubble_fraction)}; ms per optimizer step",
    )
    table.add_columns(("part", "time ms", "share"), left=("part",), key=("part",), wrap=("part",))
    total = t.total_s
    for key, label in PART_LABELS.items():
        value = getattr(t, f"{key}_s")
        table.add_row(Text(label), format_seconds(value, 1, unit=False),
                      format_percent(value / total if total else 0.0))
    return table


TIER_GROUPS = {
    "tp": "TP + SP",
    "ulysses": "Ulysses all-to-all",
    "ring": "ring hops",
    "dp": "DP gradient reduction",
    "pp": "pipeline sends",
}


def _tiers_text(plan: Plan) -> str:
    """Which tier (and link) each of the winner's collectives crosses."""
    tiers = {g.group: g for g in plan.tiers.groups if g.sends} if plan.tiers else {}
    parts = [f"{label} on {tiers[g].tier} ({tiers[g].link.name}, "
             f"{tiers[g].link.send_recv.busbw / 1e9:.0f} GB/s send/recv busbw per GPU)"
             for g, label in TIER_GROUPS.items() if g in tiers]
    return ("Where the winner's collectives run: " + "; ".join(parts) + ".") if parts else ""


def _plan_memory_table(plan: Plan, capacity: float) -> FitTable:
    from cpbench.model.plan.memory import SAFE_MEMORY_FRACTION  # noqa: PLC0415

    stages = {s.stage: {c.name: c for c in s.components} for s in plan.stages}
    names, peak = list(stages), plan.peak
    safe = SAFE_MEMORY_FRACTION * capacity
    table = FitTable(
        title=f"Memory per rank of the winner ({format_gib(peak.total, 1)} of "
        f"{format_gib(capacity, 1)} on the {peak.stage} stage)",
        caption="GiB per rank; formula of the busiest stage. Tensors alone "
        f"{format_gib(peak.tensor_total, 1)}: "
        + ("within" if peak.tensor_total <= safe else "over")
        + f" the safe {format_gib(safe, 1)} (80% of the device memory, "
        "Fujii et al. 2024: no OOM below it over 454 runs; a caching allocator reserves more "
        f"than the tensors). Longest L within it: {plan.max_seq_len_safe} tokens",
        narrow="stack",
    )
    table.add_column("component", key=True, wrap=True)
    for stage in names:
        table.add_column(f"{stage} GiB", justify="right")
    table.add_column("how", wrap=True)
    busiest = stages[peak.stage]
    for name in MEMORY_ORDER:
        if not any(name in stages[s] for s in names):
            continue
        cells = [format_gib(stages[s][name].bytes, 2, unit=False) if name in stages[s] else "-"
                 for s in names]
        how = busiest[name].formula if name in busiest else ""
        table.add_row(Text(name), *cells, Text(how))
    totals = [format_gib(sum(c.bytes for c in stages[s].values()), 2, unit=False)
              for s in names]
    table.add_row(Text("total"), *totals, Text(""))
    return table


def _rejected(rejected: Sequence[PlanRejection], top: int,
              memory_total: int | None = None) -> list[RenderableType]:
    memory = sorted((r for r in rejected if r.kind == "memory"),
                    key=lambda r: r.total_bytes or 0.0)
    rules = [r for r in rejected if r.kind != "memory"]
    out: list[RenderableType] = []
    if memory:
        shown = memory[:top] if top else memory
        total = memory_total if memory_total is not None else len(memory)
        more = (f" (the {len(shown)} closest to fitting of {total}; --top 0 lists all)"
                if len(shown) < total else "")
        table = FitTable(title=f"Rejected: out of memory{more}")
        table.add_columns(("plan", "overflowing component"), key=("plan",),
                          wrap=("plan", "overflowing component"))
        for r in shown:
            table.add_row(Text(r.label), Text(r.rule))
        out.append(table)
    if rules:
        table = FitTable(title="Rejected: rules")
        table.add_columns(("plans", "rule"), key=("plans",), wrap=("plans", "rule"))
        grouped: dict[str, list[str]] = {}
        for r in rules:
            grouped.setdefault(r.rule, []).append(r.label)
        for rule, labels in grouped.items():
            table.add_row(Text("; ".join(labels)), Text(rule))
        out.append(table)
    return out


def _plan_frameworks_table(frameworks: Sequence[FrameworkSetting]) -> FitTable:
    table = FitTable(title="Settings for the winner", narrow="stack")
    columns = ("framework", "settings", "note")
    table.add_columns(columns, key=("framework",), wrap=columns)
    for f in frameworks:
        settings = f.settings.replace(" --", "\n--").replace(", ", ",\n")
        if not f.expressible:  # the note says what differs
            settings = f"closest (cannot express the plan; see the note):\n{settings}"
        table.add_row(Text(f.framework), Text(settings), Text(f.note))
    return table


def render_published_plans(section: PlanSection) -> list[RenderableType]:
    """`validate --published`'s end-to-end section: a row per published run, the plan's
    prediction beside the published number and the memory beside what the source counts."""
    table = FitTable(
        title=f"{section.title} ({section.table})", caption=section.error_convention
    )
    table.add_columns(("run", "role", "plan", "metric", "published", "predicted", "error",
                       "mem pub GiB", "mem pred GiB (tensors / +reserve)"),
                      left=("run", "role", "plan", "metric"), key=("run",), wrap=("plan",))
    for r in section.rows:
        metric, published, predicted, error = (
            "tokens/s/GPU", r.published_tokens_per_s_per_gpu,
            r.predicted_tokens_per_s_per_gpu, r.tokens_error,
        )  # fmt: skip
        if published is None:
            metric, published, predicted, error = (
                "TFLOP/s/GPU", r.published_tflops_per_gpu, r.predicted_tflops_per_gpu,
                r.tflops_error,
            )  # fmt: skip
        memory = (
            "-" if r.predicted_tensor_gib is None or r.predicted_with_reserve_gib is None
            else f"{r.predicted_tensor_gib:.1f} / {r.predicted_with_reserve_gib:.1f}"
        )  # fmt: skip
        table.add_row(
            Text(r.id), r.role, r.plan or f"not planned: {r.rule}", metric,
            "-" if published is None else f"{published:,.0f}",
            "-" if predicted is None else f"{predicted:,.0f}",
            "-" if error is None else f"{error:+.0%}",
            "-" if r.published_memory_gib is None else f"{r.published_memory_gib:.1f}",
            memory,
        )  # fmt: skip
    counts = sorted({r.published_memory_counts for r in section.rows
                     if r.published_memory_gib is not None})  # fmt: skip
    notes = [Text(f"published memory counts: {c}", style="dim") for c in counts]
    return [table, *notes]
