"""Inference in scenarios, sweep and run (issue 26, Build 4): prefill and decode points validated
in the scenario file, measured on gloo ranks after the float64 check, recorded with TTFT /
per-token latency, tokens/s, KV-cache bytes (analytic vs measured) and bytes at the boundary
equal to the model's; a planted wrong result fails with exit 1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from cpbench.app.sweep import run_sweep
from cpbench.bench import measure
from cpbench.cli.main import app
from cpbench.cli.sweep import wrong_results
from cpbench.config.bench import BenchConfig
from cpbench.config.inference import InferenceStep
from cpbench.errors import CpbenchError
from cpbench.model.inference import decode_bytes, kv_cache_bytes_per_rank
from cpbench.render.inference_table import inference_table
from cpbench.results.scenarios.loading import load_scenario, parse_scenario
from cpbench.results.schema import SCHEMA_VERSION, ResultRecord
from cpbench.results.store import parse_record, read_records, read_results
from tests import inference_sweep_tasks

runner = CliRunner()

SETTINGS = {"name": "inf", "world_size": 2, "device": "cpu", "warmup": 0, "iters": 2,
            "precision": "off", "timeout": 60}  # fmt: skip


def _parse(axes: dict[str, Any], also: list[dict[str, Any]] | None = None) -> Any:
    return parse_scenario({**SETTINGS, "axes": axes, "also": also or []}, "inf.toml")


PREFILL = {"heads": 8, "kv_heads": 8, "head_dim": 16, "phase": "prefill", "cached_len": [0, 37],
           "new_tokens": 6, "scheme": ["pass_kv", "pass_q", "all_gather", "ulysses"]}  # fmt: skip
DECODE = {"phase": "decode", "cached_len": 37, "new_tokens": 3,
          "cache_layout": ["contiguous", "interleaved"]}  # fmt: skip


# --- the scenario file -------------------------------------------------------------------------


@pytest.mark.torch_free
def test_inference_axes_expand_to_one_point_per_step_on_its_schemes_mesh() -> None:
    scenario = _parse(PREFILL, [DECODE])
    points = scenario.distinct("cpu", 2)
    assert len(points) == 2 * 4 + 2  # (P, scheme) x 4, then the two cache layouts
    steps = [p.config.inference for p in points]
    assert all(p.feasibility.ok for p in points)
    for p in points:
        step = p.config.inference
        assert step is not None and p.config.seq_len == step.cached_len + step.new_tokens
        assert p.config.phase == "fwd" and p.config.layout == "contiguous"
        assert (p.config.ulysses, p.config.ring) == ((2, 1) if step.scheme == "ulysses" else (1, 2))
    assert {s.cache_layout for s in steps if s and s.phase == "decode"} == {
        "contiguous", "interleaved"}  # fmt: skip
    # the id names the step (and differs per step); a training point's id has no step in it
    assert len({p.config.key for p in points}) == len(points)
    assert points[1].config.key.endswith("-prefill-pass_q-P0-T6")
    training = BenchConfig(seq_len=64, heads=4, kv_heads=4, head_dim=16, ring=2, device="cpu",
                           world_size=2, phase="fwd")  # fmt: skip
    assert training.key == "L64-B1-h4-kv4-d16-bfloat16-causal-U1xR2-zigzag-repauto-auto-fwd-cpu-w2"
    assert "inference" not in training.to_dict()


@pytest.mark.torch_free
@pytest.mark.parametrize(
    ("axes", "also", "expected"),
    [
        ({**PREFILL, "scheme": "pass_x"}, None,
         "key 'scheme': 'pass_x' is not one of pass_kv, pass_q, all_gather, ulysses"),
        ({**PREFILL, "phase": "train"}, None,
         "key 'phase': 'train' is not one of fwd, fwd+bwd, prefill, decode"),
        ({**PREFILL, "cached_len": -1}, None, "key 'cached_len': -1 must be >= 0"),
        ({**PREFILL, "new_tokens": 0}, None, "key 'new_tokens': 0 must be positive"),
        ({k: v for k, v in PREFILL.items() if k != "new_tokens"}, None,
         "key 'new_tokens' is required in [axes] for phase prefill"),
        ({**PREFILL, "seq_len": 64}, None, "key 'seq_len': [64]: phase prefill takes no seq_len"),
        ({**PREFILL, "layout": "zigzag"}, None, "key 'layout': ['zigzag'] is a training axis"),
        ({**PREFILL, "phase": ["fwd", "prefill"]}, None, "mixes training (fwd) and inference"),
        ({**PREFILL, "cache_layout": "interleaved"}, None,
         "key 'cache_layout': ['interleaved'] is a decode axis, but phase is prefill"),
        ({**PREFILL, "causal": False}, None, "key 'causal': false: phase prefill runs causal"),
        ({"seq_len": 64, "heads": 8, "cached_len": 5}, None,
         "key 'cached_len': [5] is an inference axis (phase prefill or decode), but phase is "
         "fwd+bwd"),
        (PREFILL, [{**DECODE, "new_tokens": 9}],
         "([[also]] table 1): key 'new_tokens': 9: a decode step takes 1 to 8 new tokens"),
        (PREFILL, [{**DECODE, "cache_layout": "striped"}],
         "key 'cache_layout': 'striped' is not one of contiguous, interleaved"),
    ],
)  # fmt: skip
def test_bad_inference_values_name_the_value_and_the_rule(
    axes: dict[str, Any], also: list[dict[str, Any]] | None, expected: str
) -> None:
    with pytest.raises(CpbenchError) as info:
        _parse(axes, also)
    assert expected in str(info.value) and str(info.value).startswith("inf.toml")


@pytest.mark.torch_free
def test_a_bad_inference_scenario_exits_2_with_its_message(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('world_size = 2\ndevice = "cpu"\n[axes]\nheads = 8\nphase = "decode"\n'
                    'new_tokens = 12\n')  # fmt: skip
    result = runner.invoke(app, ["sweep", str(path), "--out", str(tmp_path / "r.jsonl")])
    assert result.exit_code == 2, result.output
    assert "key 'new_tokens': 12: a decode step takes 1 to 8 new tokens" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--phase", "prefill", "--new-tokens", "8", "--seq-len", "100", "--no-causal"],
         "--seq-len, --no-causal: training option(s), not used by --phase prefill"),
        (["--phase", "decode", "--new-tokens", "2", "--window", "4"],
         "--window: training option(s), not used by --phase decode"),
        (["--cached-len", "64", "--scheme", "pass_q"],
         "--cached-len, --scheme: inference (prefill, decode) option(s), not used by --phase "
         "fwd+bwd"),
    ],
)  # fmt: skip
def test_cpbench_run_refuses_the_options_of_the_other_kind_of_step(
    args: list[str], message: str
) -> None:
    result = runner.invoke(app, ["run", "--ring", "2", "--heads", "4", *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


@pytest.mark.torch_free
def test_a_decode_step_of_more_than_eight_tokens_is_no_step() -> None:
    with pytest.raises(CpbenchError, match="a decode step takes 1 to 8 new tokens, got new_tokens 9"):
        InferenceStep(phase="decode", cached_len=0, new_tokens=9, cache_layout="contiguous")
    with pytest.raises(CpbenchError, match="scheme None is not one of"):
        InferenceStep(phase="prefill", cached_len=0, new_tokens=9)


@pytest.mark.torch_free
def test_the_shipped_inference_scenario_expands_to_feasible_points() -> None:
    scenario = load_scenario("cpu-inference")
    points = scenario.distinct("cpu", scenario.world_size)  # type: ignore[arg-type]
    assert scenario.world_size == 2 and all(p.feasibility.ok for p in points)
    phases = {p.config.inference.phase for p in points if p.config.inference}
    assert phases == {"prefill", "decode"} and len(points) == 16 + 8


# --- the sweep on gloo ranks -------------------------------------------------------------------


@pytest.fixture(scope="module")
def swept(
    tmp_path_factory: pytest.TempPathFactory, pool: Any
) -> tuple[list[dict[str, Any]], Path]:
    """One world-2 sweep of every prefill scheme at P = 0 and P = 37 (T = 6: shards of 3) and of
    both decode layouts (P = 37, T = 3, batch 2), on the session's pool."""
    from tests.conftest import lend  # noqa: PLC0415

    monkeypatch = pytest.MonkeyPatch()
    lend(pool, monkeypatch)
    try:
        scenario = _parse(PREFILL, [{**DECODE, "batch": 2}])
        out = tmp_path_factory.mktemp("inference") / "r.jsonl"
        result = run_sweep(scenario, "cpu", 2, out)
    finally:
        monkeypatch.undo()
    return result.records, out


