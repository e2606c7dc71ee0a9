"""Rich renderables of a recommendation report (the dict of `recommendation_report`): the
header, the ranked and rejected tables, the short why (or with `--explain` the full
explanation) and the framework settings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import RenderableType
from rich.text import Text

from cpbench.render.recommend.explanation import explanation_text, why_lines
from cpbench.render.recommend.frameworks import setting_note
from cpbench.render.tables import FitTable
from cpbench.units import format_gb, format_gib, format_percent, format_seconds


def render_recommendation(report: Mapping[str, Any], explain: bool = False) -> list[RenderableType]:
    """Rich renderables of a recommendation report (the dict of `recommendation_report`): what
    fits one screen (the ranked table, the pick and why in three sentences, the settings), or
    with `explain` every column, the full explanation and every framework's notes."""
    q, s = report["inputs"], report["parallel"]
    header = Text(
        f"L={q['seq_len']} heads={q['heads']} kv_heads={q['kv_heads']} head_dim={q['head_dim']} "
        f"micro-batch={q['batch']} {q['dtype']} "
        f"{q.get('mask_label') or ('causal' if q['causal'] else 'full')} "
        f"{q['phase']} | {q['gpus']} GPUs, {q['gpus_per_node']} per node, {q['hardware']} | "
        f"{s['world_formula']}"
    )
    out: list[RenderableType] = [header]
    u = report.get("uncertainty")
    if u and u["kind"] == "prior":
        out.append(
            Text(
                f"These numbers come from an uncalibrated prior (±{u['sigma']:.0%}, "
                f"{u['source']}): run `cpbench probe` on the machine (or pass --results of "
                "`cpbench sweep`) to calibrate them.",
                style="yellow",
            )
        )
    elif u:
        out.append(Text(f"Uncertainty: ±{u['sigma']:.0%} ({u['source']}).", style="dim"))
    out += [Text(f"warning: {w}", style="yellow") for w in report.get("warnings", [])]
    if s["tp"] > 1:
        out.append(
            Text(
                f"TP {s['tp']} splits the heads first: CP works on {s['attention_heads_per_tp_rank']} "
                f"query / {s['kv_heads_per_tp_rank']} KV heads per TP rank."
            )
        )
    if report["candidates"]:
        out.append(_candidates_table(report, explain))
    tie = report.get("tie")
    if tie:
        out.append(
            Text(
                ("Tie: " if not tie["clear"] else "") + tie["message"] + ".",
                style="bold yellow" if not tie["clear"] else "bold",
            )
        )
    if report["rejected"]:
        out.append(_rejected_table(report["rejected"]))
    e = report["explanation"]
    if explain or e is None:
        out.append(Text("Why: " + explanation_text(e, len(report["rejected"]))))
    else:
        out.append(Text("\n".join(why_lines(e))))
    if report["frameworks"]:
        out.append(_frameworks_table(report["frameworks"], explain))
    out.append(Text(f"{s['world_formula']}; {s['global_batch_formula']}"))
    if explain:
        out.append(Text(f"Conventions: {report['conventions']['time']}.", style="dim"))
    else:
        out.append(Text("--explain: every column, the full why, each framework's caveats.", style="dim"))
    if report["calibration"]:
        cal = report["calibration"]
        out.append(
            Text(
                f"Calibrated {cal['prior']} on {cal['points']} measurements: RMS relative error "
                f"{format_percent(cal['residual_before'])} -> {format_percent(cal['residual'])}.",
                style="dim",
            )
        )
    return out


BRIEF_COLUMNS = ("#", "U x R", "layout", "time ms", "±", "imbalance ms", "exposed comm ms",
                 "mem GiB", "max L", "work x", "steps", "pad", "source")
"""The columns of the default (one-screen) ranked table; `--explain` shows them all. Under a
mask `work x` stands for the imbalance; `source` only when a row is measured."""


