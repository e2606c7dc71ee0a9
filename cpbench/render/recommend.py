"""Rich renderables of the recommend, calibrate and validate reports (the dicts that
`cpbench.app.recommend` and `cpbench.app.calibrate` return)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from cpbench.render.tables import FitTable
from cpbench.units import format_gb, format_gib, format_number, format_percent, format_seconds


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


# ------------------------------------------------------------------ words of the facts

Facts = Mapping[str, Any]
"""`dataclasses.asdict` of an `Explanation`, a `Placement` or a `Caveat` (the `--json` form)."""


def _ms(seconds: float) -> str:
    return format_seconds(seconds, 2)


def placement_text(p: Facts) -> str:
    """Where a mesh's groups sit and which tier each collective uses, one clause a stage."""
    u, r = p["ulysses"], p["ring"]
    parts: list[str] = []
    if u > 1 and p["ulysses_tier"] == "intra_node":
        parts.append(f"each Ulysses group ({u} consecutive ranks) stays inside a node")
    elif u > 1:
        k = p["ulysses_peers_in_node"]
        parts.append(
            f"a Ulysses group of {u} spans nodes ({k} peers per node): "
            f"{Fraction(u - k, u - 1)} of its all-to-all bytes cross nodes"
        )
    if r > 1:
        stride = f"strided by {u}" if u > 1 else "consecutive"
        parts.append(
            f"the ring of {r} ({stride}) stays inside a node"
            if p["ring_tier"] == "intra_node"
            else f"the ring of {r} ({stride}) crosses nodes on {p['ring_crossing_hops']} of "
            f"{r} hops, which pace every step"
        )
    return "; ".join(parts) or "a single rank: no communication"


def _pick(e: Facts) -> str:
    w, second = e["winner"], e["runner_up"]
    text = (
        f"{w['label']} is {'measured' if e['measured'] else 'predicted'} fastest at "
        f"{_ms(w['time_s'])} per layer ({e['phase']})"
    )
    if second is None:
        return text + ", the only feasible mesh"
    return (
        f"{text}, {e['margin']:.1%} ahead of the next mesh, {second['label']} "
        f"({_ms(second['time_s'])})"
    )


def _balance(e: Facts, brief: bool = False) -> str:
    kind = e["balance"]
    if kind == "ulysses_any_mask" and not brief:
        return (
            f"Ulysses is balanced under any mask ({e['mask_label']}): after the all-to-all "
            f"every rank sees the whole ring-level sequence with h/U = {e['heads_per_rank']} "
            "head(s), so the document mix and the window cost neither imbalance nor padding "
            "nor extra hops."
        )
    if kind == "ulysses" and not brief:
        return (
            "No causal imbalance: after the all-to-all every rank holds the whole sequence for "
            "its share of the heads."
        )
    return {
        "no_mask": "Without a causal mask every rank does the same work.",
        "ulysses_any_mask": "No imbalance (Ulysses is balanced under any mask).",
        "ulysses": "No causal imbalance.",
        "balanced": f"Balanced causal work ({e['layout']}: slowest / mean rank "
        f"{e['work_imbalance']:.2f}).",
        "imbalanced": f"The {e['layout']} layout leaves causal imbalance (slowest / mean rank "
        f"{e['work_imbalance']:.2f}, {_ms(e['imbalance_s'])} per step).",
        "masked": f"The {e['layout']} layout runs at {e['work_imbalance']:.2f}x the mean work "
        f"under {e['mask_label']}.",
    }[kind]


def _memory(e: Facts) -> str:
    w = e["winner"]
    return (
        f"It needs {format_gib(w['memory_bytes'])} per rank of "
        f"{format_gib(e['memory_capacity_bytes'], 1)} (attention layer lower bound); the longest "
        "sequence that fits this "
        f"mesh is {w['max_seq_len']} tokens."
    )


def why_lines(e: Facts) -> list[str]:
    """The pick and why in three sentences (the margin; placement and exposed communication;
    balance and memory): what `recommend` prints by default."""
    w, second, p = e["winner"], e["runner_up"], e["placement"]
    ahead = (
        f"{e['margin']:.1%} ahead of {second['label']} ({_ms(second['time_s'])})"
        if second
        else "the only feasible mesh"
    )
    where = [
        f"{name} of {n} " + ("inside a node" if tier == "intra_node" else f"across nodes{hops}")
        for name, n, tier, hops in (
            ("Ulysses", p["ulysses"], p["ulysses_tier"], ""),
            ("ring", p["ring"], p["ring_tier"], f" ({p['ring_crossing_hops']} of {p['ring']} hops)"),
        )
        if n > 1
    ]
    return [
        f"Pick: {w['label']}, {'measured' if e['measured'] else 'predicted'} {_ms(w['time_s'])} "
        f"({e['phase']}), {ahead}.",
        f"Why: {', '.join(where) or 'one rank'}; {_ms(w['exposed_comm_s'])} of "
        f"{_ms(w['comm_s'])} communication exposed.",
        f"{_balance(e, brief=True)} {format_gib(w['memory_bytes'])} of "
        f"{format_gib(e['memory_capacity_bytes'], 1)} per rank; fits up to {w['max_seq_len']} "
        "tokens.",
    ]


