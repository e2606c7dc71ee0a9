"""`cpbench sweep` with a `[dynamic]` table: the scenario's validation, one small CPU world-2
study measured once (the session's pool, lent) and its records (one per policy, every routed
group checked, idle share, intervals), `--resume` skipping recorded policies, a failed check
recorded as failed (exit 1), and the report's dynamic-CP section."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cpbench.errors import CpbenchError
from cpbench.results.scenarios.loading import load_scenario, parse_scenario
from cpbench.results.store import read_records
from tests.conftest import lend

SCENARIO = """name = "dyn-test"
world_size = 2
device = "cpu"
warmup = 0
iters = 6
precision = "off"
budget = 0.5

[dynamic]
lengths = "lognormal:mean=96,sigma=1.2,min=16,max=256"
tokens_per_rank = 128
step_tokens = 768
heads = 2
head_dim = 16
rounds = 1
"""
POLICIES = ("static", "megatron", "cpbench")
BASE: dict[str, Any] = {"world_size": 2, "device": "cpu"}
DYNAMIC = {"lengths": "64,32,16", "tokens_per_rank": 64, "heads": 2}


@pytest.mark.torch_free
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dynamic": {k: v for k, v in DYNAMIC.items() if k != "lengths"}},
         "key 'lengths' is required in [dynamic]"),
        ({"dynamic": {**DYNAMIC, "policy": "static"}}, "unknown key 'policy' in [dynamic]"),
        ({"dynamic": {**DYNAMIC, "policies": ["static", "greedy"]}},
         "key 'policies': 'greedy' is not one of static, megatron, cpbench"),
        ({"dynamic": {**DYNAMIC, "kv_heads": 3}}, "key 'kv_heads': 3 does not divide heads (2)"),
        ({"dynamic": {**DYNAMIC, "tokens_per_rank": 0}}, "key 'tokens_per_rank': 0 must be positive"),
        ({"dynamic": {**DYNAMIC, "tokens_per_rank": 16}},
         "key 'tokens_per_rank' in [dynamic]: a sequence of 64 tokens needs"),
        ({"dynamic": {**DYNAMIC, "static_cp": 4}}, "key 'static_cp' in [dynamic]: static CP (4)"),
        ({"dynamic": {**DYNAMIC, "lengths": "zipf:a=1"}}, "key 'lengths' in [dynamic]:"),
        ({"dynamic": {**DYNAMIC, "hardware": "no-such-gpu"}}, "key 'hardware' in [dynamic]:"),
        ({}, "missing the [axes] table (seq_len, heads, ...) or a [dynamic] table"),
        ({"dynamic": DYNAMIC, "also": [{"heads": 4}]}, "[[also]] tables override [axes]"),
    ],
)
def test_a_bad_dynamic_table_names_the_key_and_the_rule(change: dict, message: str) -> None:
    with pytest.raises(CpbenchError) as caught:
        parse_scenario({**BASE, **change}, "s.toml")
    assert str(caught.value).startswith("s.toml: ") and message in str(caught.value)


def test_a_batch_that_does_not_fit_the_ranks_exits_2_before_anything_runs(tmp_path: Path) -> None:
    from typer.testing import CliRunner  # noqa: PLC0415

    from cpbench.cli.main import app  # noqa: PLC0415

    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.replace('world_size = 2\n', ""))  # "auto": 4 ranks on cpu
    res = CliRunner().invoke(app, ["sweep", str(path), "--world-size", "1",
                                   "--out", str(tmp_path / "o.jsonl")])  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "key 'tokens_per_rank' in [dynamic]" in res.output and "(world_size 1)" in res.output
    assert not (tmp_path / "o.jsonl").exists() or not (tmp_path / "o.jsonl").read_text()


@pytest.fixture(scope="module")
def swept(
    pool: Callable[[int], Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, Path, str]]:
    """The scenario swept once by the CLI on the session's 2 ranks: (scenario, results, output)."""
    from typer.testing import CliRunner  # noqa: PLC0415

    from cpbench.cli.main import app  # noqa: PLC0415

    folder = tmp_path_factory.mktemp("dynamic-sweep")
    path, out = folder / "dyn.toml", folder / "dyn.jsonl"
    path.write_text(SCENARIO)
    with pytest.MonkeyPatch.context() as monkeypatch:
        lend(pool, monkeypatch)
        res = CliRunner().invoke(app, ["sweep", str(path), "--out", str(out)],
                                 terminal_width=200)  # fmt: skip
        assert res.exit_code == 0, res.output
        yield path, out, res.output


