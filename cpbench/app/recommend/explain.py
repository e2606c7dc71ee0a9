"""The prose of a recommendation: why the winner wins, or why nothing fits."""

from __future__ import annotations

from collections.abc import Sequence

from cpbench.app.recommend.types import (
    RankedCandidate,
    Rejection,
    layout_label,
    rank_key,
)
from cpbench.model.cost import Prediction
from cpbench.model.formulas import gather_bytes_sent
from cpbench.model.hardware.profile import HardwareProfile
from cpbench.model.memory import memory_estimate
from cpbench.units import GIB, format_gb, format_seconds


def explain(ranked: Sequence[RankedCandidate], profile: HardwareProfile) -> str:
    """One paragraph: why the winner wins (comm per tier, imbalance, memory, margin)."""
    best = ranked[0]
    p = best.prediction
    c, t = p.candidate, p.phase_time
    parts = [
        f"{best.label} is {'measured' if best.measured_s is not None else 'predicted'} fastest "
        f"at {format_seconds(best.time_s, 2)} per layer ({p.candidate.phase})"
    ]
    mesh = (c.ulysses, c.ring, c.all_gather)
    others = [r for r in ranked[1:] if _mesh_of(r.prediction) != mesh]
    ties = [r for r in ranked[1:] if r not in others and rank_key(r)[0] == rank_key(best)[0]]
    if others:
        second = others[0]
        margin = second.time_s / best.time_s - 1
        parts[0] += f", {margin:.1%} ahead of the next mesh, {second.label} ({format_seconds(second.time_s, 2)})"
    else:
        parts[0] += ", the only feasible mesh"
    if ties:
        tied = ", ".join(layout_label(r.prediction) for r in ties)
        parts[0] += f" ({tied} on the same mesh ties; zigzag is preferred: frameworks support it)"
    parts[0] += "."
    parts.append(_placement_sentence(p, profile))
    hiding = (
        "the first all-gather of each pass hides only behind the own chunk, the last "
        "reduce-scatter waits, later strides travel behind the kernels"
        if c.all_gather
        else "ring hops hide behind the kernels when a step's compute is longer than its hop"
    )
    parts.append(
        f"Of {format_seconds(t.comm_s, 2)} of communication, {format_seconds(t.exposed_comm_s, 2)} stays exposed "
        f"(all-to-all is never overlapped; {hiding})."
    )
    balance = _balance_sentence(p)
    if balance:
        parts.append(balance)
    parts.extend(mask_sentences(ranked))
    parts.extend(gather_sentences(ranked))
    parts.append(
        f"The kernel works on L/R = {p.kernel_seq_len} tokens at {p.attention_tflops:.1f} TFLOP/s "
        f"per rank; {c.heads_per_rank} query head(s) and {c.kv_heads_per_rank} KV head(s) per rank "
        f"after the all-to-all"
        + (f" (KV heads replicated x{c.replication})." if c.replication > 1 else ".")
        + f" Compute model: {p.curve_note}."
    )
    parts.append(
        f"It needs {p.memory_bytes / GIB:.2f} GiB per rank of {p.memory_capacity_bytes / GIB:.1f} "
        f"GiB (attention layer lower bound); the longest sequence that fits this mesh is "
        f"{p.max_seq_len} tokens."
    )
    return " ".join(parts)


def _placement_sentence(p: Prediction, profile: HardwareProfile) -> str:
    traffic = []
    for item in p.traffic:
        link = profile.link(item.tier)
        kind = "all-to-all" if item.kind == "all_to_all" else "ring send/recv"
        traffic.append(f"{format_gb(item.total_bytes, 2)} of {kind} on {link.name}")
    sent = "; per rank and layer it sends " + ", ".join(traffic) if traffic else ""
    return f"Placement: {p.placement.describe()}{sent}."


def _balance_sentence(p: Prediction) -> str:
    c = p.candidate
    if not p.candidate.causal:
        return "Without a causal mask every rank does the same work."
    if c.ring == 1 and not c.mask.plain:
        return (
            f"Ulysses is balanced under any mask ({c.mask.label}): after the all-to-all every "
            f"rank sees the whole ring-level sequence with h/U = {c.heads_per_rank} head(s), so "
            f"the document mix and the window cost neither imbalance nor padding nor extra "
            f"hops."
        )
    if not c.mask.plain:
        return ""
    if c.ring == 1:
        return (
            "No causal imbalance: after the all-to-all every rank holds the whole sequence "
            "for its share of the heads."
        )
    if p.work_imbalance <= 1.01:
        return (
            f"The {c.layout} layout balances the causal work (slowest / mean rank "
            f"{p.work_imbalance:.2f})."
        )
    return (
        f"The {c.layout} layout leaves causal imbalance (slowest / mean rank "
        f"{p.work_imbalance:.2f}, {format_seconds(p.phase_time.imbalance_s, 2)} per step)."
    )