def explanation_text(e: Facts | None, rejected: int = 0) -> str:
    """The full explanation (`recommend --explain`, the HTML report): one paragraph."""
    if e is None:
        return (
            f"No candidate is feasible: all {rejected} are rejected; see the rules above "
            "(change the CP degree, the sequence length, or the hardware)."
        )
    w = e["winner"]
    pick = _pick(e)
    if e["same_mesh_ties"]:
        pick += (
            f" ({', '.join(e['same_mesh_ties'])} on the same mesh ties; zigzag is preferred: "
            "frameworks support it)"
        )
    sent = ", ".join(
        f"{format_gb(x['bytes'], 2)} of "
        f"{'all-to-all' if x['kind'] == 'all_to_all' else 'ring send/recv'} on {x['link']}"
        for x in e["links"]
    )
    hiding = (
        "the first all-gather of each pass hides only behind the own chunk, the last "
        "reduce-scatter waits, later strides travel behind the kernels"
        if e["all_gather"]
        else "ring hops hide behind the kernels when a step's compute is longer than its hop"
    )
    parts = [
        pick + ".",
        f"Placement: {placement_text(e['placement'])}"
        + (f"; per rank and layer it sends {sent}." if sent else "."),
        f"Of {_ms(w['comm_s'])} of communication, {_ms(w['exposed_comm_s'])} stays exposed "
        f"(all-to-all is never overlapped; {hiding}).",
    ]
    if e["balance"] != "masked":
        parts.append(_balance(e))
    parts += _mask_sentences(e["mask"]) + _gather_sentences(e["gather"])
    rep = e["kv_replication"]
    parts.append(
        f"The kernel works on L/R = {e['kernel_seq_len']} tokens at {e['attention_tflops']:.1f} "
        f"TFLOP/s per rank; {e['heads_per_rank']} query head(s) and {e['kv_heads_per_rank']} KV "
        "head(s) per rank after the all-to-all"
        + (f" (KV heads replicated x{rep})." if rep > 1 else ".")
        + f" Compute model: {e['curve_note']}."
    )
    return " ".join([*parts, _memory(e)])


def _padding(x: Facts) -> str:
    if not x["padding"]:
        return "no padding"
    return f"{x['padding']} padding tokens (+{x['padding_fraction']:.2%} pairs)"


def _mask_sentences(m: Facts | None) -> list[str]:
    if m is None:
        return []
    r, layouts, out = m["ring"], m["layouts"], []
    if m["fallback"] is not None:
        out.append(
            "Should a ring be needed (more ranks than KV heads allow, or an inter-node "
            f"all-to-all), the fastest ring mesh is {m['fallback']['label']} "
            f"({_ms(m['fallback']['time_s'])})."
        )
    pieces = []
    if m["documents"]:
        if "zigzag" in layouts:
            z = layouts["zigzag"]
            pieces.append(
                f"global zigzag leaves ring rank {z['slowest_ring_rank']} with "
                f"{z['work_imbalance']:.2f}x the mean work on this document mix "
                f"({m['documents']} documents)"
            )
        if "balanced" in layouts:
            pieces.append(
                f"the balanced layout brings it to {layouts['balanced']['work_imbalance']:.2f}x "
                "with no padding"
            )
        if "doc_zigzag" in layouts:
            d = layouts["doc_zigzag"]
            pieces.append(f"doc_zigzag is at {d['work_imbalance']:.2f}x with {_padding(d)}")
    if pieces:
        out.append(f"On {m['ulysses']}x{r}: " + "; ".join(pieces) + ".")
    contiguous, zigzag = layouts.get("contiguous"), layouts.get("zigzag")
    if m["window"] is not None and contiguous is not None:
        k = contiguous["ring_steps"]
        if k == r:
            out.append(
                f"The window ({m['window']} tokens) saves no ring step on a ring of {r}: every "
                "step has keys some query sees."
            )
        else:
            text = (
                f"The window ({m['window']} tokens) needs {k} of {r} ring steps on contiguous "
                f"({k - 1} K/V hops instead of {r - 1})"
            )
            if zigzag is not None:
                text += f"; zigzag needs {zigzag['ring_steps']}" + (
                    " (all of them)" if zigzag["ring_steps"] == r else ""
                )
            out.append(text + ".")
    elif m["window"] is None and m["documents"]:
        listed = ", ".join(f"{n} {x['ring_steps']}" for n, x in layouts.items() if x["ring_steps"] < r)
        if listed:
            out.append(
                f"No query sees past its document, so some layouts run fewer than {r} ring "
                f"steps ({listed})."
            )
    b = m["best"]
    out.append(
        f"The {'winner' if m['winner'] else 'fastest ring mesh'}'s {b['layout']} layout runs "
        f"{b['ring_steps']} of {r} ring steps at {b['work_imbalance']:.2f}x the mean work "
        f"(slowest ring rank {b['slowest_ring_rank']}) with {_padding(b)}."
    )
    return out


