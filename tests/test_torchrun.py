"""Launched worlds (torchrun, srun) on CPU with gloo: faults recorded like the local pool's,
`verify` in place, SLURM variables, the in-flight marker, and the documented launch lines."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cpbench.app.record import base_record
from cpbench.app.sweep import INFLIGHT_ERROR, _prepare_output
from cpbench.bench.environment import process_environment
from cpbench.bench.launch import LaunchedRank, launched_rank
from cpbench.bench.pool import accepts_device_id
from cpbench.bench.world import cuda_index
from cpbench.errors import CpbenchError
from cpbench.results.scenarios.loading import load_scenario
from cpbench.results.schema import EnvironmentSection, ResultRecord
from cpbench.results.store import inflight_path, mark_inflight, read_records

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")
DRIVER = ROOT / "tests" / "torchrun_sweep.py"
TIMEOUT = 10  # seconds per configuration: the hanging one costs this much. It was 20: 5 s
# timed the good ones out at load 10 here, and 10 s did twice in full-suite runs on 2 cores,
# when a job's first configuration was mostly its first memory probe importing torch._dynamo
# (16.8 of 17.2 s at load 9); the tracker opts out of that since (bench/memory.py): 0.64 s

SCENARIO = """
name = "faults"
description = "torchrun fault test"
world_size = 2
device = "cpu"
warmup = 0
iters = 2
precision = "off"
timeout = {timeout}

[axes]
seq_len = [64]
heads = [4]
kv_heads = [4]
head_dim = {head_dim}
mesh = ["1x2"]
layout = ["zigzag"]
dtype = "float32"
phase = ["fwd+bwd"]
"""


def _scenario(tmp_path: Path, head_dim: str = "[16, 24, 40, 32]", timeout: float = TIMEOUT) -> Path:
    path = tmp_path / "faults.toml"
    path.write_text(SCENARIO.format(timeout=timeout, head_dim=head_dim))
    return path


def _clean_env() -> dict[str, str]:
    """This test process's environment without any launcher's variables."""
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_")
    return {k: v for k, v in os.environ.items() if not k.startswith(launcher)}


def test_a_raising_and_a_hanging_rank_are_recorded_under_torchrun(tmp_path: Path) -> None:
    """head_dim 24 raises on rank 1 before the mesh exists (rank 0 then waits for it in the
    store, where it cannot be interrupted: the job ends with the record written and torchrun
    restarts it, --resume continuing the file); 40 hangs on both ranks (interrupted at the
    timeout, the process group rebuilt, the sweep goes on in the same job)."""
    out = tmp_path / "r.jsonl"
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
           str(DRIVER), str(_scenario(tmp_path)), str(out), "--resume"]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, env=_clean_env()
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_records(out)
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids)) == 4  # each configuration once, nothing lost
    by_dim = {r["config"]["head_dim"]: r for r in records}
    assert {d: r["status"] for d, r in by_dim.items()} == {
        16: "ok", 24: "failed", 40: "timeout", 32: "ok"
    }
    failed = by_dim[24]["error"]
    assert "out of memory" in failed and failed.startswith("out of memory: rank 1:"), failed
    assert f"within {TIMEOUT} s on ranks [0, 1]" in by_dim[40]["error"]
    assert by_dim[32]["comm"]["match"] and by_dim[32]["accuracy"]["passed"]
    assert not inflight_path(out).exists()
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    if "rerun with --resume to continue" in done.stderr:
        # Rank 0 was stuck where it cannot be interrupted (torch 2.13: a store wait inside
        # new_group): the job said why and what to do, torchrun restarted it, and the last
        # job measured 40 and 32 after one rebuild of its process group.
        assert "another rank failed" in done.stderr
        # rank 1 left at once when rank 0 gave up, not at its own deadline or torchrun's kill
        assert "rank 1: rank 0 gave the task up" in done.stderr
        assert summary == {"counts": {"timeout": 1, "ok": 1}, "spawns": 2}
    else:
        # Every rank could be interrupted (torch 2.5: no such wait): one job, the group
        # rebuilt after each fault.
        assert summary == {"counts": {"ok": 2, "failed": 1, "timeout": 1}, "spawns": 3}


def test_verify_runs_in_place_under_torchrun() -> None:
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "-m", "cpbench.cli",
           "verify", "--device", "cpu", "--json", "--no-masks", "--cp-comm", "p2p"]
    # The mask matrix is tests/test_masks_attention.py's; here the launched world is the point.
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, env=_clean_env()
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)  # rank 0 alone prints: one JSON document
    assert report["world_size"] == 2 and report["passed"] is True
    assert len(report["cases"]) == 80  # 2 meshes x 5 layouts x 2 causal x 4 KV head counts
    assert all(case["passed"] is True for case in report["cases"])


SMALL = """
name = "small"
description = "a first sweep on a cluster: no world size, so the launched world"
warmup = 0
iters = 2

