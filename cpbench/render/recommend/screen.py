"""Rich renderables of a `Recommendation`: the
header, the ranked and rejected tables, the short why (or with `--explain` the full
explanation) and the framework settings."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rich.console import RenderableType
from rich.text import Text

from cpbench.config.vocabulary import PHASE_PASSES, canonical_dtype
from cpbench.render.recommend.explanation import explanation_text, group_digits, why_lines
from cpbench.render.recommend.frameworks import (
    caveat_text,
    closest_label,
    is_alternative,
    setting_note,
)
from cpbench.render.tables import FitTable
from cpbench.units import format_gb, format_gib, format_percent, format_seconds

if TYPE_CHECKING:
    from cpbench.app.recommend.types import (
        FrameworkSetting,
        RankedCandidate,
        Recommendation,
        Rejection,
        TieCall,
    )

_TIE_BREAK_WORDS = {
    "memory": "memory, which binds for a faster one",
    "simpler_setting": "the simpler framework setting of equal predictions",
    "measured": "the measured medians",
}
"""The tie-break rule that named the pick (`TieBreak`), in a few words for the headline."""


def headline(rec: Recommendation) -> str:
    """The verdict first, in one sentence: the pick, its time and how sure the pick is."""
    w, tie, u, e = rec.winner, rec.tie, rec.uncertainty, rec.explanation
    if w is None:
        return (
            f"No candidate is feasible: all {len(rec.rejected):,} are rejected "
            "(the rules are below)."
        )
    how = "measured" if w.source == "measured" else "predicted"
    pm = w.plus_minus
    sure = "" if pm is None else f" ±{pm:.0%}"
    text = f"Pick: {w.label}, {how} {format_seconds(w.time_s, 2)}{sure} ({rec.request.phase})"
    second = e.runner_up if e else None
    if tie and not tie.clear:
        others = len(tie.tied) - 1
        if tie.measured:
            within = "(their measured 95% intervals overlap)"
        elif u and u.split:
            within = f"within x{math.exp(u.split.ratio_sigma):.2f} (the ratio's uncertainty)"
        else:
            within = "within the model's uncertainty"
        close = f"{others:,} other{'s' * (others != 1)} {within}"
        if tie.decided_by == "likeliest":
            return f"{text}: {tie.decision}; {close}."
        rule = _TIE_BREAK_WORDS.get(tie.decided_by, tie.decided_by)
        return f"{text}, tied with {close}; named by {rule}: {tie.decision}."
    if e is None or second is None:
        return f"{text}: the only feasible candidate."
    return (
        f"{text}: {e.margin:.1%} ahead of {second.label} "
        f"({format_seconds(second.time_s, 2)}), a clear winner."
    )


def _without(text: str, source: str) -> str:
    """A message without the uncertainty's source (printed once, above the table)."""
    if not source:
        return text
    return text.replace(f"; {source}", "").replace(f" ({source})", "").replace(f", {source}", "")


def tie_text(tie: TieCall, source: str) -> str:
    """The tie message of `--explain`: every tied candidate listed, without the uncertainty's
    source (said once above the table) and without the tie-break (the explanation says it)."""
    text = _without(tie.message, source).replace(f"; pick {tie.pick.label}: {tie.decision}", "")
    labels = [r.label for r in tie.tied]
    for k in range(len(labels) - 1, 0, -1):
        listed = ", ".join(labels[:k]) + f" and {len(labels) - k} more"
        if listed in text:
            return text.replace(listed, ", ".join(labels))
    return text


