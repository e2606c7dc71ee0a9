"""The words of recommend's facts (`cpbench.app.recommend.types`: an `Explanation`, a
`Placement`): the pick and why in three sentences (`why_lines`, what `recommend` prints) and
the full explanation (`explanation_text`, `recommend --explain` and the HTML report)."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import TYPE_CHECKING

from cpbench.units import format_gb, format_gib, format_seconds

if TYPE_CHECKING:
    from cpbench.app.recommend.types import (
        CandidateFacts,
        Explanation,
        GatherFacts,
        LayoutFacts,
        MaskFacts,
    )
    from cpbench.model.topology import Placement

_BARE_COUNT = re.compile(r"(?<![\w,/=-])(?<!\d\.)\d{4,}(?!\w|\.\d)")


def group_digits(text: str) -> str:
    """Thousands separators in every count of a sentence written upstream (a tie message, a
    rejection rule, a tie-break): 9801584 -> 9,801,584; decimals, names and flags are left
    alone."""
    return _BARE_COUNT.sub(lambda m: f"{int(m.group()):,}", text)


def _ms(seconds: float) -> str:
    return format_seconds(seconds, 2)


def placement_text(p: Placement) -> str:
    """Where a mesh's groups sit and which tier each collective uses, one clause a stage."""
    u, r = p.ulysses, p.ring
    parts: list[str] = []
    if u > 1 and p.ulysses_tier == "intra_node":
        parts.append(f"each Ulysses group ({u} consecutive ranks) stays inside a node")
    elif u > 1:
        k = p.ulysses_peers_in_node
        parts.append(
            f"a Ulysses group of {u} spans nodes ({k} peers per node): "
            f"{Fraction(u - k, u - 1)} of its all-to-all bytes cross nodes"
        )
    if r > 1:
        stride = f"strided by {u}" if u > 1 else "consecutive"
        parts.append(
            f"the ring of {r} ({stride}) stays inside a node"
            if p.ring_tier == "intra_node"
            else f"the ring of {r} ({stride}) crosses nodes on {p.ring_crossing_hops} of "
            f"{r} hops, which pace every step"
        )
    return "; ".join(parts) or "a single rank: no communication"


def _pick(e: Explanation) -> str:
    w, second, margin = e.winner, e.runner_up, e.margin or 0.0
    text = (
        f"{w.label} is {'measured' if e.measured else 'predicted'} fastest at "
        f"{_ms(w.time_s)} per layer ({e.phase})"
    )
    if second is None:
        return text + ", the only feasible mesh"
    if margin < 0:
        return (
            f"{w.label} is picked among candidates the model cannot separate "
            f"({_ms(w.time_s)} per layer, {e.phase}; {second.label} predicted "
            f"{-margin:.1%} faster at {_ms(second.time_s)}, within the uncertainty of "
            f"their ratio): {e.tie_break}"
        )
    text = (
        f"{text}, {margin:.1%} ahead of the next mesh, {second.label} "
        f"({_ms(second.time_s)})"
    )
    return text + (f"; among the tied, {e.tie_break}" if e.tie_break else "")


def _balance(e: Explanation, brief: bool = False) -> str:
    kind = e.balance
    if kind == "ulysses_any_mask" and not brief:
        return (
            f"Ulysses is balanced under any mask ({e.mask_label}): after the all-to-all "
            f"every rank sees the whole ring-level sequence with h/U = {e.heads_per_rank} "
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
        "balanced": f"Balanced causal work ({e.layout}: slowest / mean rank "
        f"{e.work_imbalance:.2f}).",
        "imbalanced": f"The {e.layout} layout leaves causal imbalance (slowest / mean rank "
        f"{e.work_imbalance:.2f}, {_ms(e.imbalance_s)} per step).",
        "masked": f"The {e.layout} layout runs at {e.work_imbalance:.2f}x the mean work "
        f"under {e.mask_label}.",
    }[kind]


def _memory(e: Explanation) -> str:
    w = e.winner
    return (
        f"It needs {format_gib(w.memory_bytes)} per rank of "
        f"{format_gib(e.memory_capacity_bytes, 1)} (attention layer lower bound); the longest "
        f"sequence that fits this mesh is {w.max_seq_len:,} tokens."
    )


def _bounds(e: Explanation) -> str:
    """`; all-to-all bound by the socket tier (...)`: the tiers that price the winner's
    collectives, on a profile with a topology (where the tier is not just intra / inter node)."""
    named = [b for b in e.bounds if b.tier not in ("intra_node", "inter_node")]
    if not named:
        return ""
    words = {"all_to_all": "all-to-all", "send_recv": "ring send/recv"}
    return "; " + ", ".join(
        f"{words.get(b.kind, b.kind)} bound by the {b.tier} tier ({b.name})"
        for b in named
    )


