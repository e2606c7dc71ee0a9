"""Rich renderables of the recommend, calibrate and validate reports (the dicts that
`cpbench.app.recommend` and `cpbench.app.calibrate` return)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from cpbench.render.tables import FitTable
from cpbench.units import format_gb, format_gib, format_number, format_percent, format_seconds


def render_recommendation(report: Mapping[str, Any]) -> list[RenderableType]:
    """Rich renderables of a recommendation report (the dict of `recommendation_report`)."""
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
        out.append(_candidates_table(report))
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
    out.append(Text("Why: " + report["explanation"]))
    if report["frameworks"]:
        out.append(_frameworks_table(report["frameworks"]))
    out.append(Text(f"{s['world_formula']}; {s['global_batch_formula']}"))
    out.append(Text(f"Conventions: {report['conventions']['time']}.", style="dim"))
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


def _candidates_table(report: Mapping[str, Any]) -> FitTable:
    shown, feasible = len(report["candidates"]), report["feasible"]
    more = f" (top {shown} of {feasible}; --top 0 lists all)" if shown < feasible else ""
    masked = report["inputs"].get("mask", "causal") not in ("causal", "full")
    caption = (
        "times in ms per attention layer and micro-batch; GB = 1e9 bytes per rank and "
        "layer; mem GiB per rank; max L in tokens"
    )
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
    for col in (
        "#",
        "U x R",
        "layout",
        "KV rep",
        "time ms",
        "±",
        "compute ms",
        "imbalance ms",
        "exposed comm ms",
        "intra GB",
        "inter GB",
        "mem GiB",
        "max L",
        *mask_columns,
        "source",
    ):
        table.add_column(
            col,
            justify="left" if col in ("U x R", "layout", "source") else "right",
            key=col in ("#", "U x R", "layout"),
        )
    for c in report["candidates"]:
        tiers = c["bytes_per_tier"]
        pm = (c.get("interval") or {}).get("plus_minus")
        table.add_row(
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


def _frameworks_table(frameworks: Sequence[Mapping[str, Any]]) -> FitTable:
    table = FitTable(title="Settings for the winner", narrow="stack")
    table.add_column("framework", key=True, wrap=True)
    table.add_column("settings", wrap=True)
    table.add_column("note", wrap=True)
    for f in frameworks:
        name = f["framework"] if f["expressible"] else f"{f['framework']} (cannot express it)"
        table.add_row(Text(name), Text(_settings_lines(f["settings"])), Text(f["note"]))
    return table


def render_validation(report: Mapping[str, Any]) -> list[RenderableType]:
    """Rich renderables of a validate report."""
    title = f"Predicted vs measured ({report['mode']}, profile {report['profile']})"
    if report["mode"] == "holdout":
        title += (
            f": calibrated on {report['n_train']}, predicting {report['n_test']} held out "
            f"({report['split']} split, seed {report['seed']})"
        )
    table = FitTable(title=title)
    for col in ("configuration", "measured ms", "predicted ms", "error"):
        table.add_column(
            col,
            justify="left" if col == "configuration" else "right",
            key=col == "configuration",
            wrap=col == "configuration",
        )
    for r in report["rows"]:
        table.add_row(
            Text(r["config"]),
            format_seconds(r["measured_s"], 2, unit=False),
            format_seconds(r["predicted_s"], 2, unit=False),
            format_percent(r["error"], sign=True),
        )
    summary = Text(
        f"median |error| {format_percent(report['median_abs_error'])}, max |error| "
        f"{format_percent(report['max_abs_error'])}, Spearman {format_number(report['spearman'])}, regret of the "
        f"model's pick {format_percent(report['regret'])} (worst group; mean {format_percent(report['regret_mean'])})"
    )
    out: list[RenderableType] = [table, summary]
    out += [Text(f"warning: {w}", style="yellow") for w in report.get("warnings", [])]
    for g in report.get("groups", []):
        if g["configurations"] > 1:
            out.append(
                Text(
                    f"  group of {g['configurations']}: model picks {g['chosen']}, measured best "
                    f"{g['best']}, regret {format_percent(g['regret'])}",
                    style="dim",
                )
            )
    calibration = report.get("calibration")
    if calibration:
        out.append(render_calibration(calibration))
    return out


def render_calibration(report: Mapping[str, Any]) -> RenderableType:
    """Rich renderable of a calibration summary."""
    table = FitTable(
        title=(
            f"Calibration of {report['prior']} on {report['points']} measurements: RMS relative "
            f"step-time error {format_percent(report['residual_before'])} -> "
            f"{format_percent(report['residual'])}"
        ),
        caption="prior and fitted in the unit of the unit column (no unit: dimensionless)",
    )
    for col in ("fit", "parameter", "prior", "fitted", "unit", "points"):
        table.add_column(
            col,
            justify="right" if col in ("prior", "fitted", "points") else "left",
            key=col == "parameter",
            wrap=col in ("fit", "parameter"),
        )
    for fit in report["fits"]:
        label = (
            f"{fit['target']} ({fit['points']} pts, RMS {format_percent(fit['residual_before'])} "
            f"-> {format_percent(fit['residual_after'])})"
        )
        for i, param in enumerate(fit["parameters"]):
            table.add_row(
                Text(label if i == 0 else ""),
                Text(param["name"]),
                f"{param['prior']:.4g}",
                f"{param['fitted']:.4g}",
                param["unit"],
                str(param["points"]),
            )
    notes = [Text(f"warning: {w}", style="yellow") for w in report.get("warnings", [])]
    notes += [Text(f"note: {n}", style="dim") for n in report["notes"]]
    if report.get("output"):
        notes.append(Text(f"wrote {report['output']} (load it with --hardware {report['output']})"))
    return Group(table, *notes)


def _comm_suffix(candidate: Mapping[str, Any]) -> str:
    """` ag` (and `/hs<stride>`) for an all-gather candidate, nothing for the ring."""
    if candidate.get("cp_comm") != "all_gather":
        return ""
    stride = candidate.get("heads_k_stride")
    return " ag" if stride is None else f" ag/hs{stride}"
