"""Rich renderables of a recommendation report (the dict of `recommendation_report`): the
header, the ranked and rejected tables, the short why (or with `--explain` the full
explanation) and the framework settings."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import RenderableType
from rich.text import Text

from cpbench.render.recommend.explanation import explanation_text, group_digits, why_lines
from cpbench.render.recommend.frameworks import (
    caveat_text,
    closest_label,
    is_alternative,
    setting_note,
)
from cpbench.render.tables import FitTable
from cpbench.units import format_gb, format_gib, format_percent, format_seconds

_TIE_BREAK_WORDS = {
    "memory": "the longest sequence that fits",
    "exposed_bytes": "the fewest exposed bytes",
    "simpler_setting": "the simplest framework setting",
    "fastest": "the fastest prediction",
    "measured": "the measured medians",
}
"""The tie-break rule that named the pick (`TieBreak`), in a few words for the headline."""


def headline(report: Mapping[str, Any]) -> str:
    """The verdict first, in one sentence: the pick, its time and how sure the pick is."""
    w, tie, u = report["winner"], report.get("tie"), report.get("uncertainty")
    if w is None:
        return (
            f"No candidate is feasible: all {len(report['rejected']):,} are rejected "
            "(the rules are below)."
        )
    how = "measured" if w["source"] == "measured" else "predicted"
    pm = (w.get("interval") or {}).get("plus_minus")
    sure = "" if pm is None else f" ±{pm:.0%}"
    text = f"Pick: {w['label']}, {how} {format_seconds(w['time_s'], 2)}{sure} ({report['inputs']['phase']})"
    e = report.get("explanation") or {}
    second = e.get("runner_up")
    if tie and not tie["clear"]:
        others = tie["tied"] - 1
        if tie["measured"]:
            within = "(their measured 95% intervals overlap)"
        elif u and u.get("ratio_sigma") is not None:
            within = f"within x{math.exp(u['ratio_sigma']):.2f} (the ratio's uncertainty)"
        else:
            within = "within the model's uncertainty"
        rule = _TIE_BREAK_WORDS.get(tie["decided_by"], tie["decided_by"])
        if tie["decided_by"] == "memory":
            rule += f" ({w['max_seq_len']:,} tokens)"
        return f"{text}, tied with {others:,} other{'s' * (others != 1)} {within}; named by {rule}."
    if second is None:
        return f"{text}: the only feasible candidate."
    return (
        f"{text}: {e['margin']:.1%} ahead of {second['label']} "
        f"({format_seconds(second['time_s'], 2)}), a clear winner."
    )


def _without(text: str, source: str) -> str:
    """A message without the uncertainty's source (printed once, above the table)."""
    if not source:
        return text
    return text.replace(f"; {source}", "").replace(f" ({source})", "").replace(f", {source}", "")


def tie_text(tie: Mapping[str, Any], source: str) -> str:
    """The tie message of `--explain`: every tied candidate listed, without the uncertainty's
    source (said once above the table) and without the tie-break (the explanation says it)."""
    text = _without(tie["message"], source).replace(f"; pick {tie['pick']}: {tie['decision']}", "")
    labels = tie["labels"]
    for k in range(len(labels) - 1, 0, -1):
        listed = ", ".join(labels[:k]) + f" and {len(labels) - k} more"
        if listed in text:
            return text.replace(listed, ", ".join(labels))
    return text


