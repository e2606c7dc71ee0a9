"""`cpbench compare BEFORE AFTER`: a thin typer wrapper around `cpbench.app.compare`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from cpbench.cli import options as o
from cpbench.cli.common import command, console
from cpbench.errors import EXIT_WRONG_RESULT


@command
def compare(
    before: Annotated[Path, typer.Argument(help="Results file (JSONL) before the change.")],
    after: Annotated[Path, typer.Argument(help="Results file (JSONL) after the change.")],
    threshold: o.Threshold = 0.05,
    as_json: o.Json = False,
) -> None:
    """Per configuration, the change after/before with its interval and a verdict (faster /
    slower / no significant change); exit 1 on a significant regression beyond --threshold."""
    from cpbench.app.compare import compare_results  # noqa: PLC0415
    from cpbench.render.tables import compare_table  # noqa: PLC0415

    result = compare_results(before, after, threshold)
    if as_json:
        print(
            json.dumps(
                {
                    "sources": result.sources,
                    "threshold": result.threshold,
                    "faster": result.count("faster"),
                    "slower": result.count("slower"),
                    "no_significant_change": result.count("no significant change"),
                    "unmatched": result.unmatched,
                    "regressions": [r.id for r in result.regressions],
                    "rows": [r.to_dict() for r in result.rows],
                }
            )
        )
    else:
        console.print(compare_table(result))
        console.print(
            f"{result.matched} configuration(s) in both files: {result.count('faster')} faster, "
            f"{result.count('slower')} slower, {result.count('no significant change')} no "
            f"significant change; {result.unmatched} in one file only or not ok on both; "
            f"{len(result.regressions)} regression(s) beyond {result.threshold:.0%}",
            highlight=False,
        )
    if result.regressions:
        raise typer.Exit(EXIT_WRONG_RESULT)