def _mesh_of(p: Prediction) -> tuple[int, int, bool]:
    return (p.candidate.ulysses, p.candidate.ring, p.candidate.all_gather)


def _same_mesh(ranked: Sequence[RankedCandidate], best: Prediction) -> dict[str, Prediction]:
    mesh = _mesh_of(best)
    out: dict[str, Prediction] = {}
    for r in ranked:
        c = r.prediction.candidate
        if _mesh_of(r.prediction) == mesh:
            out.setdefault(c.layout, r.prediction)
    return out


def _padding_text(p: Prediction) -> str:
    if not p.padding:
        return "no padding"
    return f"{p.padding} padding tokens (+{p.padding_fraction:.2%} pairs)"


def mask_sentences(ranked: Sequence[RankedCandidate]) -> list[str]:
    """Why the layout under a document or window mask: every layout's work on the winner's
    mesh (imbalance, padding) and the ring steps a window lets the ring skip."""
    mask = ranked[0].prediction.candidate.mask
    if mask.plain or not mask.causal:
        return []
    ring_ranked = [
        r for r in ranked if r.prediction.candidate.ring > 1 and not r.prediction.candidate.all_gather
    ]
    if not ring_ranked:
        return []
    best = ring_ranked[0].prediction
    c = best.candidate
    layouts = _same_mesh(ring_ranked, best)
    r = c.ring
    out: list[str] = []
    if ranked[0].prediction.candidate.ring == 1:
        out.append(
            f"Should a ring be needed (more ranks than KV heads allow, or an inter-node "
            f"all-to-all), the fastest ring mesh is {ring_ranked[0].label} "
            f"({format_seconds(ring_ranked[0].time_s, 2)})."
        )
    docs = mask.documents is not None and len(mask.documents) > 1
    if docs:
        pieces = []
        zigzag = layouts.get("zigzag")
        if zigzag is not None:
            pieces.append(
                f"global zigzag leaves ring rank {zigzag.slowest_ring_rank} with "
                f"{zigzag.work_imbalance:.2f}x the mean work on this document mix "
                f"({len(mask.documents or ())} documents)"
            )
        balanced = layouts.get("balanced")
        if balanced is not None:
            pieces.append(
                f"the balanced layout brings it to {balanced.work_imbalance:.2f}x with no padding"
            )
        doc = layouts.get("doc_zigzag")
        if doc is not None:
            pieces.append(
                f"doc_zigzag is at {doc.work_imbalance:.2f}x with {_padding_text(doc)}"
            )
        if pieces:
            out.append(f"On {c.ulysses}x{r}: " + "; ".join(pieces) + ".")
    if mask.window is not None:
        contiguous, zigzag = layouts.get("contiguous"), layouts.get("zigzag")
        if contiguous is not None and contiguous.ring_steps == r:
            out.append(
                f"The window ({mask.window} tokens) saves no ring step on a ring of {r}: "
                f"every step has keys some query sees."
            )
        elif contiguous is not None:
            k = contiguous.ring_steps
            text = (
                f"The window ({mask.window} tokens) needs {k} of {r} ring steps on contiguous "
                f"({k - 1} K/V hops instead of {r - 1})"
            )
            if zigzag is not None:
                text += f"; zigzag needs {zigzag.ring_steps}" + (
                    " (all of them)" if zigzag.ring_steps == r else ""
                )
            out.append(text + ".")
    elif docs:
        skipped = [(name, p.ring_steps) for name, p in layouts.items() if p.ring_steps < r]
        if skipped:
            listed = ", ".join(f"{name} {k}" for name, k in skipped)
            out.append(
                f"No query sees past its document, so some layouts run fewer than {r} ring "
                f"steps ({listed})."
            )
    role = "winner" if best is ranked[0].prediction else "fastest ring mesh"
    out.append(
        f"The {role}'s {c.layout} layout runs {best.ring_steps} of {r} ring steps at "
        f"{best.work_imbalance:.2f}x the mean work (slowest ring rank {best.slowest_ring_rank}) "
        f"with {_padding_text(best)}."
    )
    return out


def gathered_bytes(p: Prediction) -> int:
    """Bytes of gathered K/V a rank holds in the forward (0 unless the ring axis gathers)."""
    return sum(i.bytes for i in memory_estimate(p.candidate).items if i.name == "kv_gathered")