def _candidates_table(report: Mapping[str, Any], explain: bool = True) -> FitTable:
    shown, feasible = len(report["candidates"]), report["feasible"]
    more = f" (top {shown} of {feasible}; --top 0 lists all)" if shown < feasible else ""
    masked = report["inputs"].get("mask", "causal") not in ("causal", "full")
    caption = "times in ms per attention layer and micro-batch; " + (
        "GB = 1e9 bytes per rank and layer; " if explain else ""
    ) + "mem GiB per rank; max L in tokens"
    caption += "; ± = " + (
        "one sigma of the predicted time (time x e^±sigma)"
        if report.get("uncertainty")
        else "the interval"
    )
    if any(c["source"] == "measured" for c in report["candidates"]):
        # scipy (behind stats) only when measured rows are drawn: `cpbench --help` stays light
        from cpbench.model.calibrate.stats import TIE_RULE  # noqa: PLC0415

        caption += ", or half the measured median's 95% interval; " + TIE_RULE
    caption += "; = marks a tie with #1"
    if any(c.get("cp_comm") == "all_gather" for c in report["candidates"]):
        caption += "; ag = the ring axis all-gathers K/V, hs = KV heads per gather"
    if masked:
        caption += (
            "; work x = slowest ring rank's work / mean; steps = ring steps run of R; pad = "
            "padding tokens"
        )
    table = FitTable(title=f"Feasible candidates, fastest first{more}", caption=caption)
    mask_columns = ("work x", "steps", "pad") if masked else ()
    columns = ("#", "U x R", "layout", "KV rep", "time ms", "±", "compute ms", "imbalance ms",
               "exposed comm ms", "intra GB", "inter GB", "mem GiB", "max L", *mask_columns,
               "source")
    measured = any(c["source"] == "measured" for c in report["candidates"])
    left_out = () if explain else ("imbalance ms",) * masked + ("source",) * (not measured)
    visible = [c for c in columns if (explain or c in BRIEF_COLUMNS) and c not in left_out]
    for col in visible:
        table.add_column(
            col,
            justify="left" if col in ("U x R", "layout", "source") else "right",
            key=col in ("#", "U x R", "layout"),
        )
    for c in report["candidates"]:
        tiers = c["bytes_per_tier"]
        pm = (c.get("interval") or {}).get("plus_minus")
        cells = (
            str(c["rank"]) + ("=" if c.get("tied") and c["rank"] > 1 else ""),
            f"{c['ulysses']} x {c['ring']}",
            (c["layout"] if c["layout_matters"] else "any") + _comm_suffix(c),
            f"x{c['kv_replication']}",
            format_seconds(c["time_s"], 2, unit=False),
            "" if pm is None else f"±{pm:.0%}",
            format_seconds(c["compute_s"], 2, unit=False),
            format_seconds(c["imbalance_s"], 2, unit=False),
            format_seconds(c["exposed_comm_s"], 2, unit=False),
            format_gb(tiers["intra_node"], unit=False),
            format_gb(tiers["inter_node"], unit=False),
            format_gib(c["memory_bytes"], unit=False),
            str(c["max_seq_len"]),
            *(
                (
                    f"{c['work_imbalance']:.2f}",
                    f"{c['ring_steps']}/{c['ring']}",
                    str(c["padding_tokens"]),
                )
                if masked
                else ()
            ),
            c["source"],
        )
        table.add_row(*(cell for cell, col in zip(cells, columns, strict=True) if col in visible))
    return table


def _rejected_table(rejected: Sequence[Mapping[str, Any]]) -> FitTable:
    table = FitTable(title="Rejected candidates")
    table.add_column("U x R", key=True)
    table.add_column("layouts", wrap=True)
    table.add_column("rule", wrap=True)
    for r in rejected:
        table.add_row(
            f"{r['ulysses']} x {r['ring']}" + (" ag" if r.get("cp_comm") == "all_gather" else ""),
            ", ".join(r["layouts"]),
            Text(r["rule"]),
        )
    return table


def _settings_lines(settings: str) -> str:
    """One command-line flag (or one call) per line, so a flag never parts from its value."""
    return settings.replace(" --", "\n--").replace("; ", ";\n")


def _frameworks_table(frameworks: Sequence[Mapping[str, Any]], notes: bool = True) -> FitTable:
    table = FitTable(title="Settings for the winner", narrow="stack")
    table.add_column("framework", key=True, wrap=True)
    table.add_column("settings", wrap=True)
    if notes:
        table.add_column("note", wrap=True)
    for f in frameworks:
        name = f["framework"] if f["expressible"] else f"{f['framework']} (cannot express it)"
        note = (Text(setting_note(f)),) if notes else ()
        table.add_row(Text(name), Text(_settings_lines(f["settings"])), *note)
    return table


def _comm_suffix(candidate: Mapping[str, Any]) -> str:
    """` ag` (and `/hs<stride>`) for an all-gather candidate, nothing for the ring."""
    if candidate.get("cp_comm") != "all_gather":
        return ""
    stride = candidate.get("heads_k_stride")
    return " ag" if stride is None else f" ag/hs{stride}"