def test_every_inference_record_is_verified_with_bytes_equal_to_the_model(
    swept: tuple[list[dict[str, Any]], Path],
) -> None:
    records, out = swept
    assert len(records) == 10 and {r["status"] for r in records} == {"ok"}, [
        r["error"] for r in records]  # fmt: skip
    assert read_records(out)[0]["schema_version"] == SCHEMA_VERSION == 4
    assert all(isinstance(r, ResultRecord) and r.inference for r in read_results(out))
    schemes = set()
    for r in records:
        step, acc, comm = r["config"]["inference"], r["accuracy"], r["comm"]
        schemes.add(step["scheme"] or step["cache_layout"])
        # verified against the float64 reference before timing, at the step's own lengths
        assert acc["passed"] and acc["max_abs_error"] <= acc["tolerance"] < 1e-4
        assert acc["check_seq_len"] == step["cached_len"] + step["new_tokens"]
        # bytes at the torch.distributed boundary equal prefill_bytes / decode_bytes, per
        # collective and rank, and are not nothing
        assert comm["match"] is True and comm["counted_at"] == "torch.distributed"
        for name, b in comm["by_collective"]["fwd"].items():
            assert b["measured"] == [b["analytic"]] * 2, name
        assert comm["analytic_bytes"]["fwd"] > 0
        # KV-cache bytes per rank: measured tensors within 5% of the model (the done-when;
        # the model counts each rank's exact shards, so here they are equal)
        section = r["inference"]
        assert 0.95 <= section["kv_cache_ratio"] <= 1.05, section
        assert section["kv_cache_ratio"] == 1.0, section
        assert max(section["kv_cache_bytes_measured"]) == pytest.approx(
            section["kv_cache_bytes_analytic"], rel=0.05)  # fmt: skip
        t = r["timing"]
        assert len(t["samples"]) == 2 and t["median"] > 0
        tokens = r["config"]["batch"] * step["new_tokens"]
        assert section["tokens_per_s"] == pytest.approx(tokens / t["median"], rel=1e-9)
        if step["phase"] == "decode":  # the step's latency, and per new token
            assert section["step_latency_s"] == t["median"]
            assert section["per_token_latency_s"] == pytest.approx(
                t["median"] / step["new_tokens"], rel=1e-12)  # fmt: skip
        if step["phase"] == "prefill":
            assert section["ttft_s"] == t["median"] and section["per_token_latency_s"] is None
        else:
            assert section["per_token_latency_s"] == pytest.approx(t["median"] / 3, rel=1e-9)
            assert section["ttft_s"] is None
    assert schemes == {"pass_kv", "pass_q", "all_gather", "ulysses", "contiguous", "interleaved"}
    assert wrong_results(records) == {}


