"""Rich tables for the measurement commands: the sweep / run results and the verify matrix.

Renderers take the records the services return and give rich renderables; only the CLI prints
them.
"""

from __future__ import annotations

from typing import Any

from rich.console import RenderableType
from rich.table import Table

from cpbench.config.constraints import required_kv_replication


def _gib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _fmt_seconds(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.1f} ms"


def results_table(records: list[dict[str, Any]]) -> Table:
    """One row per configuration; the best configuration per (seq_len, heads) in bold green."""
    best: dict[tuple[int, int, str], float] = {}
    for r in records:
        if r["status"] == "ok":
            c = r["config"]
            key = (c["seq_len"], c["heads"], c["phase"])
            best[key] = min(best.get(key, float("inf")), r["timing"]["median"])
    impls = {r["config"].get("impl", "cpbench") for r in records}
    show_impl = impls != {"cpbench"} and bool(impls)
    table = Table(title="cpbench sweep results", show_lines=False)
    columns = ["L", "h/kv", "UxR", "layout", "phase", "step", "TFLOP/s", "bytes/rank",
               "overlap", "peak mem", "max err", "status"]
    if show_impl:
        columns.insert(0, "impl")
    for col in columns:
        table.add_column(
            col, justify="left" if col in ("impl", "layout", "status", "phase") else "right"
        )
    for r in records:
        c = r["config"]
        row_style = None
        cells = [str(c["seq_len"]), f"{c['heads']}/{c['kv_heads']}", f"{c['ulysses']}x{c['ring']}",
                 c["layout"], c["phase"]]
        if show_impl:
            cells.insert(0, c.get("impl", "cpbench"))
        if r["status"] == "ok":
            t, comm = r["timing"], r["comm"]
            analytic = sum(comm["analytic_bytes"].values())
            measured = max(sum(x) for x in zip(*comm["measured_bytes"].values(), strict=True))
            # "=": the counted bytes equal the analytic model's, collective by collective;
            # "(lib)": an external library's bytes, counted at the torch.distributed boundary.
            if comm["match"] is None:
                traffic = f"{_gib(measured)} (lib)"
            elif comm["match"]:
                traffic = f"{_gib(analytic)} ="
            else:
                traffic = f"[bold red]{_gib(analytic)} != {_gib(measured)}[/]"
            overlap = "-" if t["overlap"] is None else f"{t['overlap']:.2f}"
            acc = r.get("accuracy") or {}
            cells += [
                _fmt_seconds(t["median"]), f"{r['flops']['achieved_tflops']:.3f}", traffic,
                overlap, _gib(max(r["memory"]["peak_bytes"])),
                f"{acc.get('max_abs_error', float('nan')):.0e}", "ok",
            ]
            if t["median"] == best.get((c["seq_len"], c["heads"], c["phase"])):
                row_style = "bold green"
        else:
            cells += ["-"] * 6 + [f"{r['status']}: {r['error']}"]
        table.add_row(*cells, style=row_style)
    return table




def verify_tables(
    records: list[dict[str, Any]], n: int, dev: str, impl: str
) -> list[RenderableType]:
    """The verify matrix: one row per case, then the skip reasons, known issues and a count."""
    out: list[RenderableType] = []
    failed = [r for r in records if r["passed"] is False]
    skipped = [r for r in records if r.get("skipped")]
    reasons: dict[str, int] = {}
    title = f"cpbench verify: world size {n}, {dev}" + (
        f", impl {impl}" if impl != "cpbench" else ""
    )
    table = Table(title=title)
    columns = ("scheme", "UxR", "layout", "mask", "h/kv", "rep", "out", "dq", "dk", "dv", "")
    for col in columns:
        table.add_column(col, justify="right" if col in ("out", "dq", "dk", "dv") else "left")

    for r in records:
        e = r.get("errors", {})
        rep = required_kv_replication(r["kv_heads"], r["ulysses"]) or "-"
        cells = [f"{e[k]:.0e}" if k in e else "-" for k in ("out", "dq", "dk", "dv")]
        if r.get("skipped"):
            number = reasons.setdefault(r["skipped"], len(reasons) + 1)
            verdict = f"[yellow]skipped[/] ({number})"
        elif r["passed"]:
            verdict = "[green]ok[/]" + (" (known issue)" if r.get("known_issues") else "")
        else:
            verdict = f"[red]FAIL[/] {r.get('error', '')}"
        table.add_row(
            r["scheme"],
            f"{r['ulysses']}x{r['ring']}",
            r["layout"],
            "causal" if r["causal"] else "full",
            f"{r['heads']}/{r['kv_heads']}",
            str(rep),
            *cells,
            verdict,
        )
    tolerances = [r["tolerance"] for r in records if "tolerance" in r]
    out.append(
        f"tolerance: max abs error <= {tolerances[0]:g} vs float64"
        if tolerances
        else "no cases ran"
    )
    out.append(table)
    for reason, number in reasons.items():
        out.append(f"skipped ({number}): {reason}")
    for issue in dict.fromkeys(i for r in records for i in r.get("known_issues", [])):
        out.append(f"known upstream issue (its gradient gets the bf16 tolerance): {issue}")
    ran = len(records) - len(skipped)
    out.append(
        f"{ran - len(failed)}/{ran} cases passed"
        + (f", {len(skipped)} skipped (not supported by {impl})" if skipped else "")
    )
    return out
