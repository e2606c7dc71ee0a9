"""The command line: JSON answers parse, bad input is one line on stderr and exit code 2."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cpbench.app import sweep as sweep_service
from cpbench.app.verify import VerifyRow
from cpbench.bench.pool import TaskError
from cpbench.cli.main import app
from cpbench.results.store import read_records
from tests import rank_tasks

runner = CliRunner()


@pytest.mark.torch_free
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
        (["verify", "--world-size", "100000"], "world size (100000) on the CPU must be 1 to 64"),
        (["sweep", "--device", "cpu", "--world-size", "65"], "world size (65) on the CPU must be"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.output + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


VERIFY_SAMPLE = 12
"""Cases of the world-2 matrix the CLI tests run: every 40th, both meshes (the whole matrix
runs once, on the session pool, in tests/test_cp_attention.py)."""


@pytest.fixture
def verify_on_the_session_pool(lend_the_session_pool: None, monkeypatch: pytest.MonkeyPatch) -> list:
    """`cpbench verify` on the session's ranks with a sample of its cases; the list fills with
    the arguments the command passed (so a test can check which matrix it chose)."""
    from cpbench.app import verify as verify_service  # noqa: PLC0415

    real = verify_service.run_verify
    calls: list = []

    import inspect  # noqa: PLC0415

    matrix_args = set(inspect.signature(verify_service.default_cases).parameters)

    def sampled(world_size: int, *args: object, **kwargs: object) -> list[VerifyRow]:
        # the matrix's own arguments (run_verify has more: inference, timeout, ...)
        matrix = {k: v for k, v in kwargs.items() if k in matrix_args}
        calls.append((world_size, args, matrix))
        cases = verify_service.default_cases(world_size, *args[1:3], **matrix)  # type: ignore[arg-type]
        return real(world_size, *args, cases=cases[:: len(cases) // VERIFY_SAMPLE], **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(verify_service, "run_verify", sampled)
    return calls


def test_verify_json_world_size_2(verify_on_the_session_pool: list) -> None:
    result = runner.invoke(app, ["verify", "--world-size", "2", "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["passed"] and doc["world_size"] == 2
    assert len(doc["cases"]) >= VERIFY_SAMPLE
    assert {(c["ulysses"], c["ring"]) for c in doc["cases"]} == {(1, 2), (2, 1)}
    assert all(c["max_error"] < c["tolerance"] for c in doc["cases"])
    # the command chose the default matrix that tests/test_cp_attention.py runs whole
    from cpbench.app.verify import default_cases  # noqa: PLC0415

    ((world, args, kwargs),) = verify_on_the_session_pool
    assert default_cases(world, *args[1:3], **kwargs) == default_cases(2)


def test_verify_exits_1_on_a_mismatch(
    verify_on_the_session_pool: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong program (rank 0 scales every ring case's output by 1.01, tests/rank_tasks.py)
    judged for real: the ring cases fail with their error above the tolerance, the Ulysses
    cases pass, `cpbench verify` exits 1 (nccl-tests' rule: a wrong result fails) and its
    table says so."""
    from cpbench.app import verify as verify_service  # noqa: PLC0415

    monkeypatch.setattr(verify_service, "run_cases_on_rank", rank_tasks.cases_with_a_wrong_ring)
    as_json = runner.invoke(app, ["verify", "--world-size", "2", "--device", "cpu", "--json"])
    assert as_json.exit_code == 1, as_json.output
    doc = json.loads(as_json.stdout)
    assert doc["passed"] is False
    for case in doc["cases"]:
        assert case["passed"] == (case["ring"] == 1), case
        assert (case["max_error"] > case["tolerance"]) == (case["ring"] > 1), case
    table = runner.invoke(app, ["verify", "--world-size", "2", "--device", "cpu"])
    assert table.exit_code == 1, table.output
    assert "FAIL" in table.output


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
    """The installed `cpbench` (`cpbench.cli.main:main`): usage errors too are one line, exit 2."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    done = subprocess.run([sys.executable, "-m", "cpbench.cli", *args], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cpbench: error:") and message in lines[0]


SWEEP = """
name = "exit-codes"
description = "one good point, one byte mismatch, one failed reference check"
world_size = 2
device = "cpu"
warmup = 0
iters = 1
precision = "off"
timeout = 60