def render_recommendation(rec: Recommendation, explain: bool = False) -> list[RenderableType]:
    """Rich renderables of a recommendation: what
    fits one screen (the verdict, the ranked table, why in two sentences, the winner's
    settings), or with `explain` every column, the tie, the full explanation, every
    framework's notes and the all-gather alternative."""
    q, s = rec.request, rec.sizes
    mask = group_digits(rec.mask.label or ("causal" if q.causal else "full"))
    out: list[RenderableType] = [
        Text(headline(rec), style="bold"),
        Text(
            f"L={q.seq_len:,} heads={q.heads} kv_heads={q.kv_heads} "
            f"head_dim={q.head_dim} micro-batch={q.batch} {canonical_dtype(q.dtype)} {mask} "
            f"{q.phase} | {q.gpus:,} GPUs, {rec.gpus_per_node} per node, {rec.profile.name} | "
            f"{group_digits(s.world_formula())}"
        ),
    ]
    u = rec.uncertainty
    source = u.source if u else ""
    if u and u.kind == "prior":
        out.append(Text(f"±{u.sigma:.0%}: {source}. Run `cpbench probe` on the machine (or pass "
                        "--results of `cpbench sweep`) to calibrate.", style="yellow"))
    elif u:
        out.append(Text(f"Uncertainty: ±{u.sigma:.0%} ({source}).", style="dim"))
    out += [Text(f"warning: {w}", style="yellow") for w in rec.warnings]
    if s.tp > 1:
        out.append(Text(f"TP {s.tp} splits the heads first: CP works on {rec.shape.heads} "
                        f"query / {rec.shape.kv_heads} KV heads per TP rank."))
    if rec.ranked:
        out.append(_candidates_table(rec, explain))
    tie = rec.tie
    if tie and explain:
        text = ("Tie: " if not tie.clear else "") + group_digits(tie_text(tie, source)) + "."
        out.append(Text(text, style="bold yellow" if not tie.clear else "bold"))
    if rec.rejected:
        out.append(_rejected_table(rec.rejected))
    e = rec.explanation
    if explain or e is None:
        out.append(Text("Why: " + explanation_text(e, len(rec.rejected))))
    else:
        out.append(Text("\n".join(why_lines(e)[1:])))
    winners = [f for f in rec.frameworks if not is_alternative(f)]
    others = [f for f in rec.frameworks if is_alternative(f)]
    shown = winners + others * explain
    shared = shared_notes(shown) if explain else {}
    if winners:
        out.append(_frameworks_table(winners, explain, "Settings for the winner", shared))
    if others and explain:
        out.append(_frameworks_table(others, explain, "Settings of an alternative", shared))
    out += [Text(f"{', '.join(names)}: {text}.") for text, names in shared.items()]
    out.append(Text(group_digits(s.batch_formula())))
    if explain:
        from cpbench.app.recommend.types import TIME_CONVENTION  # noqa: PLC0415 - scipy behind

        out.append(Text(f"Conventions: {TIME_CONVENTION}.", style="dim"))
    else:
        more = (
            "; --write-scenario PATH writes the tie for `cpbench sweep` to measure."
            if tie and not tie.clear
            else "."
        )
        alternative = " and the all-gather alternative" if others else ""
        out.append(Text("--explain adds every column, the tie, the full why, the caveats"
                        + alternative + more, style="dim"))
    if rec.calibration:
        cal = rec.calibration
        out.append(Text(
            f"Calibrated {cal.prior.name} on {cal.points:,} measurements: RMS relative error "
            f"{format_percent(cal.residual_before)} -> {format_percent(cal.residual)}.",
            style="dim",
        ))
    return out


BRIEF_COLUMNS = ("#", "mesh", "time ms", "±", "imbalance ms", "exposed comm ms", "mem GiB",
                 "max L", "work x", "steps", "pad", "source")
"""The columns of the default (one-screen) ranked table: `mesh` merges U x R, layout and the
exchange; `--explain` shows every column apart. Under a mask `work x` stands for the
imbalance; `±` only when it differs between rows; `source` only when a row is measured."""


