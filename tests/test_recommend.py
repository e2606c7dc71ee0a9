"""`cpbench recommend`: the default answer, rejections, parallel sizes, framework settings."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cpbench.app.recommend import (
    RecommendRequest,
    cp_comm_type,
    recommend,
    recommendation_report,
    solve_parallel_sizes,
)
from cpbench.cli.main import app
from cpbench.config.constraints import AttentionShape
from cpbench.errors import CpbenchError
from cpbench.model.cost import MeshCandidate
from cpbench.model.hardware import load_profile
from tests.synthetic import synthetic_record

runner = CliRunner()


@pytest.fixture(scope="module")
def default():
    return recommend(RecommendRequest(heads=32, kv_heads=8))


def test_default_answer_is_feasible_and_ranked(default) -> None:
    assert default.request.seq_len == 131072 and default.profile.name == "h100-sxm"
    assert default.sizes.cp == 8 and default.gpus_per_node == 8
    times = [r.time_s for r in default.ranked]
    assert times == sorted(times) and len(times) >= 4
    assert all(r.prediction.fits for r in default.ranked)
    assert {(r.prediction.config.ulysses, r.prediction.config.ring) for r in default.ranked} == {
        (1, 8),
        (2, 4),
        (4, 2),
        (8, 1),
    }
    winner = default.winner
    assert winner is not None
    # one node of NVLink: all-to-all is cheap and the kernel sees the whole sequence
    assert (winner.prediction.config.ulysses, winner.prediction.config.ring) == (8, 1)
    assert "8x1" in default.explanation and "ahead of the next mesh" in default.explanation
    assert default.rejected == ()


def test_contiguous_ranks_below_zigzag_for_causal(default) -> None:
    order = [(r.prediction.config.ring, r.prediction.config.layout) for r in default.ranked]
    assert order.index((8, "zigzag")) < order.index((8, "contiguous"))


def test_rejections_carry_the_rule() -> None:
    rec = recommend(RecommendRequest(heads=32, kv_heads=8, gpus=64))
    rules = {(r.ulysses, r.ring): r.rule for r in rec.rejected}
    assert "ulysses (64) must divide heads (32)" in rules[(64, 1)]
    memory = recommend(RecommendRequest(heads=32, kv_heads=8, seq_len=1 << 24))
    assert memory.winner is None and memory.rejected
    assert all(r.kind == "memory" for r in memory.rejected)
    assert "GiB per rank > 79.6 GiB of device memory (h100-sxm)" in memory.rejected[0].rule
    assert "No candidate is feasible" in memory.explanation


def test_kv_replication_is_automatic() -> None:
    rec = recommend(RecommendRequest(heads=32, kv_heads=4, gpus=8))
    ulysses_8 = next(r for r in rec.ranked if r.prediction.config.ulysses == 8)
    assert ulysses_8.prediction.config.kv_replication == 2


def test_parallel_sizes_worked_example() -> None:
    sizes = solve_parallel_sizes(8, tp=2, cp=2, pp=1)
    assert sizes.dp == 2
    assert sizes.world_formula() == "world 8 = TP 2 x CP 2 x PP 1 x DP 2"
    sizes = solve_parallel_sizes(8, tp=2, cp=2, micro_batch=1, grad_accum=4)
    assert sizes.global_batch == 8
    assert "micro_batch 1 x grad_accum 4 x DP 2 = 8" in sizes.batch_formula()
    assert solve_parallel_sizes(8, tp=2).cp == 4
    with pytest.raises(CpbenchError, match=r"gpus \(8\) must be divisible by TP x CP x PP = 2 x 3"):
        solve_parallel_sizes(8, tp=2, cp=3)
    with pytest.raises(CpbenchError, match=r"gpus \(8\) must be divisible by TP x PP = 3 x 1 = 3"):
        solve_parallel_sizes(8, tp=3)


def test_tp_splits_heads_before_cp() -> None:
    rec = recommend(RecommendRequest(heads=32, kv_heads=8, tp=2, cp=2))
    assert rec.sizes.dp == 2 and rec.shape.heads == 16 and rec.shape.kv_heads == 4
    report = recommendation_report(rec)
    assert report["parallel"]["dp"] == 2
    megatron = report["frameworks"][0]["settings"]
    assert "--tensor-model-parallel-size 2" in megatron and "--context-parallel-size 2" in megatron
    with pytest.raises(
        CpbenchError, match=r"TP \(16\) must divide heads \(32\) and kv_heads \(8\)"
    ):
        recommend(RecommendRequest(heads=32, kv_heads=8, gpus=16, tp=16))


def test_framework_settings_for_a2a_p2p() -> None:
    rec = recommend(RecommendRequest(heads=32, kv_heads=8, gpus=16))
    winner = rec.winner
    assert winner is not None
    config = winner.prediction.config
    assert (config.ulysses, config.ring) == (8, 2)  # Ulysses inside each node, ring across
    settings = {f.framework: f for f in rec.frameworks}
    megatron = settings["Megatron-LM"]
    assert "--context-parallel-size 16" in megatron.settings
    assert "--cp-comm-type a2a+p2p" in megatron.settings
    assert "--hierarchical-context-parallel-sizes 8 2" in megatron.settings
    assert "set_seq_parallel_pg(8, 2, rank, world_size=16)" in settings["yunchang"].settings
    assert 'ring_impl_type="zigzag"' in settings["yunchang"].settings
    assert not settings["DeepSpeed"].expressible
    assert "cannot express a ring (R = 2)" in settings["DeepSpeed"].note
    assert not settings["torchtitan"].expressible
    assert "ring-only with head-tail load balancing" in settings["torchtitan"].note
    assert "context_parallel_degree 16" in settings["torchtitan"].settings


def test_cp_comm_type() -> None:
    assert cp_comm_type(1, 8) == "p2p"
    assert cp_comm_type(8, 1) == "a2a"
    assert cp_comm_type(4, 2) == "a2a+p2p"


def test_measured_configurations_rank_by_measurement(tmp_path: Path) -> None:
    profile = load_profile("cpu-local")
    rng = random.Random(0)
    shape = AttentionShape(2048, 8, 4, 64)
    records = [
        synthetic_record(MeshCandidate(shape, u, r, layout, "float32"), profile, 4, 0.02, rng)
        for u, r in ((1, 4), (2, 2), (4, 1))
        for layout in ("contiguous", "zigzag")
    ]
    path = tmp_path / "cpu.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    rec = recommend(
        RecommendRequest(
            heads=8, kv_heads=4, seq_len=2048, head_dim=64, gpus=4, dtype="fp32",
            results=(str(path),), top=0,
        )
    )  # fmt: skip
    assert rec.profile.name == "cpu-local-calibrated" and rec.calibration is not None
    sources = {
        (r.prediction.config.ulysses, r.prediction.config.layout): r.source for r in rec.ranked
    }
    assert sources[(2, "zigzag")] == "measured" and sources[(2, "striped")] == "model"
    assert sources[(4, "contiguous")] == "measured"  # U x 1: any layout matches
    measured = [r for r in rec.ranked if r.source == "measured"]
    assert all(r.measured_s == r.time_s for r in measured)


# ------------------------------------------------------------------------------------ CLI


def test_cli_default_recommend() -> None:
    result = runner.invoke(app, ["recommend", "--heads", "32", "--kv-heads", "8"])
    assert result.exit_code == 0, result.output
    for text in ("Feasible candidates", "Why:", "--cp-comm-type a2a", "set_seq_parallel_pg"):
        assert text in result.stdout


def test_cli_json() -> None:
    result = runner.invoke(
        app,
        ["recommend", "--heads", "32", "--kv-heads", "8", "--gpus", "16", "--top", "3", "--json"],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert len(doc["candidates"]) == 3 and doc["feasible"] > 3
    assert doc["winner"]["ulysses"] == 8 and doc["winner"]["ring"] == 2
    assert doc["winner"]["bytes_per_tier"]["inter_node"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kv-heads", "6"], "heads (32) must be a multiple of kv_heads (6)"),
        (["--kv-heads", "8", "--hardware", "nosuch"], "hardware 'nosuch' is neither a built-in"),
        (["--kv-heads", "8", "--tp", "3"], "gpus (8) must be divisible by TP x PP = 3 x 1 = 3"),
        (["--kv-heads", "8", "--gpus", "12"], "gpus (12) must be a multiple of gpus per node (8)"),
        (["--kv-heads", "8", "--dtype", "int8"], "dtype 'int8' is not supported"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["recommend", "--heads", "32", *args])
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.output + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
