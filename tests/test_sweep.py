"""The sweep harness end to end on CPU ranks: records, skips, faults, resume, counted bytes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from cpbench.app.sweep import run_sweep
from cpbench.results.scenarios.loading import load_scenario
from cpbench.results.schema import SCHEMA_VERSION
from cpbench.results.store import SOURCE_KEY, read_records, read_results, records_frame
from tests import rank_tasks

if TYPE_CHECKING:
    from cpbench.bench.pool import WorkerPool

TINY = """
name = "tiny"
description = "test scenario"
world_size = 2
device = "cpu"
warmup = 0
iters = 2
precision = "off"
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


def test_sweep_records_every_point_with_equal_bytes(
    tmp_path: Path, lend_the_session_pool: None, pool: Callable[[int], WorkerPool]
) -> None:
    path = _scenario(tmp_path, kv_heads="[4, 1]", phase='["fwd", "fwd+bwd"]')
    scenario = load_scenario(str(path))
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
        assert r["schema_version"] == SCHEMA_VERSION
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
    # The ranks measured (medians and their intervals) without scipy: its import cost each
    # rank most of a second before it could say "ready".
    assert pool(2).run(rank_tasks.imported, "scipy.stats", timeout=60) == [False, False]
    frame = records_frame(records)
    assert len(frame) == len(records) and set(frame["status"]) == {"ok"}
    assert (frame["seq_len"] == 64).all()


HANG_TIMEOUT = 10
"""Seconds per configuration of the fault test: what the hang costs, and the bound the good
configurations must stay under on a loaded machine (30 until the memory probe stopped importing
torch._dynamo in a fresh rank's first configuration: 17 s of it at load 9)."""


def test_failing_and_hanging_configurations_inside_a_sweep(
    tmp_path: Path, lend_the_session_pool: None
) -> None:
    # head_dim 24 raises on rank 1, 40 hangs (waits for an event that never comes); 16 and 32
    # are good (2 fixed iterations) and must all be recorded. What is judged is each record's
    # status, not a time: the timeout is only an upper bound for the good ones, and so a
    # generous one (under 1 s each idle; 0.64 s for a fresh rank's first at load 9); the hang
    # costs it once. The sweep starts on the session's ranks; each fault replaces them (the
    # pool kills stuck ranks), and the session pool lives on afterwards.
    scenario = load_scenario(
        str(_scenario(tmp_path, kv_heads="[4]", head_dim="[16, 24, 40, 32]", timeout=HANG_TIMEOUT, mesh='["1x2"]'))
    )
    out = tmp_path / "r.jsonl"
    result = run_sweep(scenario, "cpu", 2, out, task=rank_tasks.measure_or_misbehave)
    by_dim: dict[int, set[str]] = {}
    for r in read_records(out):
        by_dim.setdefault(r["config"]["head_dim"], set()).add(r["status"])
    assert by_dim == {16: {"ok"}, 24: {"failed"}, 40: {"timeout"}, 32: {"ok"}}
    failed = next(r for r in result.records if r["status"] == "failed")
    assert "out of memory" in failed["error"] and "rank 1" in failed["error"]
    assert result.spawns >= 2  # the ranks were replaced after the fault and after the hang


def test_infeasible_points_are_skipped_with_the_rule(tmp_path: Path, lend_the_session_pool: None) -> None:
    path = _scenario(tmp_path, kv_heads="[3]")
    path.write_text(path.read_text().replace("heads = [4]", "heads = [3]"))
    scenario = load_scenario(str(path))
    out = tmp_path / "r.jsonl"
    result = run_sweep(scenario, "cpu", 2, out)
    statuses = {(r["config"]["ulysses"], r["status"]) for r in result.records}
    assert statuses == {(1, "ok"), (2, "skipped")}
    skipped = next(r for r in result.records if r["status"] == "skipped")
    assert "ulysses (2) must divide heads (3)" in skipped["error"]


def test_resume_after_a_killed_sweep_loses_and_duplicates_nothing(
    tmp_path: Path, lend_the_session_pool: None
) -> None:
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