def why_lines(e: Explanation) -> list[str]:
    """The pick and why in three sentences (the margin; placement and exposed communication;
    balance and memory): what `recommend` prints by default."""
    w, second, p, margin = e.winner, e.runner_up, e.placement, e.margin or 0.0
    ahead = (
        f"{margin:.1%} ahead of {second.label} ({_ms(second.time_s)})"
        if second
        else "the only feasible mesh"
    )
    if second and margin < 0:
        ahead = (
            f"tied with {second.label} ({_ms(second.time_s)}, predicted "
            f"{-margin:.1%} faster, within the ratio's uncertainty); picked by the tie-break"
        )
    where = [
        f"{name} of {n} " + ("inside a node" if tier == "intra_node" else f"across nodes{hops}")
        for name, n, tier, hops in (
            ("Ulysses", p.ulysses, p.ulysses_tier, ""),
            ("ring", p.ring, p.ring_tier, f" ({p.ring_crossing_hops} of {p.ring} hops)"),
        )
        if n > 1
    ]
    lines = [
        f"Pick: {w.label}, {'measured' if e.measured else 'predicted'} {_ms(w.time_s)} "
        f"({e.phase}), {ahead}.",
        f"Why: {', '.join(where) or 'one rank'}; {_ms(w.exposed_comm_s)} of "
        f"{_ms(w.comm_s)} communication exposed{_bounds(e)}.",
        f"{_balance(e, brief=True)} {format_gib(w.memory_bytes)} of "
        f"{format_gib(e.memory_capacity_bytes, 1)} per rank; fits up to {w.max_seq_len:,} "
        "tokens.",
    ]
    return [group_digits(line) for line in lines]


def explanation_text(e: Explanation | None, rejected: int = 0) -> str:
    """The full explanation (`recommend --explain`, the HTML report): one paragraph."""
    if e is None:
        return (
            f"No candidate is feasible: all {rejected:,} are rejected; see the rules above "
            "(change the CP degree, the sequence length, or the hardware)."
        )
    w = e.winner
    pick = _pick(e)
    if e.same_mesh_ties:
        pick += (
            f" ({', '.join(e.same_mesh_ties)} on the same mesh ties; zigzag is preferred: "
            "frameworks support it)"
        )
    sent = ", ".join(
        f"{format_gb(x.bytes, 2)} of "
        f"{'all-to-all' if x.kind == 'all_to_all' else 'ring send/recv'} on {x.link}"
        for x in e.links
    )
    hiding = (
        "the first all-gather of each pass hides only behind the own chunk, the last "
        "reduce-scatter waits, later strides travel behind the kernels"
        if e.all_gather
        else "ring hops hide behind the kernels when a step's compute is longer than its hop"
    )
    parts = [
        pick + ".",
        f"Placement: {placement_text(e.placement)}"
        + (f"; per rank and layer it sends {sent}." if sent else "."),
        f"Of {_ms(w.comm_s)} of communication, {_ms(w.exposed_comm_s)} stays exposed "
        f"(all-to-all is never overlapped; {hiding}).",
    ]
    if e.balance != "masked":
        parts.append(_balance(e))
    parts += _mask_sentences(e.mask) + _gather_sentences(e.gather)
    rep = e.kv_replication
    parts.append(
        f"The kernel works on L/R = {e.kernel_seq_len:,} tokens at {e.attention_tflops:.1f} "
        f"TFLOP/s per rank; {e.heads_per_rank} query head(s) and {e.kv_heads_per_rank} KV "
        "head(s) per rank after the all-to-all"
        + (f" (KV heads replicated x{rep})." if rep > 1 else ".")
        + f" Compute model: {e.curve_note}."
    )
    return group_digits(" ".join([*parts, _memory(e)]))


def _padding(x: LayoutFacts) -> str:
    if not x.padding:
        return "no padding"
    return f"{x.padding:,} padding tokens (+{x.padding_fraction:.2%} pairs)"


