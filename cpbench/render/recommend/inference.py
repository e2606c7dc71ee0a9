"""Rich renderables of a serving recommendation (`InferenceRecommendation`): the header, the
ranked table, the pass-KV / pass-Q verdict with its numbers, the KV capacity and the vLLM /
SGLang settings (with the schemes they cannot express)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import RenderableType
from rich.text import Text

from cpbench.model.inference_cost import DecodePrice
from cpbench.render.tables import FitTable
from cpbench.units import GIB

if TYPE_CHECKING:
    from cpbench.app.recommend.inference import (
        InferenceRecommendation,
        Refused,
        RingVerdict,
        ServingPolicy,
    )
    from cpbench.app.recommend.inference_settings import ServingSetting


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f}"


def _mb(value: float) -> str:
    return f"{value / 1e6:,.1f}"


def render_inference(rec: InferenceRecommendation, explain: bool = False) -> list[RenderableType]:
    """The renderables, in reading order (see the module docstring)."""
    from cpbench.app.recommend.inference import (  # noqa: PLC0415 - scipy behind
        INFERENCE_TIME_CONVENTION,
        MEMORY_CONVENTION,
    )

    q, p, u = rec.request, rec.profile, rec.uncertainty
    what = (
        f"decode batch {q.decode_batch:,} over {q.cached_len + q.prompt_len:,} cached tokens"
        if q.decode_batch is not None
        else f"prefill T={q.prompt_len:,} new tokens on P={q.cached_len:,} cached"
    )
    out: list[RenderableType] = [Text(
        f"{what} | heads={q.heads} kv_heads={q.kv_heads} head_dim={q.head_dim} "
        f"{q.dtype} | {q.gpus:,} GPUs, {p.devices_per_node} per node, {p.name}"
    )]
    if u.kind == "prior":
        out.append(Text(f"Uncalibrated prior (±{u.sigma:.0%}; two candidates tie within "
                        f"±{rec.ratio_sigma:.0%} of each other): calibrate with `cpbench probe`.",
                        style="yellow"))
    if rec.listed:
        out.append(_ranked_table(rec, q.decode))
    else:
        out.append(Text("No scheme and degree fits: every one is rejected below.",
                        style="bold red"))
    if rec.tied_with_leader:
        out.append(Text(f"Tie with #1 (within the model's uncertainty): "
                        f"{', '.join(rec.tied_with_leader)}.", style="bold yellow"))  # fmt: skip
    if rec.rejected:
        out.append(_rejected_schemes_table(rec.rejected))
    if rec.verdict:
        out.append(Text("\n".join(verdict_lines(rec.verdict))))
    line = _head_sharded_line(rec)
    if line:
        out.append(Text(line))
    out.append(Text(capacity_line(rec)))
    if rec.cp_pays_above:
        out.append(Text("CP pays above (fastest scheme's TTFT below one GPU's): " + ", ".join(
            f"CP {w} from {t:,} tokens" if t else f"CP {w} never"
            for w, t in rec.cp_pays_above.items())))  # fmt: skip
    if rec.settings:
        out.append(settings_table(rec, explain))
    out.append(Text(f"Conventions: {INFERENCE_TIME_CONVENTION}. {MEMORY_CONVENTION}.",
                    style="dim"))  # fmt: skip
    return out


def _head_sharded_line(rec: InferenceRecommendation) -> str | None:
    """What the best Ulysses would cost with a head-sharded cache, when it is priced with a
    cache: the ranking assumes one sequence-sharded cache for every scheme."""
    rows = [r for r in rec.listed if getattr(r.price, "scheme", None) == "ulysses"
            and getattr(r.price, "head_sharded_cache_s", None) is not None]  # fmt: skip
    if not rows:
        return None
    u = rows[0]
    head_sharded: float = getattr(u.price, "head_sharded_cache_s")  # noqa: B009
    cache = u.price.bytes_sent.get("a2a_kv", 0)
    ahead = sum(1 for r in rec.listed if r.price.total_s < head_sharded)
    return (
        f"Ulysses W{u.price.world} as ranked re-shards the sequence-sharded cache every turn "
        f"({_mb(cache)} of its {_mb(u.bytes_per_rank)} MB are K/V, almost all of it the "
        f"cache); a server that "
        f"keeps the cache head-sharded (TP-style attention) moves only the new tokens: "
        f"{_us(head_sharded)} us, which would rank #{ahead + 1}."
    )


def _ranked_table(rec: InferenceRecommendation, decode: bool) -> FitTable:
    shown, feasible = len(rec.listed), len(rec.ranked)
    more = f" (top {shown:,} of {feasible:,}; --top 0 lists all)" if shown < feasible else ""
    metric = "step us" if decode else "TTFT us"
    title = ("Decode degrees, lowest per-token latency first" if decode
             else "Prefill schemes and degrees, lowest TTFT first") + more  # fmt: skip
    caption = (
        "us = microseconds of attention per layer for the whole batch; MB = 1e6 bytes a rank "
        "sends per layer; = marks a tie with #1"
    )
    if decode:
        caption += "; tok/s = decode batch / (step x --layers), attention only"
    table = FitTable(title=title, caption=caption)
    columns = ["#", "scheme", "W", "tier", metric, "compute us", "exposed comm us", "MB sent"]
    if decode:
        columns[5] = "HBM read us"
        columns.append("tok/s")
    table.add_columns(columns, left=("scheme", "tier"), key=("#", "scheme", "W"))
    for r in rec.listed:
        c = r.price
        if isinstance(c, DecodePrice):
            compute, exposed = max(c.memory_s, c.compute_s), c.comm_s
        else:
            compute, exposed = c.compute_s, c.exposed_comm_s
        cells = [
            str(r.rank) + ("=" if r.tied and r.rank > 1 else ""), r.label, str(c.world),
            "-" if c.world == 1 else c.tier.replace("_node", ""), _us(c.total_s), _us(compute),
            _us(exposed), _mb(r.bytes_per_rank),
        ]
        if decode:
            cells.append("-" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}")
        table.add_row(*cells)
    return table


def _rejected_schemes_table(rejected: Sequence[Refused]) -> FitTable:
    table = FitTable(title="Rejected")
    table.add_columns(("scheme", "W", "rule"), right=("W",), key=("scheme", "W"), wrap=("rule",))
    for r in rejected:
        table.add_row(r.scheme, str(r.world), r.rule)
    return table


def verdict_lines(v: RingVerdict) -> list[str]:
    """Which of pass-KV / pass-Q wins on the ring and why, in numbers."""
    name = {"pass_kv": "pass-KV", "pass_q": "pass-Q"}
    win, lose = name[v.winner], name["pass_q" if v.winner == "pass_kv" else "pass_kv"]
    kv, q, (kv_hop, q_hop, q_tail) = v.kv, v.q, v.hop_bytes
    lines = [
        f"{win} beats {lose} on a ring of {v.world} ({kv.tier.replace('_', '-')}): "
        f"{_us(min(kv.total_s, q.total_s))} vs {_us(max(kv.total_s, q.total_s))} "
        f"us (x{v.speedup:.2f}).",
        f"  pass-KV: each of {v.world - 1} hops sends {_mb(kv_hop)} MB of K/V in "
        f"{_us(kv.hop_s)} us against a {_us(kv.step_s)} us step "
        f"({'exposed' if kv.hop_s > kv.step_s else 'hidden'}; with overlap "
        f"{v.overlap:.0%}, {_us(kv.exposed_comm_s)} us of comm not hidden in all).",
        f"  pass-Q: each hop sends {_mb(q_hop)} MB of queries in "
        f"{_us(q.hop_s)} us, then {_mb(q_tail)} MB of partial outputs + LSEs "
        f"go home in {_us(q.tail_s)} us after the last step (nothing left to hide them).",
    ]
    p, t = v.cached_len, v.prompt_len
    if v.crossover_ratio is not None:
        lines.append(
            f"  Crossover on this mesh and link: T/P = {v.crossover_ratio:.4f} "
            f"(T = {v.crossover_ratio * p:,.0f} tokens at P = {p:,}); this turn "
            f"is T/P = {v.turn_ratio:.4f}: pass-Q below the crossover, pass-KV above."
        )
    elif p == 0:
        lines.append(
            "  No cache (P = 0): pass-Q's hops carry every query and its outputs go home, "
            "while pass-KV's K/V chunk is what it would send anyway."
        )
    share = t / (t + p)
    hides, fewer = t >= v.hidden_above_tokens, share >= v.message_ratio
    lines.append(
        f"  Meta's rule (arXiv:2411.01783) picks pass-KV when its hop hides, T >= "
        f"{v.hidden_above_tokens:,.0f} (bandwidths only: {'yes' if hides else 'no'}, T = "
        f"{t:,}), or its hops carry fewer bytes, T/(T+P) >= 2 H_kv/H = "
        f"{v.message_ratio:.4f} ({'yes' if fewer else 'no'}, {share:.4f}): "
        f"{'pass-KV' if hides or fewer else 'pass-Q'}; cpbench's model also counts latency, "
        f"padding and the unhidden {1 - v.overlap:.0%} of each overlapped hop."
    )
    return lines


def capacity_line(rec: InferenceRecommendation) -> str:
    """The KV capacity of the leader's degree (or of every degree with none ranked)."""
    q = rec.request
    world = rec.ranked[0].price.world if rec.ranked else q.gpus
    cap = next(c for c in rec.capacity if c.world == world)
    per = f"{q.layers} layer(s)" if q.layers else "1 layer (--layers for the model)"
    return (
        f"KV cache on W={world}: {cap.bytes_per_rank / GIB:.3f} GiB per rank for "
        f"{q.cached_len + q.prompt_len:,} tokens x {q.decode_batch or q.batch:,} "
        f"sequence(s) over {per}; the longest context per sequence that fits "
        f"{cap.budget_bytes / GIB:.1f} GiB per rank: {cap.longest_context:,} tokens."
    )