def render_recommendation(report: Mapping[str, Any], explain: bool = False) -> list[RenderableType]:
    """Rich renderables of a recommendation report (the dict of `recommendation_report`): what
    fits one screen (the verdict, the ranked table, why in two sentences, the winner's
    settings), or with `explain` every column, the tie, the full explanation, every
    framework's notes and the all-gather alternative."""
    q, s = report["inputs"], report["parallel"]
    out: list[RenderableType] = [Text(headline(report), style="bold")]
    out.append(
        Text(
            f"L={q['seq_len']:,} heads={q['heads']} kv_heads={q['kv_heads']} "
            f"head_dim={q['head_dim']} micro-batch={q['batch']} {q['dtype']} "
            f"{group_digits(q.get('mask_label') or ('causal' if q['causal'] else 'full'))} "
            f"{q['phase']} | {q['gpus']:,} GPUs, {q['gpus_per_node']} per node, {q['hardware']} | "
            f"{group_digits(s['world_formula'])}"
        )
    )
    u = report.get("uncertainty")
    source = u["source"] if u else ""
    if u and u["kind"] == "prior":
        out.append(
            Text(
                f"±{u['sigma']:.0%}: {source}. Run `cpbench probe` on the machine (or pass "
                "--results of `cpbench sweep`) to calibrate.",
                style="yellow",
            )
        )
    elif u:
        out.append(Text(f"Uncertainty: ±{u['sigma']:.0%} ({source}).", style="dim"))
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
    if tie and explain:
        out.append(
            Text(
                ("Tie: " if not tie["clear"] else "") + group_digits(tie_text(tie, source)) + ".",
                style="bold yellow" if not tie["clear"] else "bold",
            )
        )
    if report["rejected"]:
        out.append(_rejected_table(report["rejected"]))
    e = report["explanation"]
    if explain or e is None:
        out.append(Text("Why: " + explanation_text(e, len(report["rejected"]))))
    else:
        out.append(Text("\n".join(why_lines(e)[1:])))
    winners = [f for f in report["frameworks"] if not is_alternative(f)]
    others = [f for f in report["frameworks"] if is_alternative(f)]
    shown = winners + others * explain
    shared = shared_notes(shown) if explain else {}
    if winners:
        out.append(_frameworks_table(winners, explain, "Settings for the winner", shared))
    if others and explain:
        out.append(_frameworks_table(others, explain, "Settings of an alternative", shared))
    out += [Text(f"{', '.join(names)}: {text}.") for text, names in shared.items()]
    out.append(Text(group_digits(s["global_batch_formula"])))
    if explain:
        out.append(Text(f"Conventions: {report['conventions']['time']}.", style="dim"))
    else:
        out.append(
            Text(
                "--explain adds every column, the tie, the full why, the caveats"
                + (" and the all-gather alternative" if others else "")
                + (
                    "; --write-scenario PATH writes the tie for `cpbench sweep` to measure."
                    if tie and not tie["clear"]
                    else "."
                ),
                style="dim",
            )
        )
    if report["calibration"]:
        cal = report["calibration"]
        out.append(
            Text(
                f"Calibrated {cal['prior']} on {cal['points']:,} measurements: RMS relative error "
                f"{format_percent(cal['residual_before'])} -> {format_percent(cal['residual'])}.",
                style="dim",
            )
        )
    return out


BRIEF_COLUMNS = ("#", "mesh", "time ms", "±", "imbalance ms", "exposed comm ms", "mem GiB",
                 "max L", "work x", "steps", "pad", "source")
"""The columns of the default (one-screen) ranked table: `mesh` merges U x R, layout and the
exchange; `--explain` shows every column apart. Under a mask `work x` stands for the
imbalance; `±` only when it differs between rows; `source` only when a row is measured."""


def _mesh_label(c: Mapping[str, Any]) -> str:
    return f"{c['ulysses']} x {c['ring']} " + (c["layout"] if c["layout_matters"] else "any")