def _brief(x: Facts, exposed: bool = False) -> str:
    """`label (time[, exposed, memory])`."""
    more = (
        f", {_ms(x['exposed_comm_s'])} exposed, {format_gib(x['memory_bytes'])}" if exposed else ""
    )
    return f"{x['label']} ({_ms(x['time_s'])}{more})"


def _gather_sentences(g: Facts | None) -> list[str]:
    if g is None:
        return []
    a = g["best"]
    stride = (
        " (one stride: the gather hides only behind the own chunk, 1/R of the work, and the "
        "whole reduce-scatter waits after the last kernel)"
        if g["gathers"] == 1
        else f" ({g['gathers']} strides of {g['stride']} KV head(s): only the first gather and "
        "the last reduce-scatter wait)"
    )
    out = [
        f"All-gather: its best candidate, {_brief(a)}, gathers the K/V of the whole sequence "
        f"({g['kv_heads_per_rank']} KV head(s) per rank, {format_gb(g['received_bytes'], 2)} "
        f"received per rank per forward) and leaves {_ms(a['exposed_comm_s'])} of its "
        f"{_ms(a['comm_s'])} of communication exposed{stride}."
    ]
    ring = g["ring"]
    if ring is not None:
        verdict = "wins" if a["time_s"] < ring["time_s"] else "loses"
        out.append(
            f"Against the ring on the same mesh, {_brief(ring)}, whose K/V hops hide behind "
            f"compute ({_ms(ring['exposed_comm_s'])} of {_ms(ring['comm_s'])} exposed), "
            f"all-gather {verdict} by {abs(a['time_s'] / ring['time_s'] - 1):.1%}; it holds "
            f"{format_gib(a['memory_bytes'])} per rank ({format_gib(a['gathered_bytes'])} of "
            f"gathered K/V, growing with L) against the ring's {format_gib(ring['memory_bytes'])}, "
            f"so its longest sequence that fits is {a['max_seq_len']} tokens against "
            f"{ring['max_seq_len']}."
        )
    if g["pure"] is not None:
        pa, pr = g["pure"]
        out.append(
            f"Without Ulysses, {_brief(pa, True)} against {_brief(pr, True)}: with U > 1 the "
            "all-to-all cuts the KV heads by U first, so the all-gather moves 2 L d_kv / U per "
            "rank."
        )
    if g["strided"] is not None:
        s, w, n = g["strided"]
        out.append(
            f"A head stride of {n} on {s['label']} ({_ms(s['time_s'])}, against "
            f"{_ms(w['time_s'])} unstrided) holds {format_gib(s['gathered_bytes'])} of gathered "
            f"K/V (two strides in flight) instead of {format_gib(w['gathered_bytes'])} and hides "
            "all but the first gather and the last reduce-scatter, at "
            f"{s['launches']:.0f} kernel launches' overhead instead of {w['launches']:.0f}."
        )
    u = g["fastest_ulysses"]
    if u is not None:
        out.append(
            f"Ulysses {_brief(u)} is {'faster' if u['time_s'] < a['time_s'] else 'slower'}: its "
            "all-to-alls move Q, K/V and O of a shard and are never overlapped, but it holds no "
            "gathered K/V."
        )
    return out