def _candidates_table(rec: Recommendation, explain: bool = True) -> FitTable:
    from cpbench.app.recommend.types import layout_label  # noqa: PLC0415 - scipy behind

    listed = rec.listed
    shown, feasible = len(listed), len(rec.ranked)
    more = f" (top {shown:,} of {feasible:,}; --top 0 lists all)" if shown < feasible else ""
    masked = rec.mask.kind not in ("causal", "full")
    measured = any(r.source == "measured" for r in listed)
    pms = {r.plus_minus for r in listed}
    same_pm = not explain and len(pms) == 1 and None not in pms
    caption = ("times in ms per attention layer and micro-batch; " if explain else "ms per layer "
               "and micro-batch; ") + ("GB = 1e9 bytes per rank and layer; " if explain else "")
    caption += "mem GiB per rank; max L in tokens"
    if same_pm:
        caption += f"; every time ±{next(iter(pms)):.0%} (one sigma)"
    elif rec.uncertainty:
        caption += "; ± = one sigma of the predicted time (time x e^±sigma)"
    else:
        caption += "; ± = the interval"
    if measured:
        # scipy (behind stats) only when measured rows are drawn: `cpbench --help` stays light
        from cpbench.model.ties import TIE_RULE  # noqa: PLC0415

        caption += ", or half the measured median's 95% interval; " + TIE_RULE
    caption += "; = marks a tie with #1"
    if any(r.prediction.candidate.all_gather for r in listed):
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
    table.add_columns(visible, left=("mesh", "U x R", "layout", "source"),
                      key=("#", "mesh", "U x R", "layout"))
    for rank, r in enumerate(listed, start=1):
        p = r.prediction
        c, t = p.candidate, p.phase_time
        tiers = p.bytes_by_tier(PHASE_PASSES[c.phase])
        layout = layout_label(p) + _comm_suffix(r)
        cells = (
            str(rank) + ("=" if rec.tied(r) and rank > 1 else ""),
            f"{c.ulysses} x {c.ring} {layout}",
            f"{c.ulysses} x {c.ring}",
            layout,
            f"x{c.replication}",
            format_seconds(r.time_s, 2, unit=False),
            "" if r.plus_minus is None else f"±{r.plus_minus:.0%}",
            format_seconds(t.compute_s, 2, unit=False),
            format_seconds(t.imbalance_s, 2, unit=False),
            format_seconds(t.exposed_comm_s, 2, unit=False),
            format_gb(tiers["intra_node"], unit=False),
            format_gb(tiers["inter_node"], unit=False),
            format_gib(p.memory_bytes, unit=False),
            f"{p.max_seq_len:,}",
            *((f"{p.work_imbalance:.2f}", f"{p.ring_steps}/{c.ring}", f"{p.padding:,}")
              * masked),
            r.source,
        )
        table.add_row(*(cell for cell, col in zip(cells, columns, strict=True) if col in visible))
    return table


def _rejected_table(rejected: Sequence[Rejection]) -> FitTable:
    table = FitTable(title="Rejected candidates")
    table.add_columns(("U x R", "layouts", "rule"), key=("U x R",), wrap=("layouts", "rule"))
    for r in rejected:
        table.add_row(
            f"{r.ulysses} x {r.ring}" + (" ag" if r.cp_comm == "all_gather" else ""),
            ", ".join(r.layouts),
            Text(group_digits(r.rule)),
        )
    return table


def _settings_lines(settings: str) -> str:
    """One command-line flag (or one call) per line, so a flag never parts from its value."""
    return settings.replace(" --", "\n--").replace("; ", ";\n")


def shared_notes(frameworks: Sequence[FrameworkSetting]) -> dict[str, list[str]]:
    """Caveat texts that more than one setting carries, with the frameworks that carry each
    (printed once, under the settings)."""
    carriers: dict[str, list[str]] = {}
    for f in frameworks:
        for text in dict.fromkeys(caveat_text(c) for c in f.caveats):
            carriers.setdefault(text, []).append(f.framework)
    return {text: names for text, names in carriers.items() if len(names) > 1}


def _frameworks_table(
    frameworks: Sequence[FrameworkSetting],
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
        settings = _settings_lines(f.settings)
        if label:
            settings = f"{label}:\n{settings}" if label.startswith("closest") else label
        note: tuple[Text, ...] = ()
        if notes:
            caveats = f.caveats
            own = [t for t in dict.fromkeys(caveat_text(c) for c in caveats) if t not in shared]
            note = (Text("; ".join(own) + "." if own else "" if caveats else setting_note(f)),)
        table.add_row(Text(f.framework), Text(settings), *note)
    return table


def _comm_suffix(r: RankedCandidate) -> str:
    """` ag` (and `/hs<stride>`) for an all-gather candidate, nothing for the ring."""
    c = r.prediction.candidate
    if not c.all_gather:
        return ""
    return " ag" if c.heads_k_stride is None else f" ag/hs{c.heads_k_stride}"