def settings_table(rec: InferenceRecommendation, explain: bool = False) -> FitTable:
    """Framework / can express / settings (and with `explain` the note and docs)."""
    rows: Sequence[ServingSetting] = rec.settings
    table = FitTable(title="Serving settings", caption="docs: " + "; ".join(
        sorted({r.framework + " " + r.docs for r in rows})) if explain else None)  # fmt: skip
    table.add_column("framework", key=True)
    table.add_column("expresses it", justify="left")
    table.add_column("settings", wrap=True)
    if explain:
        table.add_column("note", wrap=True)
    for r in rows:
        settings, instead = r.settings, rec.instead(r)
        if instead:
            slower = instead.price.total_s / rec.ranked[0].price.total_s
            settings += (
                f" (runs all_gather W{instead.price.world}: #{instead.rank} here, "
                f"x{slower:.2f} the winner's time)"
            )
        cells = [r.framework, "yes" if r.expressible else "no", settings]
        if explain:
            cells.append(r.note)
        table.add_row(*cells)
    return table


def render_serving_policy(policy: ServingPolicy) -> list[RenderableType]:
    """A serving policy over a distribution of prompt lengths: the header, the length ranges
    and their degree, the mean TTFT against static CP and no CP, where CP pays."""
    from cpbench.app.recommend.inference import INFERENCE_TIME_CONVENTION  # noqa: PLC0415

    q, p, prompts = policy.request, policy.profile, policy.prompts
    out: list[RenderableType] = [Text(
        f"prefill of {len(prompts):,} requests, prompt lengths {policy.source} (seed "
        f"{policy.seed}): mean {sum(prompts) / len(prompts):,.0f}, {min(prompts):,} to "
        f"{max(prompts):,} new tokens on P={q.cached_len:,} cached | heads={q.heads} "
        f"kv_heads={q.kv_heads} head_dim={q.head_dim} {q.dtype} | {q.gpus:,} GPUs, "
        f"{p.devices_per_node} per node, {p.name}"
    )]
    table = FitTable(
        title="Serving policy: each request on the CP degree of the least TTFT",
        caption="us = microseconds of attention per layer (TTFT's attention); share = of the "
        "requests",
    )
    table.add_columns(("prompt tokens", "CP", "scheme", "requests", "share", "mean TTFT us"),
                      left=("prompt tokens", "scheme"), key=("prompt tokens",))  # fmt: skip
    for r in policy.ranges:
        table.add_row(f"{r.low:,}-{r.high:,}", str(r.world), ", ".join(r.schemes),
                      f"{r.requests:,}", f"{r.share:.1%}", _us(r.mean_ttft_s))  # fmt: skip
    out.append(table)

    def versus(world: int, name: str) -> str:
        static = policy.static_ttft_s.get(world)
        if static is None:
            return f"{name} cannot hold every request's KV cache"
        return f"{name} {_us(static)} us (x{static / policy.mean_ttft_s:.2f} the policy's)"

    out.append(Text(
        f"Mean TTFT: policy {_us(policy.mean_ttft_s)} us; "
        f"{versus(policy.widest, f'static CP {policy.widest}')}; {versus(1, 'no CP')}."
    ))
    if policy.cp_pays_above:
        out.append(Text("CP pays above (fastest scheme's TTFT below one GPU's): " + ", ".join(
            f"CP {w} from {t:,} tokens" if t else f"CP {w} never"
            for w, t in policy.cp_pays_above.items())))  # fmt: skip
    out.append(Text(
        f"Conventions: {INFERENCE_TIME_CONVENTION}; each request is priced alone on its degree "
        f"(no queueing, no batching across requests).", style="dim"))  # fmt: skip
    return out
