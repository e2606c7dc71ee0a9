"""docs/cli.md, every command and option of `cpbench`, generated from the typer app.

`python -m cpbench.cli.docs` rewrites it; tests/test_docs.py fails when it is out of date."""

from __future__ import annotations

import re
from pathlib import Path

import typer
from typer.cli import get_docs_for_click

from cpbench.cli.main import app

CLI_MD = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
REGENERATE = "python -m cpbench.cli.docs"
TAG = re.compile(r"<(?=[A-Za-z/!])")


def cli_markdown() -> str:
    """typer's own Markdown of the app, in plain text (no markup turned into HTML, no colours) at
    a fixed width; `<name>` outside code is written `&lt;name>` so it does not render as a tag."""
    command = typer.main.get_command(app)
    ctx = typer.Context(command, terminal_width=100, max_content_width=100, color=False)
    lines, in_code = [], False
    for line in get_docs_for_click(obj=command, ctx=ctx, name="cpbench").strip().split("\n"):
        in_code ^= line.startswith("```")
        spans = line.split("`")  # odd pieces are inline code
        escaped = (s if i % 2 else TAG.sub("&lt;", s) for i, s in enumerate(spans))
        lines.append(line if in_code else "`".join(escaped))
    header = (
        f"<!-- Generated from the typer app by `{REGENERATE}` with typer {typer.__version__}; "
        f"do not edit. -->"
    )
    return "\n".join([header, "", *lines, ""])


if __name__ == "__main__":
    CLI_MD.write_text(cli_markdown(), encoding="utf-8")
    print(f"wrote {CLI_MD}")