def _mask_sentences(m: MaskFacts | None) -> list[str]:
    if m is None:
        return []
    r, layouts, out = m.ring, m.layouts, []
    if m.fallback is not None:
        out.append(
            "Should a ring be needed (more ranks than KV heads allow, or an inter-node "
            f"all-to-all), the fastest ring mesh is {m.fallback.label} "
            f"({_ms(m.fallback.time_s)})."
        )
    pieces = []
    if m.documents:
        if "zigzag" in layouts:
            z = layouts["zigzag"]
            pieces.append(
                f"global zigzag leaves ring rank {z.slowest_ring_rank} with "
                f"{z.work_imbalance:.2f}x the mean work on this document mix "
                f"({m.documents:,} documents)"
            )
        if "balanced" in layouts:
            pieces.append(
                f"the balanced layout brings it to {layouts['balanced'].work_imbalance:.2f}x "
                "with no padding"
            )
        if "doc_zigzag" in layouts:
            d = layouts["doc_zigzag"]
            pieces.append(f"doc_zigzag is at {d.work_imbalance:.2f}x with {_padding(d)}")
    if pieces:
        out.append(f"On {m.ulysses}x{r}: " + "; ".join(pieces) + ".")
    contiguous, zigzag = layouts.get("contiguous"), layouts.get("zigzag")
    if m.window is not None and contiguous is not None:
        k = contiguous.ring_steps
        if k == r:
            out.append(
                f"The window ({m.window:,} tokens) saves no ring step on a ring of {r}: every "
                "step has keys some query sees."
            )
        else:
            text = (
                f"The window ({m.window:,} tokens) needs {k} of {r} ring steps on contiguous "
                f"({k - 1} K/V hops instead of {r - 1})"
            )
            if zigzag is not None:
                text += f"; zigzag needs {zigzag.ring_steps}" + (
                    " (all of them)" if zigzag.ring_steps == r else ""
                )
            out.append(text + ".")
    elif m.window is None and m.documents:
        listed = ", ".join(f"{n} {x.ring_steps}" for n, x in layouts.items() if x.ring_steps < r)
        if listed:
            out.append(
                f"No query sees past its document, so some layouts run fewer than {r} ring "
                f"steps ({listed})."
            )
    b = m.best
    out.append(
        f"The {'winner' if m.winner else 'fastest ring mesh'}'s {b.layout} layout runs "
        f"{b.ring_steps} of {r} ring steps at {b.work_imbalance:.2f}x the mean work "
        f"(slowest ring rank {b.slowest_ring_rank}) with {_padding(b)}."
    )
    return out


def _brief(x: CandidateFacts, exposed: bool = False) -> str:
    """`label (time[, exposed, memory])`."""
    more = (
        f", {_ms(x.exposed_comm_s)} exposed, {format_gib(x.memory_bytes)}" if exposed else ""
    )
    return f"{x.label} ({_ms(x.time_s)}{more})"


def _gather_sentences(g: GatherFacts | None) -> list[str]:
    if g is None:
        return []
    a = g.best
    stride = (
        " (one stride: the gather hides only behind the own chunk, 1/R of the work, and the "
        "whole reduce-scatter waits after the last kernel)"
        if g.gathers == 1
        else f" ({g.gathers} strides of {g.stride} KV head(s): only the first gather and "
        "the last reduce-scatter wait)"
    )
    out = [
        f"All-gather: its best candidate, {_brief(a)}, gathers the K/V of the whole sequence "
        f"({g.kv_heads_per_rank} KV head(s) per rank, {format_gb(g.received_bytes, 2)} "
        f"received per rank per forward) and leaves {_ms(a.exposed_comm_s)} of its "
        f"{_ms(a.comm_s)} of communication exposed{stride}."
    ]
    ring = g.ring
    if ring is not None:
        verdict = "wins" if a.time_s < ring.time_s else "loses"
        out.append(
            f"Against the ring on the same mesh, {_brief(ring)}, whose K/V hops hide behind "
            f"compute ({_ms(ring.exposed_comm_s)} of {_ms(ring.comm_s)} exposed), "
            f"all-gather {verdict} by {abs(a.time_s / ring.time_s - 1):.1%}; it holds "
            f"{format_gib(a.memory_bytes)} per rank ({format_gib(a.gathered_bytes)} of "
            f"gathered K/V, growing with L) against the ring's {format_gib(ring.memory_bytes)}, "
            f"so its longest sequence that fits is {a.max_seq_len:,} tokens against "
            f"{ring.max_seq_len:,}."
        )
    if g.pure is not None:
        pa, pr = g.pure
        out.append(
            f"Without Ulysses, {_brief(pa, True)} against {_brief(pr, True)}: with U > 1 the "
            "all-to-all cuts the KV heads by U first, so the all-gather moves 2 L d_kv / U per "
            "rank."
        )
    if g.strided is not None:
        s, w, n = g.strided
        out.append(
            f"A head stride of {n} on {s.label} ({_ms(s.time_s)}, against "
            f"{_ms(w.time_s)} unstrided) holds {format_gib(s.gathered_bytes)} of gathered "
            f"K/V (two strides in flight) instead of {format_gib(w.gathered_bytes)} and hides "
            "all but the first gather and the last reduce-scatter, at "
            f"{s.launches:.0f} kernel launches' overhead instead of {w.launches:.0f}."
        )
    u = g.fastest_ulysses
    if u is not None:
        out.append(
            f"Ulysses {_brief(u)} is {'faster' if u.time_s < a.time_s else 'slower'}: its "
            "all-to-alls move Q, K/V and O of a shard and are never overlapped, but it holds no "
            "gathered K/V."
        )
    return out
