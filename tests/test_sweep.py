"""The sweep harness end to end on CPU ranks: records, skips, faults, resume, counted bytes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cpbench.app.sweep import run_sweep
from cpbench.results.scenarios import load_scenario
from cpbench.results.store import SOURCE_KEY, read_records, read_results, records_frame
from tests import rank_tasks

TINY = """
name = "tiny"
description = "test scenario"
world_size = 2
device = "cpu"
warmup = 0
iters = 2
timeout = {timeout}

[axes]
seq_len = [64]
heads = [4]
kv_heads = {kv_heads}
head_dim = {head_dim}
mesh = {mesh}
layout = ["zigzag"]
dtype = "float32"
phase = {phase}
"""


def _scenario(  # type: ignore[no-untyped-def]
    tmp_path: Path, kv_heads="[4, 2]", head_dim="[16]", phase='["fwd+bwd"]', timeout=60,
    mesh='"all"',
) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(
        TINY.format(kv_heads=kv_heads, head_dim=head_dim, phase=phase, timeout=timeout, mesh=mesh)
    )
    return path


def test_sweep_records_every_point_with_equal_bytes(tmp_path: Path) -> None:
    scenario = load_scenario(
        str(_scenario(tmp_path, kv_heads="[4, 1]", phase='["fwd", "fwd+bwd"]'))
    )
    out = tmp_path / "r.jsonl"
    result = run_sweep(scenario, "cpu", 2, out)
    records = read_records(out)
    assert len(records) == len(result.records) == 2 * 2 * 2  # kv x mesh x phase
    assert [r["id"] for r in records] == [r["id"] for r in result.records]
    # What the sweep returns is what it wrote, and every line is a typed record.
    assert [{k: v for k, v in r.items() if k != SOURCE_KEY} for r in records] == result.records
    typed = read_results(out)
    assert all(r.source == "r.jsonl" and r.config and r.config.impl == "cpbench" for r in typed)
    assert {r["status"] for r in records} == {"ok"}
    for r in records:
        assert r["schema_version"] == 1
        assert r["comm"]["match"], r["comm"]["by_collective"]
        assert r["accuracy"]["max_abs_error"] < r["accuracy"]["tolerance"]
        t = r["timing"]
        assert len(t["samples"]) == 2 and t["p10"] <= t["median"] <= t["p90"]
        assert t["overlap"] is None or 0.0 <= t["overlap"] <= 1.0
        assert len(r["memory"]["peak_bytes"]) == 2 and min(r["memory"]["peak_bytes"]) > 0
        assert r["memory"]["source"] == "cpu-tensor-tracker"
        # The kernel and the version of what ran it (PyTorch's own CPU op: torch's version).
        assert r["config"]["kernel"] == "sdpa"
        assert r["environment"]["kernel_version"] == str(torch.__version__)
        assert r["flops"]["achieved_tflops"] > 0
        assert ("bwd" in r["comm"]["analytic_bytes"]) == (r["config"]["phase"] == "fwd+bwd")
    # KV replication was used where U (2) > kv_heads (1).
    assert {r["config"]["kv_replication"] for r in records if r["config"]["ulysses"] == 2} == {1, 2}
    frame = records_frame(records)
    assert len(frame) == len(records) and set(frame["status"]) == {"ok"}
    assert (frame["seq_len"] == 64).all()


def test_failing_and_hanging_configurations_inside_a_sweep(tmp_path: Path) -> None:
    # head_dim 24 raises on rank 1, 40 hangs; 16 and 32 are good and must all be recorded.
    scenario = load_scenario(
        str(_scenario(tmp_path, kv_heads="[4]", head_dim="[16, 24, 40, 32]", timeout=10, mesh='["1x2"]'))
    )
    out = tmp_path / "r.jsonl"
    result = run_sweep(scenario, "cpu", 2, out, task=rank_tasks.measure_or_misbehave)
    by_dim: dict[int, set[str]] = {}
    for r in read_records(out):
        by_dim.setdefault(r["config"]["head_dim"], set()).add(r["status"])
    assert by_dim == {16: {"ok"}, 24: {"failed"}, 40: {"timeout"}, 32: {"ok"}}
    failed = next(r for r in result.records if r["status"] == "failed")
    assert "out of memory" in failed["error"] and "rank 1" in failed["error"]
    assert result.spawns >= 2  # the pool was replaced after the hang


def test_infeasible_points_are_skipped_with_the_rule(tmp_path: Path) -> None:
    path = _scenario(tmp_path, kv_heads="[3]")
    path.write_text(path.read_text().replace("heads = [4]", "heads = [3]"))
    scenario = load_scenario(str(path))
    out = tmp_path / "r.jsonl"
    result = run_sweep(scenario, "cpu", 2, out)
    statuses = {(r["config"]["ulysses"], r["status"]) for r in result.records}
    assert statuses == {(1, "ok"), (2, "skipped")}
    skipped = next(r for r in result.records if r["status"] == "skipped")
    assert "ulysses (2) must divide heads (3)" in skipped["error"]


def test_resume_after_a_killed_sweep_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    path = _scenario(tmp_path, kv_heads="[4, 2, 1]", head_dim="[16, 32]")
    out = tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", "cpbench.cli", "sweep", str(path), "--out", str(out)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (
        not out.exists() or len(out.read_text().splitlines()) < 2
    ):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole session: parent and its ranks
    proc.wait()
    first = read_records(out)
    assert 2 <= len(first) < 12
    with out.open("a") as f:
        f.write('{"schema_version": 1, "id": "torn')  # a crash in the middle of a write
    with pytest.warns(UserWarning):
        done = read_records(out)
    assert len(done) == len(first)
    from typer.testing import CliRunner  # noqa: PLC0415

    from cpbench.cli.main import app  # noqa: PLC0415

    res = CliRunner().invoke(app, ["sweep", str(path), "--out", str(out), "--resume"])
    assert res.exit_code == 0, res.output
    records = read_records(out)  # the resumed sweep cut the torn fragment before appending
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids)) == 12  # 3 kv x 2 head dims x 2 meshes, each once
    assert {r["status"] for r in records} == {"ok"}


def test_cli_run_prints_one_record_and_bad_input_exits_2(tmp_path: Path) -> None:
    from typer.testing import CliRunner  # noqa: PLC0415

    from cpbench.cli.main import app  # noqa: PLC0415

    out = tmp_path / "one.jsonl"
    res = CliRunner().invoke(
        app,
        [
            "run",
            "--seq-len",
            "64",
            "--heads",
            "4",
            "--kv-heads",
            "2",
            "--head-dim",
            "16",
            "--ulysses",
            "2",
            "--ring",
            "1",
            "--iters",
            "2",
            "--device",
            "cpu",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    (record,) = read_records(out)
    assert record["status"] == "ok" and record["comm"]["match"]
    bad = CliRunner().invoke(app, ["run", "--seq-len", "60", "--ring", "8", "--device", "cpu"])
    assert bad.exit_code == 2
    assert "seq_len (60) must be divisible by" in bad.stderr


def test_sweep_under_torchrun_uses_the_launched_world(tmp_path: Path) -> None:
    """`torchrun -m cpbench.cli sweep` (how multi-node sweeps run): the launched processes are
    the world; rank 0 writes every record once."""
    path = _scenario(tmp_path, kv_heads="[4]")
    out = tmp_path / "tr.jsonl"
    torchrun = Path(sys.executable).with_name("torchrun")
    from cpbench.bench.pool import _free_port  # noqa: PLC0415

    port = str(_free_port())
    cmd = [str(torchrun), "--nproc-per-node", "2", "--master-port", port, "-m", "cpbench.cli",
           "sweep", str(path), "--out", str(out), "--device", "cpu"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    records = read_records(out)
    assert [r["config"]["ulysses"] for r in records] == [1, 2]
    assert all(r["status"] == "ok" and r["comm"]["match"] for r in records)


def test_bad_output_and_timeout_fail_before_anything_runs(tmp_path: Path) -> None:
    from typer.testing import CliRunner  # noqa: PLC0415

    from cpbench.cli.main import app  # noqa: PLC0415

    path = _scenario(tmp_path, kv_heads="[4]")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    started = time.monotonic()
    res = CliRunner().invoke(app, ["sweep", str(path), "--out", str(blocker / "r.jsonl")])
    assert res.exit_code == 2 and "cannot write results to" in res.stderr
    assert time.monotonic() - started < 10  # no rank was spawned
    for bad in ("0", "-1", "nan"):
        res = CliRunner().invoke(app, ["sweep", str(path), "--timeout", bad])
        assert res.exit_code == 2 and "--timeout" in res.stderr, res.output
