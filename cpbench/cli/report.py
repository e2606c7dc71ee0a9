"""`cpbench report` command(s): thin typer wrappers registered on `cpbench.cli.common.app`."""

from __future__ import annotations

import json
import webbrowser
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cpbench.cli.common import command, console, err_console
from cpbench.errors import CpbenchError

if TYPE_CHECKING:
    from cpbench.app.report.data import ComparisonData, ReportData


@command
def report(
    results: Annotated[
        list[Path],
        typer.Argument(
            help="Results files (JSONL, one record per configuration) written by `cpbench sweep`.",
            show_default=False,
        ),
    ],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="HTML file to write (parent folders created).")
    ] = Path("report.html"),
    title: Annotated[
        str | None, typer.Option(help="Page title (default: the scenario names).")
    ] = None,
    hardware: Annotated[
        str | None,
        typer.Option(
            help="Hardware profile (built-in name or TOML file) for the fraction of peak, the "
            "predicted-vs-measured section and the recommendation. Default: cpu-local for CPU "
            "records, else inferred from the device names (skipped when none matches).",
        ),
    ] = None,
    compare: Annotated[
        bool,
        typer.Option(
            "--compare",
            help="Compare exactly two files, BEFORE AFTER: the change per configuration "
            "(matched by record id) as a table and a bar chart.",
        ),
    ] = False,
    model: Annotated[
        str | None,
        typer.Option(
            help="Add the whole-model plan of this model (a preset, a model TOML or a Hugging "
            "Face config.json, as `cpbench plan --model`) at --seq-len on --gpus.",
        ),
    ] = None,
    seq_len: Annotated[
        int | None, typer.Option(help="With --model: tokens per sequence (default 131072).")
    ] = None,
    gpus: Annotated[int, typer.Option(help="With --model: GPUs in total.")] = 8,
    gpus_per_node: Annotated[
        int | None, typer.Option(help="With --model: GPUs per node (default: the profile's).")
    ] = None,
    open_browser: Annotated[
        bool, typer.Option("--open", help="Open the written page in the default web browser.")
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print one JSON document (output path, counts) on stdout."),
    ] = False,
) -> None:
    """Write one self-contained HTML report (works offline: plotly.js is embedded, nothing is
    fetched) of one or more results files: step time, TFLOP/s, communication (analytic vs
    measured), overlap, memory, causal load balance, the U x R map, predicted vs measured,
    the recommendation and a sortable table of every record, failures included."""
    from cpbench.app.report import build_comparison, build_report, write_report  # noqa: PLC0415
    from cpbench.render.html.comparison import render_comparison  # noqa: PLC0415
    from cpbench.render.html.report import render_report  # noqa: PLC0415

    data: ReportData | ComparisonData
    if compare:
        if len(results) != 2:
            raise CpbenchError(
                f"--compare needs exactly two results files (BEFORE AFTER), got {len(results)}"
            )
        data = build_comparison(results[0], results[1], title=title)
        page = render_comparison(data)
    else:
        plan_request = None
        if model is not None:
            from cpbench.app.plan import PlanRequest  # noqa: PLC0415

            plan_request = PlanRequest(
                model=model,
                seq_len=seq_len or 131072,
                gpus=gpus,
                gpus_per_node=gpus_per_node,
                hardware=hardware if hardware and not hardware.startswith("cpu") else None,
            )
        elif seq_len is not None:
            raise CpbenchError("--seq-len applies to the whole-model plan: give --model too")
        data = build_report(results, title=title, hardware=hardware, plan_request=plan_request)
        page = render_report(data)
    for warning in data.warnings:
        err_console.print(f"cpbench: warning: {warning}", markup=False, highlight=False)
    path = write_report(page.html, output, inputs=results)
    if as_json:
        print(
            json.dumps(
                {
                    "output": str(path),
                    "records": data.records,
                    "figures": page.figures,
                    "profile": data.profile,
                    "notes": data.notes,
                    "warnings": data.warnings,
                }
            )
        )
    else:
        for note in data.notes:
            err_console.print(f"cpbench: note: {note}", markup=False, highlight=False)
        console.print(
            f"wrote {path} ({data.records} records, {page.figures} figures)",
            markup=False,
            highlight=False,
        )
    if open_browser:
        webbrowser.open(path.resolve().as_uri())