def test_ctrl_c_during_a_sweep_exits_130_and_keeps_every_finished_record(
    tmp_path: Path, lend_the_session_pool: None
) -> None:
    """Ctrl-C (SIGINT to the terminal's foreground process group: the CLI and its ranks, which
    ignore it) after two records: exit 130 (128 + SIGINT), the message, every line in the file
    a whole record (no torn write), and no rank left running; --resume then adds the rest."""
    import warnings  # noqa: PLC0415

    path = _scenario(tmp_path, kv_heads="[4, 2]", head_dim="[16, 32]")
    # 16 steps a configuration (a few ms each): the 6 left after the second record take
    # seconds, so the signal lands inside the sweep even when this process polls late (at
    # 2 steps the sweep once ended before it)
    path.write_text(path.read_text().replace("iters = 2\n", "iters = 16\n"))
    out = tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", "cpbench.cli", "sweep", str(path), "--out", str(out)]
    # SIGINT's default action in the sweep, as in a terminal's foreground job: a job that a
    # shell started in the background ignores SIGINT, and so would the sweep it inherited that
    # from (Python then installs no KeyboardInterrupt): the sweep ran to its end, exit 0.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (
        not out.exists() or len(out.read_text().splitlines()) < 2
    ):
        time.sleep(0.1)
    written = len(out.read_text().splitlines())
    os.killpg(proc.pid, signal.SIGINT)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, (proc.returncode, output[-2000:])
    assert "interrupted: every configuration finished so far is saved" in output
    assert "8/8" not in output  # the progress bar stays where the sweep stopped (issue 39)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a torn line would warn
        kept = read_records(out)
    assert written <= len(kept) < 8 and {r["status"] for r in kept} == {"ok"}
    for _ in range(50):  # the ranks go with the parent
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("ranks of the interrupted sweep were still running after 5 s")
    again = run_sweep(load_scenario(str(path)), "cpu", 2, out, resume=True)
    assert again.resumed == len(kept) and len(read_records(out)) == 8


def test_interleaved_remeasurement_alternates_and_stops_by_its_rule(pool) -> None:  # type: ignore[no-untyped-def]
    """`measure_interleaved` (sweep --separate-ties) on 2 ranks, L = 64 and L = 1024 (16x the
    tokens, ~250x the attention work): round-order samples, one per configuration per round,
    at least 6 rounds and at most max_iters; it stops before max_iters only when the ranking
    is clear; the longer sequence is the slower in the median and in (all but at most one of)
    the rounds."""
    import statistics  # noqa: PLC0415

    from cpbench.bench.measure import measure_interleaved  # noqa: PLC0415
    from cpbench.config.bench import BenchConfig  # noqa: PLC0415
    from cpbench.model.ties import median_interval, rank_with_ties  # noqa: PLC0415

    def config(seq_len: int) -> dict:
        return BenchConfig(
            seq_len=seq_len, batch=1, heads=4, kv_heads=4, head_dim=32, dtype="float32",
            causal=True, ulysses=1, ring=2, layout="zigzag", kv_replication=None,
            kernel="auto", phase="fwd+bwd", device="cpu", world_size=2,
        ).to_dict()  # fmt: skip

    settings = {"warmup": 0, "iters": 2, "max_iters": 12, "precision": None, "budget": 20.0}
    per_rank = pool(2).run(measure_interleaved, [config(64), config(1024)], settings, timeout=300)
    assert per_rank[0] == per_rank[1]  # max over ranks: the same on both
    flat = per_rank[0]
    assert len(flat) % 2 == 0 and all(x > 0 for x in flat)
    short, long = flat[0::2], flat[1::2]
    assert 6 <= len(short) <= 12
    ranked = rank_with_ties({"0": median_interval(short), "1": median_interval(long)})
    assert ranked.clear or len(short) == 12
    assert statistics.median(long) > statistics.median(short)
    # interleaved: round by round the longer step is the slower (a spike may flip one round;
    # samples grouped by configuration instead of by round would pair like with like)
    assert sum(b > a for a, b in zip(short, long, strict=True)) >= len(short) - 1, flat


def test_cli_run_prints_one_record_and_bad_input_exits_2(tmp_path: Path, lend_the_session_pool: None) -> None:
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
            "--precision",
            "off",
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