def _candidates_table(report: Mapping[str, Any], explain: bool = True) -> FitTable:
    shown, feasible = len(report["candidates"]), report["feasible"]
    more = f" (top {shown:,} of {feasible:,}; --top 0 lists all)" if shown < feasible else ""
    masked = report["inputs"].get("mask", "causal") not in ("causal", "full")
    measured = any(c["source"] == "measured" for c in report["candidates"])
    pms = {(c.get("interval") or {}).get("plus_minus") for c in report["candidates"]}
    same_pm = not explain and len(pms) == 1 and None not in pms
    caption = ("times in ms per attention layer and micro-batch; " if explain else "ms per layer "
               "and micro-batch; ") + ("GB = 1e9 bytes per rank and layer; " if explain else "")
    caption += "mem GiB per rank; max L in tokens"
    if same_pm:
        caption += f"; every time ±{next(iter(pms)):.0%} (one sigma)"
    else:
        caption += "; ± = " + (
            "one sigma of the predicted time (time x e^±sigma)"
            if report.get("uncertainty")
            else "the interval"
        )
    if measured:
        # scipy (behind stats) only when measured rows are drawn: `cpbench --help` stays light
        from cpbench.model.ties import TIE_RULE  # noqa: PLC0415

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
    columns = ("#", "mesh", "U x R", "layout", "KV rep", "time ms", "±", "compute ms",
               "imbalance ms", "exposed comm ms", "intra GB", "inter GB", "mem GiB", "max L",
               *mask_columns, "source")
    left_out = (
        ("mesh",)
        if explain
        else ("imbalance ms",) * masked + ("source",) * (not measured) + ("±",) * same_pm
    )
    visible = [c for c in columns if (explain or c in BRIEF_COLUMNS) and c not in left_out]
    for col in visible:
        table.add_column(
            col,
            justify="left" if col in ("mesh", "U x R", "layout", "source") else "right",
            key=col in ("#", "mesh", "U x R", "layout"),
        )
    for c in report["candidates"]:
        tiers = c["bytes_per_tier"]
        pm = (c.get("interval") or {}).get("plus_minus")
        cells = (
            str(c["rank"]) + ("=" if c.get("tied") and c["rank"] > 1 else ""),
            _mesh_label(c) + _comm_suffix(c),
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
            f"{c['max_seq_len']:,}",
            *(
                (
                    f"{c['work_imbalance']:.2f}",
                    f"{c['ring_steps']}/{c['ring']}",
                    f"{c['padding_tokens']:,}",
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
            Text(group_digits(r["rule"])),
        )
    return table


def _settings_lines(settings: str) -> str:
    """One command-line flag (or one call) per line, so a flag never parts from its value."""
    return settings.replace(" --", "\n--").replace("; ", ";\n")


def shared_notes(frameworks: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Caveat texts that more than one setting carries, with the frameworks that carry each
    (printed once, under the settings)."""
    carriers: dict[str, list[str]] = {}
    for f in frameworks:
        for text in dict.fromkeys(caveat_text(c) for c in f.get("caveats", ())):
            carriers.setdefault(text, []).append(f["framework"])
    return {text: names for text, names in carriers.items() if len(names) > 1}


def _frameworks_table(
    frameworks: Sequence[Mapping[str, Any]],
    notes: bool,
    title: str,
    shared: Mapping[str, Sequence[str]],
) -> FitTable:
    """The settings table (with `notes` each row's own caveats; the `shared` ones are printed
    once under it): a framework that cannot express the pick is labelled with what its setting
    runs instead (`closest_label`)."""
    table = FitTable(title=title, narrow="stack")
    table.add_column("framework", key=True, wrap=True)
    table.add_column("settings", wrap=True)
    if notes:
        table.add_column("note", wrap=True)
    for f in frameworks:
        label = closest_label(f)
        settings = _settings_lines(f["settings"])
        if label:
            settings = f"{label}:\n{settings}" if label.startswith("closest") else label
        note: tuple[Text, ...] = ()
        if notes:
            caveats = f.get("caveats", ())
            own = [t for t in dict.fromkeys(caveat_text(c) for c in caveats) if t not in shared]
            note = (Text("; ".join(own) + "." if own else "" if caveats else setting_note(f)),)
        table.add_row(Text(f["framework"]), Text(settings), *note)
    return table


def _comm_suffix(candidate: Mapping[str, Any]) -> str:
    """` ag` (and `/hs<stride>`) for an all-gather candidate, nothing for the ring."""
    if candidate.get("cp_comm") != "all_gather":
        return ""
    stride = candidate.get("heads_k_stride")
    return " ag" if stride is None else f" ag/hs{stride}"