[axes]
seq_len = [64]
heads = [4]
kv_heads = [4]
head_dim = {head_dims}
mesh = ["1x2"]
layout = ["zigzag"]
dtype = "float32"
phase = ["fwd+bwd"]
"""


def _sweep_file(tmp_path: Path, head_dims: str) -> Path:
    path = tmp_path / "exit-codes.toml"
    path.write_text(SWEEP.format(head_dims=head_dims), encoding="utf-8")
    return path


def test_sweep_exits_1_on_a_wrong_result_and_0_when_all_are_right(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lend_the_session_pool: None
) -> None:
    """A real sweep on 2 gloo ranks (the session's); rank 0 corrupts head_dim 24's counted bytes
    and head_dim 40's reference check (tests/rank_tasks.py). nccl-tests' rule: a benchmark
    that found a wrong result fails."""
    monkeypatch.setattr(
        sweep_service,
        "run_sweep",
        functools.partial(sweep_service.run_sweep, task=rank_tasks.measure_then_corrupt),
    )
    out = tmp_path / "r.jsonl"
    result = runner.invoke(
        app, ["sweep", str(_sweep_file(tmp_path, "[16, 24, 40]")), "--out", str(out)]
    )
    assert result.exit_code == 1, result.output
    records = {r["config"]["head_dim"]: r for r in read_records(out)}
    assert records[16]["status"] == "ok" and records[16]["comm"]["match"] is True
    assert records[24]["comm"]["match"] is False
    assert records[40]["status"] == "failed" and records[40]["accuracy"]["passed"] is False
    assert "FAILED: measured bytes != analytic bytes for 1 configuration" in result.output
    assert "FAILED: result differs from the reference for 1 configuration" in result.output

    good = tmp_path / "good.jsonl"
    result = runner.invoke(app, ["sweep", str(_sweep_file(tmp_path, "[16]")), "--out", str(good)])
    assert result.exit_code == 0, result.output
    assert [r["status"] for r in read_records(good)] == ["ok"]


def test_a_crashed_rank_exits_1_not_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank that dies is a failed run, not bad input."""

    def crash(*args: object, **kwargs: object) -> None:
        raise TaskError("rank 1: process died (exit code -9)", {1: "died"}, restarted=True)

    monkeypatch.setattr(sweep_service, "run_sweep", crash)
    result = runner.invoke(app, ["sweep", str(_sweep_file(tmp_path, "[16]")), "--out",
                                 str(tmp_path / "r.jsonl")])
    assert result.exit_code == 1
    assert result.stderr.strip() == "cpbench: failed: rank 1: process died (exit code -9)"


def test_run_kv_heads_defaults_to_heads(tmp_path: Path, lend_the_session_pool: None) -> None:
    """`--heads 4` alone is MHA: the default never contradicts the other arguments."""
    out = tmp_path / "run.jsonl"
    result = runner.invoke(
        app,
        ["run", "--heads", "4", "--seq-len", "64", "--head-dim", "16", "--ring", "2",
         "--warmup", "0", "--iters", "1", "--precision", "off", "--device", "cpu",
         "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    (record,) = read_records(out)
    assert (record["config"]["heads"], record["config"]["kv_heads"]) == (4, 4)
    assert record["status"] == "ok"


def test_the_command_line_starts_without_the_heavy_libraries() -> None:
    """`cpbench --help` and argument errors stay fast (~0.2 s): registering the commands
    imports neither torch nor the numeric and report libraries (each command imports what it
    needs when it runs). scipy alone made start-up 1.2 s once."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    heavy = ("torch", "scipy", "pandas", "plotly", "numpy", "jinja2")
    probe = (
        "import sys, cpbench.cli.main; "
        f"print(','.join(m for m in {heavy!r} if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == ""


@pytest.mark.parametrize(
    ("head_dim", "timeout", "status", "reason"),
    [(24, "60", "failed", "out of memory"), (40, "2", "timeout", "within 2 s")],
)
def test_run_exits_1_and_says_why_when_its_configuration_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, head_dim: int, timeout: str, status: str,
    reason: str, lend_the_session_pool: None,
) -> None:
    """`cpbench run` measures one configuration: when it fails (head_dim 24: rank 1 raises an
    injected out-of-memory error; 40: the ranks hang and `--timeout 2` abandons them,
    tests/rank_tasks.py), the run failed: exit 1, the status and the reason on stderr, and the
    record says so."""
    monkeypatch.setattr(
        sweep_service,
        "run_sweep",
        functools.partial(sweep_service.run_sweep, task=rank_tasks.measure_or_misbehave),
    )
    out = tmp_path / "r.jsonl"
    result = runner.invoke(
        app,
        ["run", "--heads", "4", "--seq-len", "64", "--head-dim", str(head_dim), "--ring", "2",
         "--warmup", "0", "--iters", "1", "--precision", "off", "--device", "cpu",
         "--timeout", timeout,
         "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert f"cpbench: failed: {status}:" in result.stderr and reason in result.stderr
    (record,) = read_records(out)
    assert record["status"] == status and reason in record["error"]
