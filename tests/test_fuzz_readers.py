"""Every reader of a user's file, fed generated and mutated files (hypothesis, a fixed and
derandomized budget): a valid parse or a CpbenchError, exit 0 or 2 through the CLI, never a
traceback, never a file written but the output named. The long run: benchmarks/fuzz_readers.py."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import fuzz_inputs as fz

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

FAST = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@contextmanager
def _folder() -> Iterator[Path]:
    """A fresh folder; nothing may appear in it but the input (and the current directory
    must not change)."""
    here = set(os.listdir("."))
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        yield folder
        assert {p.name for p in fz.files_in(folder)} <= {"r.jsonl", "s.toml", "p.toml"} | {
            f"{stem}{suffix}"
            for stem in ("docs", "t")
            for suffix in (".txt", ".json", ".csv", ".jsonl")
        }
    assert set(os.listdir(".")) == here


@FAST
@given(fz.results_files())
def test_results_readers(content: bytes) -> None:
    with _folder() as folder:
        fz.check_results(folder, content)


@FAST
@given(fz.mutated_toml(fz.SCENARIO))
def test_scenario_reader(content: bytes) -> None:
    with _folder() as folder:
        fz.check_scenario(folder, content)


@FAST
@given(st.sampled_from(fz.PROFILES).flatmap(fz.mutated_toml))
def test_profile_reader(content: bytes) -> None:
    with _folder() as folder:
        fz.check_profile(folder, content)


@FAST
@given(fz.documents_files())
def test_documents_reader(file: tuple[str, bytes]) -> None:
    with _folder() as folder:
        fz.check_documents(folder, *file)


@FAST
@given(fz.table_files())
def test_table_reader(file: tuple[str, bytes]) -> None:
    with _folder() as folder:
        fz.check_table(folder, *file)


@settings(FAST, max_examples=6)
@given(fz.results_files())
def test_results_commands(content: bytes) -> None:
    with _folder() as folder:
        fz.check_results_commands(folder, content)


@settings(FAST, max_examples=12)
@given(fz.table_files(), st.sampled_from(fz.PROFILES).flatmap(fz.mutated_toml))
def test_table_and_profile_commands(table: tuple[str, bytes], profile: bytes) -> None:
    with _folder() as folder:
        path = folder / f"t{table[0]}"
        path.write_bytes(table[1])
        fz.check_cli(folder, ["validate", str(path)])
        hardware = folder / "p.toml"
        hardware.write_bytes(profile)
        fz.check_cli(folder, [*fz.RECOMMEND, "--hardware", str(hardware)])


@settings(FAST, max_examples=12)
@given(fz.documents_files())
def test_documents_commands(file: tuple[str, bytes]) -> None:
    with _folder() as folder:
        fz.check_documents_command(folder, file)
