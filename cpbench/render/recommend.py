"""Rich renderables of the recommend, calibrate and validate reports (the dicts that
`cpbench.app.recommend` and `cpbench.app.calibrate` return)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from cpbench.units import GB, GIB


def render_recommendation(report: Mapping[str, Any]) -> list[RenderableType]:
    """Rich renderables of a recommendation report (the dict of `recommendation_report`)."""
    q, s = report["inputs"], report["parallel"]
    header = Text(
        f"L={q['seq_len']} heads={q['heads']} kv_heads={q['kv_heads']} head_dim={q['head_dim']} "
        f"micro-batch={q['batch']} {q['dtype']} {'causal' if q['causal'] else 'full'} "
        f"{q['phase']} | {q['gpus']} GPUs, {q['gpus_per_node']} per node, {q['hardware']} | "
        f"{s['world_formula']}"
    )
    out: list[RenderableType] = [header]
    if s["tp"] > 1:
        out.append(
            Text(
                f"TP {s['tp']} splits the heads first: CP works on {s['attention_heads_per_tp_rank']} "
                f"query / {s['kv_heads_per_tp_rank']} KV heads per TP rank."
            )
        )
    if report["candidates"]:
        out.append(_candidates_table(report))
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
                f"{cal['residual_before']:.1%} -> {cal['residual']:.1%}.",
                style="dim",
            )
        )
    return out


def _candidates_table(report: Mapping[str, Any]) -> Table:
    shown, feasible = len(report["candidates"]), report["feasible"]
    more = f" (top {shown} of {feasible}; --top 0 lists all)" if shown < feasible else ""
    table = Table(title=f"Feasible candidates, fastest first{more}")
    for col in (
        "#",
        "U x R",
        "layout",
        "KV rep",
        "time ms",
        "compute",
        "imbalance",
        "exposed comm",
        "intra GB",
        "inter GB",
        "mem GiB",
        "max L",
        "source",
    ):
        table.add_column(col, justify="left" if col in ("U x R", "layout", "source") else "right")
    for c in report["candidates"]:
        tiers = c["bytes_per_tier"]
        table.add_row(
            str(c["rank"]),
            f"{c['ulysses']} x {c['ring']}",
            c["layout"] if c["layout_matters"] else "any",
            f"x{c['kv_replication']}",
            f"{c['time_s'] * 1e3:.2f}",
            f"{c['compute_s'] * 1e3:.2f}",
            f"{c['imbalance_s'] * 1e3:.2f}",
            f"{c['exposed_comm_s'] * 1e3:.2f}",
            f"{tiers['intra_node'] / GB:.3f}",
            f"{tiers['inter_node'] / GB:.3f}",
            f"{c['memory_bytes'] / GIB:.2f}",
            str(c["max_seq_len"]),
            c["source"],
        )
    return table


def _rejected_table(rejected: Sequence[Mapping[str, Any]]) -> Table:
    table = Table(title="Rejected candidates")
    table.add_column("U x R")
    table.add_column("layouts")
    table.add_column("rule")
    for r in rejected:
        table.add_row(f"{r['ulysses']} x {r['ring']}", ", ".join(r["layouts"]), r["rule"])
    return table


def _frameworks_table(frameworks: Sequence[Mapping[str, Any]]) -> Table:
    table = Table(title="Settings for the winner")
    table.add_column("framework")
    table.add_column("settings")
    table.add_column("note")
    for f in frameworks:
        name = f["framework"] if f["expressible"] else f"{f['framework']} (cannot express it)"
        table.add_row(name, f["settings"], f["note"])
    return table



def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def render_validation(report: Mapping[str, Any]) -> list[RenderableType]:
    """Rich renderables of a validate report."""
    title = f"Predicted vs measured ({report['mode']}, profile {report['profile']})"
    if report["mode"] == "holdout":
        title += (
            f": calibrated on {report['n_train']}, predicting {report['n_test']} held out "
            f"({report['split']} split, seed {report['seed']})"
        )
    table = Table(title=title)
    for col in ("configuration", "measured ms", "predicted ms", "error"):
        table.add_column(col, justify="left" if col == "configuration" else "right")
    for r in report["rows"]:
        table.add_row(
            r["config"],
            f"{r['measured_s'] * 1e3:.2f}",
            f"{r['predicted_s'] * 1e3:.2f}",
            f"{r['error']:+.1%}",
        )
    summary = Text(
        f"median |error| {_pct(report['median_abs_error'])}, max |error| "
        f"{_pct(report['max_abs_error'])}, Spearman {_num(report['spearman'])}, regret of the "
        f"model's pick {_pct(report['regret'])} (worst group; mean {_pct(report['regret_mean'])})"
    )
    out: list[RenderableType] = [table, summary]
    for g in report.get("groups", []):
        if g["configurations"] > 1:
            out.append(
                Text(
                    f"  group of {g['configurations']}: model picks {g['chosen']}, measured best "
                    f"{g['best']}, regret {_pct(g['regret'])}",
                    style="dim",
                )
            )
    calibration = report.get("calibration")
    if calibration:
        out.append(render_calibration(calibration))
    return out


def render_calibration(report: Mapping[str, Any]) -> RenderableType:
    """Rich renderable of a calibration summary."""
    table = Table(
        title=(
            f"Calibration of {report['prior']} on {report['points']} measurements: RMS relative "
            f"step-time error {report['residual_before']:.1%} -> {report['residual']:.1%}"
        )
    )
    for col in ("fit", "parameter", "prior", "fitted", "unit", "points"):
        table.add_column(col, justify="right" if col in ("prior", "fitted", "points") else "left")
    for fit in report["fits"]:
        label = (
            f"{fit['target']} ({fit['points']} pts, RMS {fit['residual_before']:.1%} -> "
            f"{fit['residual_after']:.1%})"
        )
        for i, param in enumerate(fit["parameters"]):
            table.add_row(
                label if i == 0 else "",
                param["name"],
                f"{param['prior']:.4g}",
                f"{param['fitted']:.4g}",
                param["unit"],
                str(param["points"]),
            )
    notes = [Text(f"note: {n}", style="dim") for n in report["notes"]]
    if report.get("output"):
        notes.append(Text(f"wrote {report['output']} (load it with --hardware {report['output']})"))
    return Group(table, *notes)
