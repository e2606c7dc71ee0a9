"""The `cpbench` command line: thin typer wrappers. Parsing and rendering happen here; domain
errors (`CpbenchError`) are turned into one line on stderr and exit code 2 in `main`, once."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Annotated, Any, Literal

import typer
from rich.console import Console
from rich.table import Table

from cpbench.errors import CpbenchError
from cpbench.impls.names import IMPLS, Impl

app = typer.Typer(
    name="cpbench",
    help="Benchmark and auto-tune context-parallel attention (Ulysses, Ring, USP).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True, soft_wrap=True)

Device = Literal["auto", "cpu", "cuda"]


def command(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Register a command; a CpbenchError becomes one line on stderr and exit code 2 (the one
    place where domain errors meet the process exit code)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CpbenchError as exc:
            err_console.print(f"cpbench: error: {exc}", markup=False, highlight=False)
            raise typer.Exit(2) from None

    return app.command()(wrapper)


def _print_version(value: bool) -> None:
    if value:
        from cpbench import __version__  # noqa: PLC0415

        console.print(f"cpbench {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True,
                     help="Print the version and exit."),
    ] = False,
) -> None:
    """cpbench: measure, model and recommend context-parallel attention configurations."""


def resolve_device(device: str) -> str:
    import torch  # noqa: PLC0415 - keep `cpbench --help` fast

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise CpbenchError("device 'cuda' requested but torch sees no CUDA device")
    return device


@command
def verify(
    world_size: Annotated[
        int | None,
        typer.Option(help="Ranks to spawn (default: all GPUs on CUDA, 4 on CPU)."),
    ] = None,
    device: Annotated[Device, typer.Option(help="auto picks cuda when available.")] = "auto",
    dtype: Annotated[
        Literal["float32", "bfloat16", "float16"],
        typer.Option(help="Input dtype (default float32 on CPU, bfloat16 on CUDA)."),
    ] = None,  # type: ignore[assignment]
    kernel: Annotated[
        Literal["auto", "flash_attn", "sdpa", "naive"], typer.Option(help="Local attention kernel.")
    ] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
    impl: Annotated[
        Impl,
        typer.Option(
            help="Implementation to check (cpbench's own, or an installed external library: "
            f"{', '.join(IMPLS[1:])}); cases it cannot run are listed as skipped."
        ),
    ] = "cpbench",
) -> None:
    """Check every scheme x layout x causal x GQA case against the single-process reference.

    Spawns the ranks once (gloo on CPU, NCCL on GPUs), compares the forward output and
    dQ/dK/dV with a float64 reference, prints a table and exits 1 on any mismatch.
    """
    import torch  # noqa: PLC0415

    from cpbench.verify import run_verify  # noqa: PLC0415

    dev = resolve_device(device)
    n = (
        world_size
        if world_size is not None
        else (torch.cuda.device_count() if dev == "cuda" else 4)
    )
    records = run_verify(
        n, dev, dtype or ("bfloat16" if dev == "cuda" else "float32"), kernel, impl=impl
    )
    failed = [r for r in records if r["passed"] is False]
    skipped = [r for r in records if r.get("skipped")]
    if as_json:
        print(
            json.dumps(
                {
                    "world_size": n,
                    "device": dev,
                    "impl": impl,
                    "cases": records,
                    "passed": not failed,
                },
                indent=1,
            )
        )
    else:
        reasons: dict[str, int] = {}
        title = f"cpbench verify: world size {n}, {dev}" + (
            f", impl {impl}" if impl != "cpbench" else ""
        )
        table = Table(title=title)
        columns = ("scheme", "UxR", "layout", "mask", "h/kv", "rep", "out", "dq", "dk", "dv", "")
        for col in columns:
            table.add_column(col, justify="right" if col in ("out", "dq", "dk", "dv") else "left")
        from cpbench.model.constraints import required_kv_replication  # noqa: PLC0415

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
        console.print(
            f"tolerance: max abs error <= {tolerances[0]:g} vs float64"
            if tolerances
            else "no cases ran"
        )
        console.print(table)
        for reason, number in reasons.items():
            console.print(f"skipped ({number}): {reason}", highlight=False)
        for issue in dict.fromkeys(i for r in records for i in r.get("known_issues", [])):
            console.print(f"known upstream issue (its gradient gets the bf16 tolerance): {issue}")
        ran = len(records) - len(skipped)
        console.print(
            f"{ran - len(failed)}/{ran} cases passed"
            + (f", {len(skipped)} skipped (not supported by {impl})" if skipped else "")
        )
    if failed:
        raise typer.Exit(1)


Layout = Literal["contiguous", "zigzag", "striped"]
DType = Literal["float32", "bfloat16", "float16"]


@command
def formulas(
    seq_len: Annotated[int, typer.Option(help="Global sequence length L in tokens.")] = 131072,
    heads: Annotated[int, typer.Option(help="Query heads h.")] = 32,
    kv_heads: Annotated[int, typer.Option(help="KV heads h_kv (GQA when < heads).")] = 8,
    head_dim: Annotated[int, typer.Option(help="Head dimension d_h.")] = 128,
    batch: Annotated[int, typer.Option(help="Micro-batch B.")] = 1,
    ulysses: Annotated[int, typer.Option(help="Ulysses degree U.")] = 1,
    ring: Annotated[int, typer.Option(help="Ring degree R.")] = 1,
    layout: Annotated[Layout, typer.Option(help="Token layout.")] = "zigzag",
    dtype: Annotated[DType, typer.Option(help="Activation dtype.")] = "bfloat16",
    causal: Annotated[bool, typer.Option("--causal/--no-causal", help="Causal mask.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Print the analytic communication volumes (formula and value), FLOPs, per-rank causal
    work and imbalance, memory per rank and tensor shapes of one U x R configuration."""
    from cpbench.formulas import formulas_report, render_formulas  # noqa: PLC0415

    report = formulas_report(
        seq_len, heads, kv_heads, head_dim, batch, ulysses, ring, layout, dtype, causal
    )
    if as_json:
        print(json.dumps(report, indent=1))
        return
    for table in render_formulas(report):
        console.print(table)


# Commands in their own modules register themselves on `app` when imported (after `command`
# exists, hence at the end).
from cpbench.commands import recommend as _recommend  # noqa: E402, F401
from cpbench.commands import report as _report  # noqa: E402, F401
from cpbench.commands import sweep as _sweep  # noqa: E402, F401


def main() -> None:
    """Console entry point: the app, with usage errors (unknown option, a value of the wrong
    type) printed as one line on stderr with exit code 2, like the domain errors."""
    import sys  # noqa: PLC0415

    try:
        code = app(standalone_mode=False, prog_name="cpbench")
    except typer.TyperException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            exc.show()  # type: ignore[attr-defined] - prints the help text
        else:
            message = " ".join(exc.format_message().split())
            err_console.print(f"cpbench: error: {message}", markup=False, highlight=False)
        sys.exit(getattr(exc, "exit_code", 2))
    except typer.Abort:
        err_console.print("cpbench: aborted")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # `python -m cpbench.cli ...`, e.g. under `torchrun -m cpbench.cli`
    # Run the entry point of the imported module `cpbench.cli`, on which the commands
    # registered (this file, run as __main__, is a second module object).
    from cpbench.cli import main as registered_main

    registered_main()
