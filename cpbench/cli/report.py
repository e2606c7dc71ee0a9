"""`cpbench report` command(s): thin typer wrappers registered on `cpbench.cli.common.app`."""

from __future__ import annotations

import json
import webbrowser
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cpbench.cli import options as o
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
    output: o.Output = "report.html",
    title: o.Title = None,
    hardware: o.Hardware = None,
    compare: o.Compare = False,
    model: o.ModelOrNone = None,
    seq_len: o.SeqLenOrNone = None,
    gpus: o.Gpus = 8,
    gpus_per_node: o.GpusPerNode = None,
    open_browser: o.Open = False,
    as_json: o.Json = False,
) -> None:
    """Write one self-contained HTML report (works offline: plotly.js is embedded, nothing is
    fetched) of one or more results files: step time, TFLOP/s, communication (analytic vs
    measured), overlap, memory, causal load balance, the U x R map, predicted vs measured,
    the recommendation and a sortable table of every record, failures included.

    --seq-len (default 131072), --gpus and --gpus-per-node go with --model."""
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
    path = write_report(page.html, Path(output), inputs=results)
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