def gather_sentences(ranked: Sequence[RankedCandidate]) -> list[str]:
    """Where all-gather wins or loses: its exposed gathers against the ring's hidden hops and
    Ulysses, with the numbers, and its memory (the gathered K/V) against the ring's."""
    gathers = [r for r in ranked if r.prediction.candidate.all_gather]
    if not gathers:
        return []
    rings = [r for r in ranked if r.prediction.candidate.ring > 1 and not r.prediction.candidate.all_gather]
    ulysses = [r for r in ranked if r.prediction.candidate.ring == 1]
    ag = gathers[0]
    a, at = ag.prediction, ag.prediction.phase_time
    c = a.candidate
    heads = f"{c.kv_heads_per_rank} KV head(s) per rank"
    text = (
        f"All-gather: its best candidate, {ag.label} ({format_seconds(ag.time_s, 2)}), gathers "
        f"the K/V of the whole sequence ({heads}, {format_gb(gather_bytes_sent(c, 'forward'), 2)} "
        f"received per rank per forward) and leaves {format_seconds(at.exposed_comm_s, 2)} of "
        f"its {format_seconds(at.comm_s, 2)} of communication exposed"
    )
    if c.gathers == 1:
        text += (
            " (one stride: the gather hides only behind the own chunk, 1/R of the work, and "
            "the whole reduce-scatter waits after the last kernel)"
        )
    else:
        text += (
            f" ({c.gathers} strides of {c.gather_stride} KV head(s): only the first gather "
            f"and the last reduce-scatter wait)"
        )
    out = [text + "."]
    same_mesh = [
        r for r in rings if (r.prediction.candidate.ulysses, r.prediction.candidate.ring) == (c.ulysses, c.ring)
    ]
    if same_mesh:
        ring = same_mesh[0]
        rp, rt = ring.prediction, ring.prediction.phase_time
        verdict = "wins" if ag.time_s < ring.time_s else "loses"
        out.append(
            f"Against the ring on the same mesh, {ring.label} ({format_seconds(ring.time_s, 2)}), whose "
            f"K/V hops hide behind compute ({format_seconds(rt.exposed_comm_s, 2)} of "
            f"{format_seconds(rt.comm_s, 2)} exposed), all-gather {verdict} by "
            f"{abs(ag.time_s / ring.time_s - 1):.1%}; it holds {a.memory_bytes / GIB:.2f} GiB "
            f"per rank ({gathered_bytes(a) / GIB:.2f} GiB of gathered K/V, growing with L) "
            f"against the ring's {rp.memory_bytes / GIB:.2f} GiB, so its longest sequence "
            f"that fits is {a.max_seq_len} tokens against {rp.max_seq_len}."
        )
    pure_ag = [r for r in gathers if r.prediction.candidate.ulysses == 1]
    pure_ring = [r for r in rings if r.prediction.candidate.ulysses == 1]
    if pure_ag and pure_ring and c.ulysses > 1:
        pa, pr = pure_ag[0], pure_ring[0]
        out.append(
            f"Without Ulysses, {pa.label} ({format_seconds(pa.time_s, 2)}, "
            f"{format_seconds(pa.prediction.phase_time.exposed_comm_s, 2)} exposed, "
            f"{pa.prediction.memory_bytes / GIB:.2f} GiB) against {pr.label} "
            f"({format_seconds(pr.time_s, 2)}, "
            f"{format_seconds(pr.prediction.phase_time.exposed_comm_s, 2)} exposed, "
            f"{pr.prediction.memory_bytes / GIB:.2f} GiB): with U > 1 the all-to-all cuts the "
            f"KV heads by U first, so the all-gather moves 2 L d_kv / U per rank."
        )
    strided = sorted(
        (r for r in gathers if r.prediction.candidate.gathers > 1),
        key=lambda r: -r.prediction.candidate.gathers,
    )
    pairs = [
        (st, wh)
        for st in strided
        for wh in gathers
        if wh.prediction.candidate.gathers == 1
        and _mesh_of(wh.prediction) == _mesh_of(st.prediction)
        and wh.prediction.candidate.layout == st.prediction.candidate.layout
    ]
    if pairs:
        st, wh = pairs[0]
        s, w = st.prediction, wh.prediction
        out.append(
            f"A head stride of {s.candidate.gather_stride} on {st.label} "
            f"({format_seconds(st.time_s, 2)}, against {format_seconds(wh.time_s, 2)} "
            f"unstrided) holds {gathered_bytes(s) / GIB:.2f} GiB "
            f"of gathered K/V (two strides in flight) instead of {gathered_bytes(w) / GIB:.2f} "
            f"GiB and hides all but the first gather and the last reduce-scatter, at {s.phase_time.steps:.0f} kernel "
            f"launches' overhead instead of {w.phase_time.steps:.0f}."
        )
    if ulysses:
        u = ulysses[0]
        verdict = "faster" if u.time_s < ag.time_s else "slower"
        out.append(
            f"Ulysses {u.label} ({format_seconds(u.time_s, 2)}) is {verdict}: its all-to-alls "
            f"move Q, K/V and O of a shard and are never overlapped, but it holds no gathered "
            f"K/V."
        )
    return out


def no_winner(rejected: Sequence[Rejection]) -> str:
    return (
        f"No candidate is feasible: all {len(rejected)} are rejected; see the rules above "
        f"(change the CP degree, the sequence length, or the hardware)."
    )
