"""The command line: JSON answers parse, bad input is one line on stderr and exit code 2."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cpbench.cli.main import app

runner = CliRunner()


def test_formulas_json_worked_example() -> None:
    result = runner.invoke(
        app, ["formulas", "--seq-len", "262144", "--ulysses", "4", "--ring", "2", "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["shapes"]["q"]["local"] == [1, 32768, 32, 128]
    assert report["shapes"]["q"]["after_all_to_all"] == [1, 131072, 8, 128]
    # Ulysses forward per rank: B*(L/(U*R))*(U-1)/U*(2d + 2d_kv) elements of 2 bytes
    # = 32768 * 3/4 * (8192 + 2048) * 2 B = 480 MiB (hand-computed).
    stages = report["communication"]["forward"]["stages"]
    ulysses = next(s for s in stages if s["stage"] == "ulysses")
    assert ulysses["bytes_sent"] == 32768 * 3 // 4 * (8192 + 2048) * 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["formulas", "--kv-heads", "6"], "heads (32) must be a multiple of kv_heads (6)"),
        (["formulas", "--seq-len", "0"], "seq_len must be a positive integer, got 0"),
        (["formulas", "--ulysses", "3"], "ulysses (3) must divide heads (32)"),
        (["formulas", "--seq-len", "1000", "--ring", "8"], "seq_len (1000) must be divisible"),
        (["verify", "--world-size", "0"], "world size must be at least 1, got 0"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.output + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_verify_json_world_size_2() -> None:
    result = runner.invoke(app, ["verify", "--world-size", "2", "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["passed"] and doc["world_size"] == 2
    assert {(c["ulysses"], c["ring"]) for c in doc["cases"]} == {(1, 2), (2, 1)}
    assert all(c["max_error"] < c["tolerance"] for c in doc["cases"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["formulas", "--dtype", "fp8"], "'fp8' is not one of"),
        (["formulas", "--seq-len", "abc"], "--seq-len"),
        (["nosuch"], "No such command 'nosuch'"),
        (["formulas", "--ulysses", "3"], "ulysses (3) must divide heads (32)"),
    ],
)
def test_console_entry_point_usage_errors_are_one_line(args: list[str], message: str) -> None:
    """The installed `cpbench` (cpbench.cli:main): usage errors too are one line, exit 2."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    done = subprocess.run([sys.executable, "-m", "cpbench.cli", *args], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cpbench: error:") and message in lines[0]
