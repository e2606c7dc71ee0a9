"""Rich renderables of a plan report (the dict of `cpbench.app.plan.to_json`), readable at 80
columns (every table is a `FitTable`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import RenderableType
from rich.text import Text

from cpbench.render.tables import FitTable
from cpbench.units import format_gib, format_percent, format_seconds

MEMORY_ORDER = (
    "weights",
    "gradients",
    "optimizer",
    "ZeRO-3 gathered weights",
    "activations",
    "recompute working set",
    "attention buffers",
    "logits/loss",
    "runtime reserve",
)


def _seconds(value: float) -> str:
    """Seconds with 3 significant digits (a step runs from ms to minutes)."""
    return f"{value:.3g}"


def render_plan(report: Mapping[str, Any], top: int = 10) -> list[RenderableType]:
    """The renderables of a plan report: header, feasible plans, the winner's step and memory,
    the shortest CP, rejected plans, framework settings, conventions."""
    q = report["inputs"]
    m = q["model"]
    header = Text(
        f"{m['name']} ({q['parameters'] / 1e9:.2f} B parameters) at L = {q['seq_len']} tokens, "
        f"global batch {q['global_batch']} x micro-batch {q['micro_batch']} | {q['gpus']} GPUs, "
        f"{q['gpus_per_node']} per node, {q['hardware']} "
        f"({format_gib(q['memory_capacity_bytes'], 1)} each) | {q['dtype']}, ZeRO {q['zero']}, "
        f"recompute {q['recompute']}"
    )
    out: list[RenderableType] = [header]
    feasible = report["feasible"]
    if feasible:
        found = report.get("search")
        out.append(_feasible_table(feasible, top, found["feasible"] if found else None,
                                   q.get("rank_by", "step")))
        winner = feasible[report["winner"] - 1]
        out.append(_step_table(winner))
        tiers = _tiers_text(winner)
        if tiers:
            out.append(Text(tiers))
        out.append(_plan_memory_table(winner, q["memory_capacity_bytes"]))
        shortest = report["shortest_cp"]
        where = (f"rank {shortest['rank']}" if shortest["rank"] is not None
                 else f"step {_seconds(shortest['step_s'])} s, below the plans listed")
        out.append(Text(
            f"Shortest CP that fits: CP {shortest['cp']} ({shortest['label']}, {where}). The "
            f"winner holds sequences up to L = {winner['max_seq_len']} tokens."
        ))
    else:
        out.append(Text("No plan fits: see the rejected plans.", style="bold red"))
    counts = report.get("search")
    if report["rejected"]:
        memory_total = counts["rejected_by_memory"] if counts else None
        out.extend(_rejected(report["rejected"], top, memory_total))
    if counts:
        out.append(Text(
            f"Search: {counts['enumerated']} plans, {counts['rejected_by_memory']} over memory, "
            f"{counts['feasible']} fit; {counts['priced']} priced, {counts['pruned']} pruned "
            f"(a lower bound of their step cannot rank).", style="dim"))
    if report["frameworks"]:
        out.append(_plan_frameworks_table(report["frameworks"]))
    out += [Text(f"note: {n}", style="dim") for n in report["notes"]]
    conventions = report["conventions"]
    out.append(Text(
        f"Conventions: {conventions['time']}. {conventions['mfu']}. {conventions['memory']}. "
        f"{conventions['tokens']}.",
        style="dim",
    ))
    return out


def _feasible_table(plans: Sequence[Mapping[str, Any]], top: int,
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
    for col in ("#", "TP", "CP UxR", "layout", "PP", "DP", "recompute", "step s", "attn",
                "tok/s", "MFU", "mem GiB", "max L", "safe L"):
        left = col in ("CP UxR", "layout", "recompute")
        table.add_column(col, justify="left" if left else "right",
                         key=col in ("#", "TP", "CP UxR"))
    for p in shown:
        table.add_row(
            str(p["rank"]), str(p["tp"]), f"{p['ulysses']}x{p['ring']}", p["layout"], str(p["pp"]),
            str(p["dp"]), p["recompute"], _seconds(p["step_s"]),
            format_percent(p["attention_share"], 0), f"{p['tokens_per_s_per_gpu']:.0f}",
            format_percent(p["mfu"], 1), format_gib(p["memory_bytes"], 1, unit=False),
            str(p["max_seq_len"]), str(p["max_seq_len_safe"]),
        )
    return table


PART_LABELS = {
    "gemm": "GEMMs (QKV, out, MLP, logits)",
    "attention": "attention (cpbench cost model)",
    "tp_comm": "TP + SP all-gather / reduce-scatter",
    "pp_comm": "pipeline sends",
    "bubble": "pipeline bubble",
    "dp_comm": "DP gradient reduction",
    "optimizer": "optimizer (Adam)",
}


def _step_table(plan: Mapping[str, Any]) -> FitTable:
    table = FitTable(
        title=f"Winner {plan['label']}, {plan['recompute']} recompute: step "
        f"{_seconds(plan['step_s'])} s, attention {format_percent(plan['attention_share'])} "
        f"of it, MFU {format_percent(plan['mfu'])}",
        caption=f"{plan['micro_batches']} micro-batch(es) per DP rank; bubble fraction "
        f"{format_percent(plan['bubble_fraction'])}; ms per optimizer step",
    )
    table.add_column("part", key=True, wrap=True)
    table.add_column("time ms", justify="right")
    table.add_column("share", justify="right")
    total = plan["step_s"]
    for key, label in PART_LABELS.items():
        value = plan["parts_s"][key]
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


def _tiers_text(plan: Mapping[str, Any]) -> str:
    """Which tier (and link) each of the winner's collectives crosses."""
    tiers = plan.get("tiers") or {}
    parts = [f"{label} on {tiers[g]['tier']} ({tiers[g]['link']}, "
             f"{tiers[g]['send_recv_busbw_GBps']:.0f} GB/s send/recv busbw per GPU)"
             for g, label in TIER_GROUPS.items() if g in tiers]
    return ("Where the winner's collectives run: " + "; ".join(parts) + ".") if parts else ""


