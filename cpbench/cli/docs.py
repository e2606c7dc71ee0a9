"""docs/cli.md, every command and option of `cpbench`, generated from the typer app.

`python -m cpbench.cli.docs` rewrites it; tests/test_docs.py fails when it is out of date."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from typer.cli import get_docs_for_click

from cpbench.cli.main import app

CLI_MD = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
REGENERATE = "python -m cpbench.cli.docs"

HEADER = f"""<!-- Generated from the typer app by `{REGENERATE}`; do not edit by hand. -->

"""


def cli_markdown() -> str:
    """The Markdown reference of the app: typer's own generator, in plain text (no markup
    turned into HTML, no colours) and at a fixed width, so the same app gives the same bytes."""
    command = typer.main.get_command(app)
    ctx = typer.Context(
        command, info_name="cpbench", terminal_width=100, max_content_width=100, color=False
    )
    text = get_docs_for_click(obj=command, ctx=ctx, name="cpbench")
    return HEADER + text.strip() + "\n"


def main() -> None:
    """Write docs/cli.md (or another path given as the one argument)."""
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else CLI_MD
    path.write_text(cli_markdown(), encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
