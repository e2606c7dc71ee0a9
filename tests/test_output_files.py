"""Output files are written whole or not at all, and never over their inputs: `report -o`,
`calibrate -o`, `recommend --write-scenario` (a full disk once left half a page and destroyed
the previous one; `report r.jsonl -o r.jsonl` overwrote the measurements without a word)."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cpbench import files
from cpbench.cli.main import app
from cpbench.errors import CpbenchError
from cpbench.files import write_atomically

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

FIXTURE = Path(__file__).parent / "fixtures" / "sweep.jsonl"
runner = CliRunner()


@pytest.fixture
def results(tmp_path: Path) -> Path:
    copy = tmp_path / "r.jsonl"
    shutil.copy(FIXTURE, copy)
    return copy


@pytest.mark.parametrize("command", ["report", "calibrate"])
def test_an_output_that_is_an_input_is_refused(results: Path, command: str) -> None:
    before = results.read_bytes()
    result = runner.invoke(app, [command, str(results), "-o", str(results)])
    assert result.exit_code == 2, result.output
    assert "is one of the inputs" in result.stderr and "Traceback" not in result.output
    assert results.read_bytes() == before


def test_a_folder_as_the_scenario_to_write_is_refused(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["recommend", "--heads", "32", "--kv-heads", "8", "--write-scenario", str(tmp_path)]
    )
    assert result.exit_code == 2, result.output
    assert "is a directory" in result.stderr


def test_a_failed_write_keeps_the_previous_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "report.html"
    target.write_text("the previous page", encoding="utf-8")
    os.chmod(target, 0o640)

    def full_disk(src: object, dst: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "replace", full_disk)
    with pytest.raises(CpbenchError, match="cannot write --output .*No space left on device"):
        write_atomically(target, "x" * 100_000, "--output")
    assert target.read_text(encoding="utf-8") == "the previous page"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]  # no temporary left
    monkeypatch.undo()
    write_atomically(target, "the new page", "--output")
    assert target.read_text(encoding="utf-8") == "the new page"
    assert target.stat().st_mode & 0o777 == 0o640  # the previous file's permissions kept


def test_a_new_file_gets_the_umask_permissions(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        path = write_atomically(tmp_path / "deep" / "p.toml", "x = 1\n", "-o", make_parents=True)
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o640
    with pytest.raises(CpbenchError, match="folder .* does not exist"):
        write_atomically(tmp_path / "absent" / "p.toml", "x = 1\n", "-o")