def _plan_memory_table(plan: Mapping[str, Any], capacity: float) -> FitTable:
    stages = plan["memory"]
    names = list(stages)
    table = FitTable(
        title=f"Memory per rank of the winner ({format_gib(plan['memory_bytes'], 1)} of "
        f"{format_gib(capacity, 1)} on the {plan['memory_stage']} stage)",
        caption="GiB per rank; formula of the busiest stage. Tensors alone "
        f"{format_gib(plan['memory_tensor_bytes'], 1)}: "
        + ("within" if plan["within_safe_margin"] else "over")
        + f" the safe {format_gib(plan['memory_safe_bytes'], 1)} (80% of the device memory, "
        "Fujii et al. 2024: no OOM below it over 454 runs; a caching allocator reserves more "
        f"than the tensors). Longest L within it: {plan['max_seq_len_safe']} tokens",
        narrow="stack",
    )
    table.add_column("component", key=True, wrap=True)
    for stage in names:
        table.add_column(f"{stage} GiB", justify="right")
    table.add_column("how", wrap=True)
    busiest = stages[plan["memory_stage"]]
    for name in MEMORY_ORDER:
        if not any(name in stages[s] for s in names):
            continue
        cells = [format_gib(stages[s][name]["bytes"], 2, unit=False) if name in stages[s] else "-"
                 for s in names]
        how = busiest[name]["formula"] if name in busiest else ""
        table.add_row(Text(name), *cells, Text(how))
    totals = [format_gib(sum(c["bytes"] for c in stages[s].values()), 2, unit=False)
              for s in names]
    table.add_row(Text("total"), *totals, Text(""))
    return table