def test_equivalent_points_run_once_to_a_precision_with_a_full_length_row_check(
    tmp_path: Path, lend_the_session_pool: None
) -> None:
    """Two layouts on every 2-rank mesh: at ring degree 1 they are one computation (recorded
    once, as contiguous, the zigzag name listed); every record has its interval, iteration
    count and the machine's state; L = 128 exceeds the check cap (64), so the record carries
    the full-length sampled-row error beside the capped check; --resume adds nothing."""
    path = _scenario(tmp_path, kv_heads="[4]")
    text = path.read_text().replace("seq_len = [64]", "seq_len = [128]")
    text = text.replace('layout = ["zigzag"]', 'layout = ["zigzag", "contiguous"]')
    text = text.replace('precision = "off"', "precision = 0.05\nbudget = 0.5\ncheck_max_seq_len = 64")
    path.write_text(text)
    scenario = load_scenario(str(path))
    assert len(scenario.expand("cpu", 2)) == 4
    out = tmp_path / "r.jsonl"
    result = run_sweep(scenario, "cpu", 2, out)
    records = read_records(out)
    assert len(records) == 3 and result.duplicates == 1
    ids = [r["id"] for r in records]
    assert len(set(ids)) == 3
    ulysses = next(r for r in records if r["config"]["ring"] == 1)
    assert ulysses["config"]["layout"] == "contiguous"
    assert ulysses["config"]["equivalent"] == [ulysses["id"].replace("contiguous", "zigzag")]
    assert ulysses["timing"]["overlap_status"] == "none by construction"
    assert ulysses["timing"]["overlap"] == 0.0
    for r in records:
        assert r["status"] == "ok", r["error"]
        t = r["timing"]
        assert t["iterations"] == len(t["samples"]) >= 6  # enough for a 95% interval
        assert t["ci_low"] <= t["median"] <= t["ci_high"]
        assert t["precision_target"] == 0.05
        assert t["stop_reason"] in ("precision reached", "max iterations", "time budget")
        assert t["target_met"] == (t["relative_width"] <= 0.05)
        acc = r["accuracy"]
        assert acc["check_seq_len"] == 64 and acc["passed"]
        rows = acc["sampled_rows"]
        assert rows["seq_len"] == 128 > acc["check_seq_len"] and rows["rows"] == 128
        assert rows["passed"] and rows["max_abs_error"] < rows["bound"]
        machine = r["environment"]["machine"]
        assert machine["ranks_on_node"] == 2 and machine["cores"] >= 1
        assert machine["oversubscribed"] == (machine["ranks_per_core"] > 1)
        # measured from /proc/stat and the ranks' own CPU clocks: a share of the machine
        other = machine["other_cpu"]
        assert (other is None) == (not Path("/proc/stat").exists())
        assert other is None or 0.0 <= other <= 1.0
        if other is not None and other <= 0.10:
            assert not [w for w in machine["warnings"] if w.startswith("other load")]
    again = run_sweep(scenario, "cpu", 2, out, resume=True)
    assert again.resumed == 3 and not again.records
    assert len(read_records(out)) == 3


def test_separate_ties_remeasures_tied_leaders_interleaved(tmp_path: Path, lend_the_session_pool: None) -> None:
    """Two meshes of one problem timed with a fixed count of 1 iteration (the sample range,
    wide): with --separate-ties the tied leaders carry the interleaved re-measurement."""
    from cpbench.app.sweep import settle_ties  # noqa: PLC0415
    from cpbench.results.schema import ResultRecord  # noqa: PLC0415

    path = _scenario(tmp_path, kv_heads="[4]")
    out = tmp_path / "r.jsonl"
    scenario = load_scenario(str(path))
    run_sweep(scenario, "cpu", 2, out, precision=None)
    records = [ResultRecord.model_validate({k: v for k, v in r.items() if k != SOURCE_KEY})
               for r in read_records(out)]
    for r in records:  # make them tie: the same wide interval
        assert r.timing is not None
        r.timing.ci_low, r.timing.ci_high, r.timing.median = 0.5, 1.5, 1.0
    calls: list[int] = []

    def remeasure(dicts: list[dict]) -> list[float]:
        calls.append(len(dicts))
        return [1.0, 2.0] * 8  # A fast, B slow, 8 rounds

    settle_ties(records, remeasure)
    assert calls == [2]
    tb = [r.timing.tiebreak for r in records if r.timing is not None]
    assert all(t is not None and t["separated"] and t["iterations"] == 8 for t in tb)
    assert tb[0]["median"] == 1.0 and tb[1]["median"] == 2.0  # type: ignore[index]
    assert tb[0]["leader"] == records[0].id  # type: ignore[index]
