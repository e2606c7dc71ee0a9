"""The prose of a recommendation: why the winner wins, or why nothing fits."""

from __future__ import annotations

from collections.abc import Sequence

from cpbench.app.recommend.types import RankedCandidate, Rejection, layout_label, rank_key
from cpbench.model.cost import Prediction
from cpbench.model.hardware import HardwareProfile
from cpbench.units import GIB, format_gb, format_seconds


def explain(ranked: Sequence[RankedCandidate], profile: HardwareProfile) -> str:
    """One paragraph: why the winner wins (comm per tier, imbalance, memory, margin)."""
    best = ranked[0]
    p = best.prediction
    c, t = p.config, p.phase_time
    parts = [
        f"{best.label} is {'measured' if best.measured_s is not None else 'predicted'} fastest "
        f"at {format_seconds(best.time_s, 2)} per layer ({p.candidate.phase})"
    ]
    mesh = (c.ulysses, c.ring)
    others = [
        r for r in ranked[1:] if (r.prediction.config.ulysses, r.prediction.config.ring) != mesh
    ]
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
    parts.append(
        f"Of {format_seconds(t.comm_s, 2)} of communication, {format_seconds(t.exposed_comm_s, 2)} stays exposed "
        f"(all-to-all is never overlapped; ring hops hide behind the kernels when a step's "
        f"compute is longer than its hop)."
    )
    parts.append(_balance_sentence(p))
    parts.append(
        f"The kernel works on L/R = {p.kernel_seq_len} tokens at {p.attention_tflops:.1f} TFLOP/s "
        f"per rank; {c.heads_per_rank} query head(s) and {c.kv_heads_per_rank} KV head(s) per rank "
        f"after the all-to-all"
        + (f" (KV heads replicated x{c.kv_replication})." if c.kv_replication > 1 else ".")
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
    c = p.config
    if not p.candidate.causal:
        return "Without a causal mask every rank does the same work."
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


def no_winner(rejected: Sequence[Rejection]) -> str:
    return (
        f"No candidate is feasible: all {len(rejected)} are rejected; see the rules above "
        f"(change the CP degree, the sequence length, or the hardware)."
    )