[axes]
seq_len = [32]
heads = [2]
kv_heads = [2]
head_dim = [8]
mesh = ["1x2", "2x1"]
layout = ["zigzag"]
dtype = "float32"
phase = ["fwd"]
"""


def test_a_scenario_without_world_size_runs_on_the_launched_world(tmp_path: Path) -> None:
    """The first command on a cluster, `torchrun --nproc-per-node 2 -m cpbench.cli sweep
    small.toml`, with a scenario naming no world size and mesh 1x2: on main it stopped with
    "ulysses (1) x ring (2) = 2 != world_size (4)" (the CPU default, or the node's GPU count
    on CUDA); the launched world (2) is the default, and both meshes run and pass, each
    recorded once (rank 0 alone writes)."""
    scenario = tmp_path / "small.toml"
    scenario.write_text(SMALL)
    out = tmp_path / "small.jsonl"
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "-m", "cpbench.cli",
           "sweep", str(scenario), "--out", str(out), "--device", "cpu", "--precision", "off"]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, env=_clean_env()
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    records = read_records(out)
    assert [r["config"]["ulysses"] for r in records] == [1, 2]  # rank 0 alone wrote
    for record in records:
        assert record["status"] == "ok" and record["config"]["world_size"] == 2
        assert record["accuracy"]["passed"] is True and record["comm"]["match"]


def test_the_launched_world_is_the_default_world_size(tmp_path: Path) -> None:
    """Scenario.resolve: "auto" is the launched world on either device (not 4 on cpu, not the
    local GPU count on cuda); a named world size that differs from it is an error naming
    both numbers."""
    auto = tmp_path / "auto.toml"
    auto.write_text(SMALL)
    scenario = load_scenario(str(auto))
    assert scenario.resolve("cpu", 0) == ("cpu", 4)
    assert scenario.resolve("cpu", 0, launched_world=2) == ("cpu", 2)
    assert scenario.resolve("cuda", 8, launched_world=16) == ("cuda", 16)
    assert [c.world_size for c, _ in scenario.expand("cpu", 2)] == [2, 2]
    named = tmp_path / "named.toml"
    named.write_text(SMALL.replace('mesh = ["1x2", "2x1"]', 'mesh = "all"').replace(
        "iters = 2", "iters = 2\nworld_size = 4"))  # fmt: skip
    with pytest.raises(CpbenchError, match=r"world_size': 4 != the launched world size \(2 "):
        load_scenario(str(named)).resolve("cpu", 0, launched_world=2)
    assert load_scenario(str(named)).resolve("cpu", 0, launched_world=4) == ("cpu", 4)


def test_a_sweep_launched_with_slurm_variables_alone(tmp_path: Path) -> None:
    """srun's variables (no torchrun): rank 0 hosts the store at MASTER_ADDR:MASTER_PORT.
    Nothing here hangs, so the timeouts are upper bounds only, generous ones: a job's first
    configuration builds its process group and mesh, which took over 10 s at load 7."""
    from cpbench.bench.pool import _free_port  # noqa: PLC0415

    out = tmp_path / "slurm.jsonl"
    base = {**_clean_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
            "SLURM_NTASKS": "2"}
    scenario = _scenario(tmp_path, "[16]", timeout=600)
    cmd = [sys.executable, "-m", "cpbench.cli", "sweep", str(scenario),
           "--out", str(out), "--device", "cpu"]
    procs = [
        subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**base, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)},
        )
        for rank in range(2)
    ]
    outputs = [p.communicate(timeout=900) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outputs]
    (record,) = read_records(out)  # rank 0 alone wrote
    assert record["status"] == "ok" and record["comm"]["match"]
    assert len(record["memory"]["peak_bytes"]) == 2


def test_launched_rank_reads_torchrun_then_slurm_variables() -> None:
    torchrun = {"RANK": "5", "WORLD_SIZE": "16", "LOCAL_RANK": "5", "MASTER_ADDR": "h0"}
    assert launched_rank(torchrun) == LaunchedRank(5, 16, 5, "torchrun")
    slurm = {"SLURM_PROCID": "11", "SLURM_NTASKS": "16", "SLURM_LOCALID": "3",
             "MASTER_ADDR": "h0"}
    assert launched_rank(slurm) == LaunchedRank(11, 16, 3, "slurm")
    # torchrun's variables win; an env:// launch without LOCAL_RANK takes SLURM_LOCALID.
    assert launched_rank({**slurm, "RANK": "1", "WORLD_SIZE": "2"}) == LaunchedRank(
        1, 2, 3, "torchrun"
    )
    # A batch script (SLURM_PROCID 0, no MASTER_ADDR) or a plain shell is no launched world.
    assert launched_rank({"SLURM_PROCID": "0", "SLURM_NTASKS": "16"}) is None
    assert launched_rank({}) is None
    with pytest.raises(CpbenchError, match="SLURM_PROCID='x' must be an integer"):
        launched_rank({**slurm, "SLURM_PROCID": "x"})


def test_each_rank_picks_the_gpu_of_its_local_rank() -> None:
    assert cuda_index(3, 8) == 3
    assert cuda_index(7, 1) == 0  # srun --gpus-per-task 1: one visible GPU per task
    with pytest.raises(CpbenchError, match="every rank would use GPU 0"):
        cuda_index(None, 8)
    with pytest.raises(CpbenchError, match="local rank 8 has no GPU: 8 are visible"):
        cuda_index(8, 8)
    with pytest.raises(CpbenchError, match="no GPU"):
        cuda_index(0, 0)


def test_device_id_is_passed_only_where_init_process_group_takes_it() -> None:
    import torch.distributed as dist  # noqa: PLC0415

    def old_init(backend: str, timeout: object = None) -> None: ...

    def new_init(backend: str, device_id: object = None) -> None: ...

    assert accepts_device_id(new_init) and not accepts_device_id(old_init)
    assert accepts_device_id(dist.init_process_group)  # torch >= 2.3 has it


def _dead_record(tmp_path: Path, head_dim: int) -> ResultRecord:
    """What rank 0 marks before a configuration runs in a launched world."""
    scenario = load_scenario(str(_scenario(tmp_path, f"[{head_dim}]")))
    ((config, feasibility),) = scenario.expand("cpu", 2)
    environment = EnvironmentSection.model_validate(process_environment())
    record = base_record(config, feasibility, scenario, environment)
    record.status = "failed"
    record.error = INFLIGHT_ERROR.format(started=record.timestamp, timeout=4.0)
    return record


def test_resume_records_a_configuration_left_in_flight(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    dead = _dead_record(tmp_path, 16)
    mark_inflight(out, dead)
    assert _prepare_output(out, resume=True, launched=True) == {dead.id}
    (record,) = read_records(out)
    assert record["status"] == "failed" and "the job ended while this" in record["error"]
    assert not inflight_path(out).exists()
    assert _prepare_output(out, resume=True, launched=True) == {dead.id}  # recorded once
    assert len(read_records(out)) == 1
    # A fresh sweep drops a stale marker instead of recording it.
    fresh = tmp_path / "fresh.jsonl"
    mark_inflight(fresh, _dead_record(tmp_path, 32))
    assert _prepare_output(fresh, resume=False, launched=True) == set()
    assert not inflight_path(fresh).exists() and read_records(fresh) == []


def test_the_documented_torchrun_lines_name_a_rendezvous_backend() -> None:
    texts = {
        name: (ROOT / name).read_text()
        for name in ("README.md", "docs/usage.md", "scenarios/two-node.toml", "scenarios/README.md")
    }
    for name, text in texts.items():
        # A command may wrap over several lines (a `\` in shell, plain wrapping in prose).
        commands = re.findall(r"torchrun --nnodes \d[^`\n]*(?:\\\n[^`\n]*|\n(?!\n)[^`\n]*)*", text)
        assert commands or name == "README.md", name  # the README points to docs/usage.md
        for command in commands:
            assert "--rdzv-backend c10d" in command, (name, command)
            assert "--rdzv-id" in command and "--rdzv-endpoint" in command, (name, command)
    usage = texts["docs/usage.md"]
    snippet = usage[usage.index("## Using the attention schemes from Python") :]
    assert snippet.index("torch.cuda.set_device(") < snippet.index("dist.init_process_group(")