@pytest.mark.torch_free
def test_decode_records_carry_the_models_numbers(swept: tuple[list[dict[str, Any]], Path]) -> None:
    decode = [r for r in swept[0] if r["config"]["inference"]["phase"] == "decode"]
    for r in decode:
        c = r["config"]
        assert c["batch"] == 2
        assert r["comm"]["analytic_bytes"]["fwd"] == sum(
            decode_bytes(3, 2, 8, 16, "float32", 2).values())  # fmt: skip
        # 40 keys over 2 ranks, both layouts: 20 tokens x K and V x 8 heads x 16 x 4 B x B = 2
        analytic = kv_cache_bytes_per_rank(40, 2, 8, 16, "float32", 2)
        assert analytic == 20 * 2 * 8 * 16 * 4 * 2
        assert r["inference"]["kv_cache_bytes_measured"] == [analytic, analytic]


@pytest.mark.torch_free
def test_inference_records_are_not_training_steps_to_the_cost_model(
    swept: tuple[list[dict[str, Any]], Path],
) -> None:
    """calibrate / validate / recommend --results read records through the cost model's
    measurements: a prefill or decode step (config phase fwd, causal, 1 x W, seq_len P + T) must
    not be taken for a training forward over P + T tokens."""
    from cpbench.model.calibrate.measurements import measurement_from_record  # noqa: PLC0415

    records = swept[0]
    assert records and all(r["status"] == "ok" for r in records)
    assert [measurement_from_record(r) for r in records] == [None] * len(records)
    # the same record without its inference step is a measurement: the exclusion is the step's
    training = {**records[0], "config": {**records[0]["config"], "inference": None}}
    assert measurement_from_record(training) is not None