def _rejected(rejected: Sequence[Mapping[str, Any]], top: int,
              memory_total: int | None = None) -> list[RenderableType]:
    memory = sorted((r for r in rejected if r["kind"] == "memory"),
                    key=lambda r: r["memory_bytes"])
    rules = [r for r in rejected if r["kind"] != "memory"]
    out: list[RenderableType] = []
    if memory:
        shown = memory[:top] if top else memory
        total = memory_total if memory_total is not None else len(memory)
        more = (f" (the {len(shown)} closest to fitting of {total}; --top 0 lists all)"
                if len(shown) < total else "")
        table = FitTable(title=f"Rejected: out of memory{more}")
        table.add_column("plan", key=True, wrap=True)
        table.add_column("overflowing component", wrap=True)
        for r in shown:
            table.add_row(Text(r["label"]), Text(r["rule"]))
        out.append(table)
    if rules:
        table = FitTable(title="Rejected: rules")
        table.add_column("plans", key=True, wrap=True)
        table.add_column("rule", wrap=True)
        grouped: dict[str, list[str]] = {}
        for r in rules:
            grouped.setdefault(r["rule"], []).append(r["label"])
        for rule, labels in grouped.items():
            table.add_row(Text("; ".join(labels)), Text(rule))
        out.append(table)
    return out


def _plan_frameworks_table(frameworks: Sequence[Mapping[str, Any]]) -> FitTable:
    table = FitTable(title="Settings for the winner", narrow="stack")
    table.add_column("framework", key=True, wrap=True)
    table.add_column("settings", wrap=True)
    table.add_column("note", wrap=True)
    for f in frameworks:
        settings = f["settings"].replace(" --", "\n--").replace(", ", ",\n")
        if not f["expressible"]:  # the note says what differs
            settings = f"closest (cannot express the plan; see the note):\n{settings}"
        table.add_row(Text(f["framework"]), Text(settings), Text(f["note"]))
    return table


def render_published_plans(section: Mapping[str, Any]) -> list[RenderableType]:
    """`validate --published`'s end-to-end section: a row per published run, the plan's
    prediction beside the published number and the memory beside what the source counts."""
    table = FitTable(
        title=f"{section['title']} ({section['table']})", caption=section["error_convention"]
    )
    for col in ("run", "role", "plan", "metric", "published", "predicted", "error",
                "mem pub GiB", "mem pred GiB (tensors / +reserve)"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("run", "role", "plan", "metric")
                         else "right", key=col == "run", wrap=col == "plan")  # fmt: skip
    for r in section["rows"]:
        metric, published, predicted, error = (
            "tokens/s/GPU", r["published_tokens_per_s_per_gpu"],
            r["predicted_tokens_per_s_per_gpu"], r["tokens_error"],
        )  # fmt: skip
        if published is None:
            metric, published, predicted, error = (
                "TFLOP/s/GPU", r["published_tflops_per_gpu"], r["predicted_tflops_per_gpu"],
                r["tflops_error"],
            )  # fmt: skip
        memory = (
            "-" if r["predicted_tensor_gib"] is None
            else f"{r['predicted_tensor_gib']:.1f} / {r['predicted_with_reserve_gib']:.1f}"
        )  # fmt: skip
        table.add_row(
            Text(r["id"]), r["role"], r["plan"] or f"not planned: {r['rule']}", metric,
            "-" if published is None else f"{published:,.0f}",
            "-" if predicted is None else f"{predicted:,.0f}",
            "-" if error is None else f"{error:+.0%}",
            "-" if r["published_memory_gib"] is None else f"{r['published_memory_gib']:.1f}",
            memory,
        )  # fmt: skip
    counts = sorted({r["published_memory_counts"] for r in section["rows"]
                     if r["published_memory_gib"] is not None})  # fmt: skip
    notes = [Text(f"published memory counts: {c}", style="dim") for c in counts]
    return [table, *notes]
