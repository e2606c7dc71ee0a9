"""The README stays a front door and docs/cli.md stays the CLI's reference.

docs/cli.md is generated from the typer app (`python -m cpbench.cli.docs`); these tests fail when
it is out of date, when the README outgrows its budget, or when a command has no row in the
README's table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
from typer.cli import get_docs_for_click

from cpbench.cli.docs import CLI_MD, REGENERATE, cli_markdown
from cpbench.cli.main import app

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_LINES = 150
MAX_BYTES = 14_000
MAX_PROSE_LINE = 200
MAX_CELL = 100
GENERATED_WITH = re.compile(r"with typer (\S+); do not edit")
"""The typer release a docs/cli.md was written by (its first line, `cli_markdown`'s header)."""


def _commands() -> dict[str, typer.core.TyperCommand]:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    return dict(group.commands)  # type: ignore[arg-type]


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, in_code = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code:
            lines.append(line)
    return lines


def _table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of each row of the table whose header line is `header`."""
    lines = text.splitlines()
    start = lines.index(header) + 2  # the header, then the |---| line
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_cli_md_is_current() -> None:
    """Byte for byte under the typer that wrote it. Another typer words its Markdown its own
    way (metavars, spacing), so there only the coverage tests below bind: every command and
    flag documented; CI installs the release docs/cli.md names unless typer moved on since."""
    assert CLI_MD == ROOT / "docs" / "cli.md"
    written = CLI_MD.read_text(encoding="utf-8")
    found = GENERATED_WITH.search(written.splitlines()[0])
    assert found, f"docs/cli.md's first line names no typer release: run `{REGENERATE}`"
    if found.group(1) != typer.__version__:
        return
    assert written == cli_markdown(), (
        f"docs/cli.md is out of date with the CLI (or was generated with another typer than "
        f"{typer.__version__}): run `{REGENERATE}` and commit the result"
    )


def test_cli_md_covers_every_command_and_option() -> None:
    text = cli_markdown()
    for name, command in _commands().items():
        heading = f"\n## `cpbench {name}`\n"
        assert heading in text, name
        section = text[text.index(heading) + len(heading) :].split("\n## ", 1)[0]
        for param in command.params:
            for flag in [*param.opts, *param.secondary_opts]:
                if flag.startswith("-"):
                    assert re.search(rf"[`, /]{re.escape(flag)}[` ,]", section), (name, flag)
        assert command.help and command.help.split()[0] in section, name


def test_generated_markdown_escapes_tags_outside_code_only() -> None:
    text = cli_markdown()
    command = typer.main.get_command(app)
    raw = get_docs_for_click(obj=command, ctx=typer.Context(command), name="cpbench").strip()
    assert text.replace("&lt;", "<").split("\n", 2)[2] == raw + "\n"  # only `<` was escaped
    for line in _prose_lines(text)[1:]:  # after the <!-- header -->
        prose = "".join(line.split("`")[::2])  # inline code left out
        assert not re.search(r"<[A-Za-z/!]", prose), line


def test_readme_is_a_front_door() -> None:
    raw = README.read_bytes()
    text = raw.decode("utf-8")
    assert len(text.splitlines()) <= MAX_LINES, len(text.splitlines())
    assert len(raw) <= MAX_BYTES, len(raw)
    long = [line for line in _prose_lines(text) if len(line) > MAX_PROSE_LINE]
    assert not long, long


def test_readme_has_one_row_per_command_linking_to_cli_md() -> None:
    text = README.read_text(encoding="utf-8")
    rows = _table_rows(text, "| command | what it does |")
    linked = {}
    for row in rows:
        assert all(len(cell) <= MAX_CELL for cell in row), row
        match = re.fullmatch(r"\[`([a-z-]+)`\]\(docs/cli\.md#cpbench-([a-z-]+)\)", row[0])
        assert match and match[1] == match[2], row[0]
        linked[match[1]] = row
    assert sorted(linked) == sorted(_commands()), "a command without a README row, or a stale row"
    cli_md = CLI_MD.read_text(encoding="utf-8")
    for name in linked:  # GitHub's anchor of the heading "`cpbench NAME`" is cpbench-NAME
        assert f"\n## `cpbench {name}`\n" in cli_md, name


def test_readme_quick_start_is_what_ci_runs() -> None:
    text = README.read_text(encoding="utf-8")
    block = text.split("## Quick start", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = block.strip().splitlines()
    assert len(commands) == 2, commands
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    for command in commands:
        assert command in ci, f"README's quick-start command is not a line of .ci/run: {command}"


def test_readme_and_usage_links_point_at_files_and_headings() -> None:
    for doc in (README, ROOT / "docs" / "usage.md"):
        text = doc.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            assert file.exists(), (doc.name, target)
            if anchor and file.suffix == ".md":
                assert anchor in _anchors(file.read_text(encoding="utf-8")), (doc.name, target)


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in _prose_lines(markdown):
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out