@pytest.mark.torch_free
def test_the_inference_table_reads_at_80_columns(swept: tuple[list[dict[str, Any]], Path]) -> None:
    console = Console(width=80, record=True, force_terminal=False)
    console.print(inference_table([parse_record(r, "swept") for r in swept[0]]))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    first = text.split("(2/")[0]  # the first part: the time beside its checks
    for header in ("how", "TTFT|lat", "max err", "bytes/rank"):
        assert header in first
    assert "ms/tok" in first and first.count(" = ") >= 10


def test_a_planted_wrong_cache_offset_fails_the_sweep_with_exit_1(
    tmp_path: Path, lend_the_session_pool: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ranks shard the decode cache one position off (what the check must catch): the
    record is failed with the error against the reference, the sweep exits 1."""
    path = tmp_path / "planted.toml"
    path.write_text(
        'name = "planted"\nworld_size = 2\ndevice = "cpu"\nwarmup = 0\niters = 1\n'
        'precision = "off"\n[axes]\nheads = 4\nhead_dim = 16\nphase = "decode"\n'
        'cached_len = 21\nnew_tokens = 2\ncache_layout = "interleaved"\n'
    )
    monkeypatch.setattr(measure, "measure_config", inference_sweep_tasks.off_by_one_cache)
    out = tmp_path / "r.jsonl"
    result = runner.invoke(app, ["sweep", str(path), "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert "FAILED: result differs from the reference for 1 configuration" in result.output
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["status"] == "failed" and not record["accuracy"]["passed"]
    assert record["accuracy"]["max_abs_error"] > 10 * record["accuracy"]["tolerance"]
    assert "result differs from the reference" in record["error"]


def test_cpbench_run_measures_one_decode_step(tmp_path: Path, lend_the_session_pool: None) -> None:
    out = tmp_path / "run.jsonl"
    args = ["run", "--phase", "decode", "--cache-layout", "interleaved", "--cached-len", "29",
            "--new-tokens", "2", "--ring", "2", "--heads", "4", "--head-dim", "16",
            "--iters", "1", "--precision", "off", "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    (record,) = read_records(out)
    assert record["id"].endswith("-decode-interleaved-P29-T2") and record["status"] == "ok"
    assert record["comm"]["match"] and record["accuracy"]["passed"]
    # a step without its new tokens is bad input: exit 2, naming the option
    result = runner.invoke(app, ["run", "--phase", "prefill", "--out", str(tmp_path / "x.jsonl")])
    assert result.exit_code == 2 and "--phase prefill needs --new-tokens" in result.output
