"""The GPU acceptance run (benchmarks/gpu_acceptance.sh) in its dry mode on the CPU: the same
steps (doctor, plan, verify per usable impl, the sweep of scenarios/gpu-acceptance.toml with
every usable kernel, report, summary) with tiny sizes on 2 gloo ranks, so the script cannot
rot; and the summary's numbers checked against the files it summarises. The script's runs are
once per CI (its main-torch run): their subject is the script."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from cpbench.results.store import read_records
from tests.ci_split import ONCE_PER_CI, on_the_main_torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_acceptance.sh"


def _summary_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "acceptance_summary", ROOT / "benchmarks" / "acceptance_summary.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


summary = _summary_module()

ONCE_PER_CI_MARK = pytest.mark.skipif(not on_the_main_torch(), reason=ONCE_PER_CI)
"""The script's runs: its steps' code is tested on both torches by the rest of the suite."""


def _run(out: Path, *args: str, dry_env: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CPBENCH_PYTHON": sys.executable, "COLUMNS": "100"}
    env.pop("CPBENCH_ACCEPTANCE_DRY", None)
    if dry_env:
        env["CPBENCH_ACCEPTANCE_DRY"] = "1"
    return subprocess.run(["bash", str(SCRIPT), str(out), *args], capture_output=True,
                          text=True, timeout=240, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("acceptance") / "run"
    return out, _run(out, dry_env=True)


@ONCE_PER_CI_MARK
def test_dry_run_succeeds_and_writes_every_file(dry_run: tuple[Path, Any]) -> None:
    out, done = dry_run
    assert done.returncode == 0, done.stderr + done.stdout
    for name in ("doctor.json", "doctor.txt", "plan.json", "scenario.toml", "sweep.jsonl",
                 "inference.toml", "inference.jsonl", "report.html", "report.json", "summary.md",
                 "verify-cpbench.json"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    steps = [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines()]
    names = [s[0] for s in steps]
    assert names[:3] == ["doctor", "plan", "verify-cpbench"]
    assert names[-4:] == ["sweep-inference", "sweep", "report", "summary"]
    plan = json.loads((out / "plan.json").read_text())
    # the dry run verifies the inference path with the first usable kernel (a GPU run: each)
    assert [n for n in names if n.startswith("verify-inference-")] == [
        f"verify-inference-{plan['kernels'][0]}"]
    assert all(rc == "0" for _, rc, _ in steps), steps
    assert done.stdout == (out / "summary.md").read_text()  # the summary is printed too


@ONCE_PER_CI_MARK
def test_plan_uses_what_doctor_found_usable(dry_run: tuple[Path, Any]) -> None:
    out, _ = dry_run
    doctor = json.loads((out / "doctor.json").read_text())
    plan = json.loads((out / "plan.json").read_text())
    usable = [k["name"] for k in doctor["kernels"]
              if k["dtype"] == "bfloat16" and k["usable"] and k["name"] != "auto"]
    assert (plan["device"], plan["world_size"], plan["dtype"]) == ("cpu", 2, "bfloat16")
    assert plan["kernels"] == usable and {"sdpa", "naive"} <= set(usable)
    usable_impls = [i["name"] for i in doctor["impls"] if i["usable"]]
    assert plan["impls"] == [name for name in usable_impls if ":" not in name]  # once each
    assert plan["impls"][0] == "cpbench"
    # torch_cp runs wherever its torch internals exist (not on the floor torch).
    assert ("torch_cp" in plan["impls"]) == ("torch_cp" in usable_impls)
    records = read_records(out / "sweep.jsonl")
    assert {r["config"]["backend"] for r in records} == set(usable)
    assert {(r["config"]["ulysses"], r["config"]["ring"]) for r in records} == {(1, 2), (2, 1)}
    assert {r["config"]["dtype"] for r in records} == {"bfloat16"}
    assert all(r["status"] == "ok" for r in records)
    for impl in plan["impls"]:
        doc = json.loads((out / f"verify-{impl.replace(':', '_')}.json").read_text())
        assert doc["world_size"] == 2 and doc["passed"] is True
        assert {c["dtype"] for c in doc["cases"]} == {"bfloat16"}


@ONCE_PER_CI_MARK
def test_summary_numbers_are_those_of_the_files(dry_run: tuple[Path, Any]) -> None:
    out, _ = dry_run
    records = read_records(out / "sweep.jsonl")
    rows = {row["kernel"]: row for row in summary.kernel_rows(records)}
    assert set(rows) == {r["config"]["kernel"] for r in records}
    for kernel, row in rows.items():
        values = [r["flops"]["achieved_tflops"] for r in records
                  if r["config"]["kernel"] == kernel]
        assert row["ok"] == len(values)
        assert row["best_tflops"] == pytest.approx(max(values), rel=1e-12)
    verify = json.loads((out / "verify-cpbench.json").read_text())
    counts = summary.verify_counts(verify)
    assert counts["passed"] == len(verify["cases"]) > 0
    assert counts["failed"] == counts["skipped"] == 0
    assert 0 < counts["worst"] <= 1.0
    memory = summary.memory_sources(records)
    assert memory["sources"]["peak_bytes: cpu-tensor-tracker"] == len(records)
    assert "peak_bytes" in memory["fields"]
    assert memory["peak_bytes"] == max(p for r in records for p in r["memory"]["peak_bytes"])

    text = summary.build_summary(out)
    assert text.startswith("# cpbench GPU acceptance (dry run on CPU): ")
    for heading in ("## Versions", "## Steps", "## Verify (bfloat16)", "## Kernels (sweep)",
                    "## Memory"):
        assert heading in text
    assert f"| cpbench | training | {counts['passed']} | 0 | 0 |" in text
    for kernel in json.loads((out / "plan.json").read_text())["kernels"][:1]:
        doc = json.loads((out / f"verify-inference-{kernel}.json").read_text())
        for kind in ("training", "prefill", "decode"):
            kind_counts = summary.verify_counts(doc, kind)
            assert kind_counts["passed"] > 0 and kind_counts["failed"] == 0
            assert (f"| inference-{kernel} | {kind} | {kind_counts['passed']} | 0 | 0 |"
                    in text)
    inference = read_records(out / "inference.jsonl")
    steps = {row["step"]: row for row in summary.inference_rows(inference)}
    assert set(steps) == {f"prefill {s}" for s in ("pass_kv", "pass_q", "all_gather", "ulysses")
                          } | {"decode contiguous", "decode interleaved"}
    for name, row in steps.items():
        phase, what = name.split()
        mine = [r for r in inference if r["config"]["inference"]["phase"] == phase and what in (
            r["config"]["inference"].get("scheme"), r["config"]["inference"].get("cache_layout"))]
        seconds = [r["inference"]["ttft_s" if phase == "prefill" else "step_latency_s"]
                   for r in mine]
        assert row["ok"] == len(mine) > 0 and row["fastest"][0] == min(seconds)
        assert row["slowest"][0] == max(seconds)
    assert "## Inference (sweep)" in text
    for kernel, row in rows.items():
        assert f"| {kernel} | {row['ok']} | - | {summary._tflops(row['best_tflops'])} |" in text
    doctor = json.loads((out / "doctor.json").read_text())
    assert f"| {doctor['torch']} |" in text
    assert "no GPU: CUDA not available" in text


@ONCE_PER_CI_MARK
def test_without_a_gpu_the_real_run_stops_with_the_reason(tmp_path: Path) -> None:
    done = _run(tmp_path / "real")
    assert done.returncode == 2
    assert "no GPU" in done.stderr and "--dry-run" in done.stderr
    assert "no GPU: CUDA not available" in (tmp_path / "real" / "summary.md").read_text()
    assert not (tmp_path / "real" / "sweep.jsonl").exists()


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert _run(tmp_path, "--bogus").returncode == 2
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "usage:" in done.stderr


def test_summary_carries_the_cuda_kernel_tests_last_line(tmp_path: Path) -> None:
    log = ROOT / "docs" / "gpu-runs" / "2026-12-04-h200" / "test_cuda_kernels.txt"
    (tmp_path / "cuda-kernels.txt").write_text(log.read_text())
    text = summary.build_summary(tmp_path)
    assert "## Kernels against float64 (tests/test_cuda_kernels.py)\n\n46 passed, 62 skipped" in text