_DOCUMENTS = {
    "Megatron-LM": "THD format (PackedSeqParams with cu_seqlens) and every sequence padded to a "
    "multiple of 2 x CP (Transformer Engine's per-document zigzag, cpbench's doc_zigzag); it "
    "has no work-balanced layout",
    "DeepSpeed": "Ulysses leaves each rank the whole sequence, so the kernel's own varlen / "
    "document mask applies; whether your DeepSpeed version passes cu_seqlens through the "
    "sequence-parallel all-to-all is unknown to cpbench",
    "yunchang": "cpbench found no varlen (cu_seqlens) entry point documented for "
    "LongContextAttention: unknown; its ring part comes from ring-flash-attn, which has one",
    "torchtitan": "block_causal (document) masks go through FlexAttention "
    "(pytorch/torchtitan#1001); with CP the load balancer changes for block_causal in recent "
    "versions: check that yours supports CP with it",
    "ring-flash-attn": "the llama3 varlen functions take cu_seqlens "
    "(llama3_flash_attn_prepare_cu_seqlens); after the gather every mask is local",
    "all-gather CP": "after the gather every rank holds all K/V, so the document mask is a "
    "local problem (the Llama 3 reason for all-gather CP)",
}
CAVEATS: dict[str, str] = {
    "cp1": "CP = 1: no context parallelism; nothing to set",
    "te_chunks": "Megatron (Transformer Engine) always splits the sequence into 2 x CP chunks "
    "(zigzag-style load balancing)",
    "te_layout": "it cannot run the {name} layout: expect its zigzag equivalent",
    "kv_replication": "the all-to-all needs KV heads replicated x{v[0]}; check that your "
    "Transformer Engine version accepts kv heads < the a2a size",
    "no_a2a_all_gather": "Megatron's --cp-comm-type takes p2p, all_gather, a2a or a2a+p2p (per "
    "layer a list of them): there is no a2a+all_gather, so this U x A all-gather mesh runs as "
    "a2a+p2p (the ring on the second level)",
    "te_all_gather": "all_gather gathers the full K/V before attention with no head stride "
    "(TE's all-gather path); cpbench's stride, if any, has no Megatron flag",
    "ds_ulysses": "DeepSpeed-Ulysses (all-to-all over the sequence-parallel group)",
    "ds_gqa": "KV heads ({v[0]}) < sequence-parallel size ({v[1]}): needs a DeepSpeed version "
    "that replicates KV heads for GQA",
    "ds_ring": "DeepSpeed-Ulysses cannot express a ring (R = {v[0]}): it only does all-to-all "
    "sequence parallelism",
    "no_ulysses_mesh": "no Ulysses-only mesh is feasible",
    "closest_ulysses": "closest: Ulysses {v[0]}x1 (rank {position}, {time})",
    "yunchang": "Ulysses groups are the low (consecutive) ranks (use_ulysses_low=True), as "
    "modelled; shard the inputs with the matching extract function "
    "(EXTRACT_FUNC_DICT['{name}'])",
    "torchtitan": "torchtitan's context parallelism is ring-only with head-tail load balancing "
    "(the zigzag layout); rotate_method alltoall passes K/V shards around the ring like the "
    "modelled ring, allgather (the default) gathers all K/V first",
    "titan_ulysses": "it cannot express Ulysses (U = {v[0]})",
    "closest_ring": "closest: ring 1x{v[0]} zigzag (rank {position}, {time})",
    "no_ring_mesh": "no ring-only mesh is feasible",
    "ag_alternative": "all-gather CP as {candidate} (rank {position}, {time})",
    "ag_best_has_ulysses": "the best all-gather candidate, {candidate} ({time}), combines "
    "Ulysses with the all-gather, which no framework offers",
    "ag_ulysses_megatron": "its Ulysses level (U = {v[0]}) exists only in Megatron, as a2a+p2p "
    "with the ring, and in cpbench",
    "llama3": "ring-flash-attention's all-gather CP (the Llama 3 scheme): K/V gathered over the "
    "CP group in strides of heads_k_stride = {v[0]} KV head(s), the next in flight; it takes "
    "the contiguous (varlen) layout",
    "llama3_layout": "not {name}: expect contiguous's imbalance",
    "gather_only": "all-gather only: it cannot express the Ulysses level (U = {v[0]})",
    "documents": "packed documents: {documents}",
    "ring_flash_documents": "packed documents: zigzag_ring_flash_attn_varlen_func with "
    "cu_seqlens, every document cut into 2 x ring chunks (cpbench's doc_zigzag, each length a "
    "multiple of 2 x ring)",
    "ring_only": "ring only: it cannot express Ulysses (U = {v[0]})",
    "window": "sliding window: cpbench skips the ring steps no query can see; check that the "
    "framework passes the window to its kernels under CP rather than dropping it",
}
"""The words of each framework caveat kind (`cpbench.app.recommend.types.CaveatKind`)."""


def caveat_text(c: Facts) -> str:
    """One caveat in words."""
    return CAVEATS[c["kind"]].format(
        v=c["values"], name=c["name"], candidate=c["candidate"], position=c["position"],
        time=_ms(c["time_s"]), documents=_DOCUMENTS.get(c["name"], ""),
    )


def setting_note(f: Facts) -> str:
    """A framework setting's caveats in words (or `cpbench plan`'s note as written)."""
    text = "; ".join(caveat_text(c) for c in f.get("caveats", ()))
    return text + "." if text else f.get("note", "")
