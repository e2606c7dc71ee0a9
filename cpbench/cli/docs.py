"""docs/cli.md, every command and option of `cpbench`, generated from the typer app.

`python -m cpbench.cli.docs` rewrites it; tests/test_docs.py fails when it is out of date."""

from __future__ import annotations

import re
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
    return HEADER + _escape_tags(text.strip()) + "\n"


def _escape_tags(text: str) -> str:
    """`<name>` in help prose (not in code) would render as an HTML tag: write it `&lt;name>`."""
    lines, in_code = [], False
    for line in text.split("\n"):
        in_code ^= line.startswith("```")
        if not in_code:
            spans = line.split("`")  # odd pieces are inline code
            line = "`".join(
                piece if i % 2 else re.sub(r"<(?=[A-Za-z/!])", "&lt;", piece)
                for i, piece in enumerate(spans)
            )
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    """Write docs/cli.md (or another path given as the one argument)."""
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else CLI_MD
    path.write_text(cli_markdown(), encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
