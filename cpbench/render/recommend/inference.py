"""Rich renderables of a serving recommendation (`recommend_inference`'s dict): the header, the
ranked table, the pass-KV / pass-Q verdict with its numbers, the KV capacity and the vLLM /
SGLang settings (with the schemes they cannot express)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import RenderableType
from rich.text import Text

from cpbench.render.tables import FitTable
from cpbench.units import GIB


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f}"


def _mb(value: float) -> str:
    return f"{value / 1e6:,.1f}"


def render_inference(report: Mapping[str, Any], explain: bool = False) -> list[RenderableType]:
    """The renderables, in reading order (see the module docstring)."""
    q = report["inputs"]
    decode = q["mode"] == "decode"
    what = (
        f"decode batch {q['decode_batch']:,} over {q['context_len']:,} cached tokens"
        if decode
        else f"prefill T={q['prompt_len']:,} new tokens on P={q['cached_len']:,} cached"
    )
    out: list[RenderableType] = [
        Text(
            f"{what} | heads={q['heads']} kv_heads={q['kv_heads']} head_dim={q['head_dim']} "
            f"{q['dtype']} | {q['gpus']:,} GPUs, {q['gpus_per_node']} per node, {q['hardware']}"
        )
    ]
    u = report["uncertainty"]
    if u["kind"] == "prior":
        out.append(
            Text(
                f"Uncalibrated prior (±{u['sigma']:.0%}; two candidates tie within "
                f"±{u['ratio_sigma']:.0%} of each other): calibrate with `cpbench probe`.",
                style="yellow",
            )
        )
    if report["candidates"]:
        out.append(_ranked_table(report, decode))
    else:
        out.append(
            Text("No scheme and degree fits: every one is rejected below.", style="bold red")
        )
    tie = report.get("tie")
    if tie and not tie["clear"]:
        out.append(Text(f"Tie with #1 (within the model's uncertainty): "
                        f"{', '.join(tie['tied_with_leader'])}.", style="bold yellow"))  # fmt: skip
    if report["rejected"]:
        out.append(_rejected_schemes_table(report["rejected"]))
    verdict = report.get("ring_verdict")
    if verdict:
        out.append(Text("\n".join(verdict_lines(verdict, q))))
    line = _head_sharded_line(report)
    if line:
        out.append(Text(line))
    out.append(Text(capacity_line(report)))
    if report["settings"]:
        out.append(settings_table(report["settings"], explain))
    out.append(Text(f"Conventions: {report['conventions']['time']}. "
                    f"{report['conventions']['memory']}.", style="dim"))  # fmt: skip
    return out


def _head_sharded_line(report: Mapping[str, Any]) -> str | None:
    """What the best Ulysses would cost with a head-sharded cache, when it is priced with a
    cache: the ranking assumes one sequence-sharded cache for every scheme."""
    rows = [c for c in report["candidates"]
            if c.get("scheme") == "ulysses" and c.get("head_sharded_cache_s") is not None]  # fmt: skip
    if not rows:
        return None
    u = rows[0]
    cache = u["bytes_sent"].get("a2a_kv", 0)
    ahead = sum(1 for c in report["candidates"] if c["total_s"] < u["head_sharded_cache_s"])
    return (
        f"Ulysses W{u['world']} as ranked re-shards the sequence-sharded cache every turn "
        f"({_mb(cache)} of its {_mb(u['bytes_per_rank'])} MB are K/V, almost all of it the "
        f"cache); a server that "
        f"keeps the cache head-sharded (TP-style attention) moves only the new tokens: "
        f"{_us(u['head_sharded_cache_s'])} us, which would rank #{ahead + 1}."
    )


def _ranked_table(report: Mapping[str, Any], decode: bool) -> FitTable:
    shown, feasible = len(report["candidates"]), report["feasible"]
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
    for col in columns:
        table.add_column(col, justify="left" if col in ("scheme", "tier") else "right",
                         key=col in ("#", "scheme", "W"))  # fmt: skip
    for c in report["candidates"]:
        compute = max(c["memory_s"], c["compute_s"]) if decode else c["compute_s"]
        exposed = c["comm_s"] if decode else c["exposed_comm_s"]
        cells = [
            str(c["rank"]) + ("=" if c.get("tied") and c["rank"] > 1 else ""),
            c["label"],
            str(c["world"]),
            "-" if c["world"] == 1 else c["tier"].replace("_node", ""),
            _us(c["total_s"]),
            _us(compute),
            _us(exposed),
            _mb(c["bytes_per_rank"]),
        ]
        if decode:
            rate = c.get("tokens_per_s")
            cells.append("-" if rate is None else f"{rate:,.0f}")
        table.add_row(*cells)
    return table


def _rejected_schemes_table(rejected: Sequence[Mapping[str, Any]]) -> FitTable:
    table = FitTable(title="Rejected")
    table.add_column("scheme", key=True)
    table.add_column("W", justify="right", key=True)
    table.add_column("rule", wrap=True)
    for r in rejected:
        table.add_row(r["scheme"], str(r["world"]), r["rule"])
    return table


def verdict_lines(v: Mapping[str, Any], q: Mapping[str, Any]) -> list[str]:
    """Which of pass-KV / pass-Q wins on the ring and why, in numbers."""
    name = {"pass_kv": "pass-KV", "pass_q": "pass-Q"}
    win, lose = name[v["winner"]], name["pass_q" if v["winner"] == "pass_kv" else "pass_kv"]
    tier = v["tier"].replace("_", "-")
    lines = [
        f"{win} beats {lose} on a ring of {v['world']} ({tier}): "
        f"{_us(min(v['pass_kv_s'], v['pass_q_s']))} vs {_us(max(v['pass_kv_s'], v['pass_q_s']))} "
        f"us (x{v['speedup']:.2f})."
    ]
    exposed_kv = v["kv_exposed_s"]
    lines.append(
        f"  pass-KV: each of {v['world'] - 1} hops sends {_mb(v['kv_hop_bytes'])} MB of K/V in "
        f"{_us(v['kv_hop_s'])} us against a {_us(v['step_s'])} us step "
        f"({'exposed' if v['kv_hop_s'] > v['step_s'] else 'hidden'}; with overlap "
        f"{v['overlap']:.0%}, {_us(exposed_kv)} us of comm not hidden in all)."
    )
    lines.append(
        f"  pass-Q: each hop sends {_mb(v['q_hop_bytes'])} MB of queries in "
        f"{_us(v['q_hop_s'])} us, then {_mb(v['q_tail_bytes'])} MB of partial outputs + LSEs "
        f"go home in {_us(v['q_tail_s'])} us after the last step (nothing left to hide them)."
    )
    if v["crossover_ratio"] is not None:
        turn = v["turn_ratio"]
        lines.append(
            f"  Crossover on this mesh and link: T/P = {v['crossover_ratio']:.4f} "
            f"(T = {v['crossover_tokens']:,.0f} tokens at P = {q['cached_len']:,}); this turn "
            f"is T/P = {turn:.4f}: pass-Q below the crossover, pass-KV above."
        )
    elif q["cached_len"] == 0:
        lines.append(
            "  No cache (P = 0): pass-Q's hops carry every query and its outputs go home, "
            "while pass-KV's K/V chunk is what it would send anyway."
        )
    hides = q["prompt_len"] >= v["hidden_above_tokens"]
    fewer = v["new_share"] >= v["message_ratio"]
    lines.append(
        f"  Meta's rule (arXiv:2411.01783) picks pass-KV when its hop hides, T >= "
        f"{v['hidden_above_tokens']:,.0f} (bandwidths only: {'yes' if hides else 'no'}, T = "
        f"{q['prompt_len']:,}), or its hops carry fewer bytes, T/(T+P) >= 2 H_kv/H = "
        f"{v['message_ratio']:.4f} ({'yes' if fewer else 'no'}, {v['new_share']:.4f}): "
        f"{'pass-KV' if hides or fewer else 'pass-Q'}; cpbench's model also counts latency, "
        f"padding and the unhidden {1 - v['overlap']:.0%} of each overlapped hop."
    )
    return lines


def capacity_line(report: Mapping[str, Any]) -> str:
    """The KV capacity of the leader's degree (or of every degree with none ranked)."""
    q = report["inputs"]
    world = report["candidates"][0]["world"] if report["candidates"] else q["gpus"]
    cap = next(c for c in report["capacity"] if c["world"] == world)
    per = f"{cap['layers']} layer(s)" if q["layers"] else "1 layer (--layers for the model)"
    return (
        f"KV cache on W={world}: {cap['bytes_per_rank'] / GIB:.3f} GiB per rank for "
        f"{q['context_len']:,} tokens x {q['decode_batch'] or q['batch']:,} "
        f"sequence(s) over {per}; the longest context per sequence that fits "
        f"{cap['budget_bytes'] / GIB:.1f} GiB per rank: {cap['longest_context']:,} tokens."
    )


def settings_table(rows: Sequence[Mapping[str, Any]], explain: bool = False) -> FitTable:
    """Framework / can express / settings (and with `explain` the note and docs)."""
    table = FitTable(title="Serving settings", caption="docs: " + "; ".join(
        sorted({r["framework"] + " " + r["docs"] for r in rows})) if explain else None)  # fmt: skip
    table.add_column("framework", key=True)
    table.add_column("expresses it", justify="left")
    table.add_column("settings", wrap=True)
    if explain:
        table.add_column("note", wrap=True)
    for r in rows:
        settings = r["settings"]
        instead = r.get("instead")
        if instead:
            settings += (
                f" (runs all_gather W{instead['world']}: #{instead['rank']} here, "
                f"x{instead['slower']:.2f} the winner's time)"
            )
        cells = [r["framework"], "yes" if r["expressible"] else "no", settings]
        if explain:
            cells.append(r["note"])
        table.add_row(*cells)
    return table