def test_one_record_per_policy_every_routed_group_checked(swept: tuple[Path, Path, str]) -> None:
    _, out, _ = swept
    records = read_records(out)
    assert [r["dynamic"]["policy"] for r in records] == list(POLICIES)
    (study,) = {r["dynamic"]["study"] for r in records}
    assert [r["id"] for r in records] == [f"{study}-{p}" for p in POLICIES]
    for r in records:
        d, c = r["dynamic"], r["config"]
        assert r["status"] == "ok" and r["schema_version"] == 4 and "timing" not in r
        groups = sum(len(mb) for mb in d["micro_batches"])
        assert d["checks"]["groups"] == d["checks"]["passed"] == groups > 0
        assert d["checks"]["max_error_ratio"] <= 1.0
        assert 0.0 <= d["idle_share"] < 1.0 and 0.0 <= d["predicted_idle_share"] < 1.0
        assert len(d["samples"]) == 6 and d["ci_low"] <= d["median_s"] <= d["ci_high"]
        assert len(d["busy_s"]) == 2 and max(d["busy_s"]) <= d["instrumented_s"] * 1.05
        assert d["predicted_s"] > 0 and d["predicted_static_s"] > 0
        # the plan holds the batch: every sequence once, the config lists their lengths
        assert sum(g["sequences"] for mb in d["micro_batches"] for g in mb) == d["sequences"]
        assert sum(c["documents"]) == c["seq_len"] >= d["step_tokens"]
        assert c["scheme"] == c["layout"] == "dynamic" and c["world_size"] == 2
    static = records[0]["dynamic"]
    assert set(static["degrees"]) == {str(static["static_cp"])}


@pytest.mark.torch_free
def test_the_terminal_table_shows_each_policy_with_its_check_and_speedups(
    swept: tuple[Path, Path, str],
) -> None:
    from cpbench.results.frame import dynamic_speedups  # noqa: PLC0415

    _, out, output = swept
    assert "dynamic CP policies" in output and "3 configurations (3 ok" in output
    records = read_records(out)
    speedups = dynamic_speedups(records)
    for i, r in enumerate(records, 1):
        d = r["dynamic"]
        measured, predicted = speedups[r["id"]]
        assert measured == pytest.approx(records[0]["dynamic"]["median_s"] / d["median_s"])
        assert predicted == pytest.approx(d["predicted_static_s"] / d["predicted_s"])
        # the row in every part of the table (split at the console's width)
        row = " ".join(line for line in output.splitlines() if line.startswith(f"│ {i} │"))
        assert f" {d['policy']} " in row
        assert f"{d['checks']['passed']}/{d['checks']['groups']}" in row
        assert f"{measured:.2f}" in row and f"{predicted:.2f}" in row


