"""Rich renderables of `recommend --lengths` (`DynamicRecommendation`): the batch, the policies
ranked with their speedup over static CP, and the pick's settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import RenderableType
from rich.text import Text

from cpbench.render.tables import FitTable

if TYPE_CHECKING:
    from cpbench.app.recommend.dynamic import DynamicRecommendation

POLICY_NAMES = {
    "static": "static CP (dp_balanced)",
    "megatron": "Megatron dynamic CP",
    "cpbench": "cpbench (cost model)",
}


def render_dynamic(rec: DynamicRecommendation) -> list[RenderableType]:
    """The renderables, in reading order (see the module docstring)."""
    from cpbench.app.recommend.dynamic import (  # noqa: PLC0415
        DYNAMIC_CONVENTION,
        batch_summary,
        megatron_flags,
        not_in_megatron,
    )

    q = rec.request
    b = batch_summary(rec.lengths, q.tokens_per_rank)
    pick = rec.pick
    out: list[RenderableType] = []
    headline = f"pick: {POLICY_NAMES[pick.plan.policy]}" + (
        f", {pick.speedup_over_static:.2f}x static CP" if pick.speedup_over_static else "")
    if pick.faster_than_next is not None:
        runner = rec.ranked[1].plan.policy
        headline += f" (faster than {runner} with probability {pick.faster_than_next:.2f})"
    out.append(Text(headline, style="bold"))
    out.append(Text(
        f"batch: {b.sequences:,} sequences, {b.tokens:,} tokens (min {b.min:,}, "
        f"median {b.median:,.0f}, max {b.max:,}; {b.needing_cp:,} longer than "
        f"{q.tokens_per_rank:,} tokens per rank) on {q.gpus:,} GPUs, {rec.profile_name}"
    ))  # fmt: skip
    table = FitTable("#", "policy", "step ms", "x static", "busy", "micro-batches",
                     title="policies by predicted step")  # fmt: skip
    for i, r in enumerate(rec.ranked, 1):
        p = r.plan
        table.add_row(str(i), POLICY_NAMES[p.policy], f"{p.step_s * 1e3:,.3f}",
                      "-" if r.speedup_over_static is None else f"{r.speedup_over_static:.2f}",
                      f"{p.busy_share:.0%}", f"{len(p.micro_batches):,}")  # fmt: skip
    out.append(table)
    out.append(Text("sequences per CP degree (degree:count): " + "; ".join(
        f"{r.plan.policy} " + " ".join(f"{d}:{n:,}" for d, n in r.plan.degrees.items())
        for r in rec.ranked)))  # fmt: skip
    out.append(Text(f"step ms: {DYNAMIC_CONVENTION}. busy: rank-seconds of work / (GPUs x step). "
                    f"A ratio's model error: sigma {rec.ratio_sigma:.1%} ({rec.uncertainty_source})."))
    for policy, why in rec.refused.items():
        out.append(Text(f"not planned: {POLICY_NAMES[policy]}: {why}", style="yellow"))
    out.append(Text("Megatron-LM (its dynamic-CP rule): "
                    + " ".join(megatron_flags(q, rec.static_degree))))
    missing = not_in_megatron(rec.plan("cpbench"))
    if missing:
        out.append(Text("cpbench's schedule, which Megatron cannot express: " + "; ".join(missing)))
    return out