def test_resume_skips_the_recorded_policies_and_measures_the_missing_one(
    swept: tuple[Path, Path, str], pool: Callable[[int], Any], tmp_path: Path
) -> None:
    from cpbench.app.sweep import run_sweep  # noqa: PLC0415

    path, out, _ = swept
    lines = out.read_text().splitlines()
    again = tmp_path / "again.jsonl"
    again.write_text("\n".join(lines[:2]) + "\n")  # static, megatron: cpbench is missing
    with pytest.MonkeyPatch.context() as monkeypatch:
        lend(pool, monkeypatch)
        result = run_sweep(load_scenario(str(path)), "cpu", 2, again, resume=True)
        assert result.resumed == 2 and [r["dynamic"]["policy"] for r in result.records] == [
            "cpbench"]
        nothing = run_sweep(load_scenario(str(path)), "cpu", 2, again, resume=True)
    assert nothing.resumed == 3 and nothing.records == []
    assert [r["dynamic"]["policy"] for r in read_records(again)] == list(POLICIES)


@pytest.mark.torch_free
def test_a_failed_routed_check_is_a_failed_record_and_a_wrong_result() -> None:
    from cpbench.app.dynamic import MeasuredPolicy, policy_record  # noqa: PLC0415
    from cpbench.app.sweep import _study_base  # noqa: PLC0415
    from cpbench.cli.sweep import wrong_results  # noqa: PLC0415
    from cpbench.model.dynamic import plan_policies  # noqa: PLC0415
    from cpbench.model.hardware.loading import load_profile  # noqa: PLC0415
    from cpbench.results.schema import EnvironmentSection, dump_record  # noqa: PLC0415

    scenario = parse_scenario({**BASE, "dynamic": DYNAMIC}, "s.toml")
    study = scenario.dynamic_study("cpu", 2)
    assert study is not None
    plans = plan_policies(study.problem, load_profile(study.hardware))
    checks = [{"micro_batch": 0, "group": 0, "label": "U1xR2", "passed": False,
               "max_error": 0.5, "tolerance": 1e-3, "errors": {"dq": 0.5}}]  # fmt: skip
    measured = MeasuredPolicy(plans["static"], [0.01] * 6, [0.01, 0.01], 0.01, checks)
    base = _study_base(study, scenario, EnvironmentSection(), "static")
    record = policy_record(study, "static", base, plans["static"], plans["static"], measured)
    assert record.status == "failed" and "differs from the reference" in str(record.error)
    assert record.dynamic is not None and record.dynamic.checks.passed == 0
    assert record.dynamic.checks.max_error_ratio == pytest.approx(500)
    assert wrong_results([dump_record(record)]) == {
        "a routed group differs from the reference": [record.id]}


@pytest.mark.torch_free
def test_the_cost_model_and_the_training_tables_leave_the_policies_out(
    swept: tuple[Path, Path, str],
) -> None:
    from cpbench.model.calibrate import measurements_from_records  # noqa: PLC0415
    from cpbench.results.schema import is_dynamic_record  # noqa: PLC0415

    records = read_records(swept[1])
    assert all(is_dynamic_record(r) for r in records) and measurements_from_records(records) == []
    older = {"schema_version": 3, "config": {"scheme": "ring", "layout": "zigzag"}}
    assert not is_dynamic_record(older)


@pytest.mark.torch_free
def test_the_report_has_the_dynamic_section(swept: tuple[Path, Path, str]) -> None:
    from cpbench.app.report import build_report  # noqa: PLC0415
    from cpbench.render.html.report import render_report, report_sections  # noqa: PLC0415

    report = build_report([swept[1]])
    assert report.dynamic is not None and list(report.dynamic["policy"]) == list(POLICIES)
    assert report.frame.empty  # the training sections get no policy
    by_key = {s.key: s for s in report_sections(report)}
    for key in ("dynamic-lengths", "dynamic-load", "dynamic-speedup"):
        assert by_key[key].figure is not None, key
    load = by_key["dynamic-load"].figure
    assert load is not None and len(load.data[0].y) == 2 * len(POLICIES)  # busy, per rank
    speedup = by_key["dynamic-speedup"].figure
    assert speedup is not None and list(speedup.data[1].y) == pytest.approx(
        list(report.dynamic["speedup_predicted"]))
    assert "id='dynamic-table'" in render_report(report).html
