"""`cpbench recommend`: the default answer, rejections, parallel sizes, framework settings."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import random
from pathlib import Path
from typing import get_args

import pytest
from pydantic import ValidationError
from rich.console import Console
from typer.testing import CliRunner

from cpbench.app.recommend import (
    FrameworkSetting,
    RankedCandidate,
    Recommendation,
    RecommendRequest,
    Uncertainty,
    cp_comm_type,
    framework_settings,
    recommend_mesh,
    recommendation_report,
    solve_parallel_sizes,
    write_tie_scenario,
)
from cpbench.app.recommend.frameworks import (
    FrameworkTable,
    framework_table,
    torchtitan_setting,
    yunchang_setting,
)
from cpbench.app.recommend.types import CaveatKind
from cpbench.app.recommend.uncertainty import (
    call_ties,
    faster_probability,
    profile_uncertainty,
    with_intervals,
)
from cpbench.cli.main import app
from cpbench.config.constraints import AttentionShape
from cpbench.config.problem import MeshCandidate
from cpbench.config.vocabulary import LAYOUTS, YUNCHANG_RING_IMPL_TYPES
from cpbench.errors import CpbenchError
from cpbench.model.calibrate.error_split import ErrorSplit, split_residuals
from cpbench.model.hardware.file_schema import profile_document, profile_from_dict, save_profile
from cpbench.model.hardware.loading import load_profile
from cpbench.model.hardware.profile import CalibrationInfo, HardwareProfile
from cpbench.model.ties import PRIOR_RELATIVE_ERROR, TIE_RULE, ratio_tied
from cpbench.render.recommend.explanation import explanation_text
from cpbench.render.recommend.frameworks import setting_note
from cpbench.render.recommend.screen import render_recommendation
from cpbench.results.scenarios.loading import load_scenario
from tests.golden import assert_same_document
from tests.synthetic import synthetic_record

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

runner = CliRunner()


def why(rec: Recommendation) -> str:
    """The full explanation of a recommendation, in words (`recommend --explain`)."""
    return explanation_text(rec.explanation)


def note(setting: FrameworkSetting) -> str:
    """A framework setting's caveats, in words."""
    return setting_note(setting)


def total_sigma(split: ErrorSplit) -> float:
    """Sigma of one step time's log error: sqrt(common^2 + candidate^2)."""
    return math.hypot(split.common_sigma, split.candidate_sigma)


@pytest.fixture(scope="module")
def default():
    return recommend_mesh(RecommendRequest(heads=32, kv_heads=8))


def test_default_answer_is_feasible_and_ranked(default) -> None:
    assert default.request.seq_len == 131072 and default.profile.name == "h100-sxm"
    assert default.sizes.cp == 8 and default.gpus_per_node == 8
    # by time to 4 significant digits (rank_key: within that, p2p before all-gather)
    times = [float(f"{r.time_s:.4g}") for r in default.ranked]
    assert times == sorted(times) and len(times) >= 4
    assert all(r.prediction.fits for r in default.ranked)
    assert {(r.prediction.candidate.ulysses, r.prediction.candidate.ring) for r in default.ranked} == {
        (1, 8),
        (2, 4),
        (4, 2),
        (8, 1),
    }
    winner = default.winner
    assert winner is not None
    # one node of NVLink: all-to-all is cheap and the kernel sees the whole sequence; it ties
    # the 4x2 and 1x8 rings (ratio within e^16%) and is the likeliest fastest of them
    assert (winner.prediction.candidate.ulysses, winner.prediction.candidate.ring) == (8, 1)
    assert winner is min(default.ranked, key=lambda r: r.time_s)
    assert default.tie is not None and default.tie.decided_by == "likeliest"
    assert "8x1" in why(default) and "ahead of the next mesh" in why(default)
    assert "8x1 any is faster than 4x2 zigzag with probability 0.52" in default.tie.decision
    assert default.explanation is not None and default.explanation.margin is not None
    assert default.rejected == ()


def test_contiguous_ranks_below_zigzag_for_causal(default) -> None:
    order = [(r.prediction.candidate.ring, r.prediction.candidate.layout) for r in default.ranked]
    assert order.index((8, "zigzag")) < order.index((8, "contiguous"))


def test_rejections_carry_the_rule() -> None:
    rec = recommend_mesh(RecommendRequest(heads=32, kv_heads=8, gpus=64))
    rules = {(r.ulysses, r.ring): r.rule for r in rec.rejected}
    assert "ulysses (64) must divide heads (32)" in rules[(64, 1)]
    memory = recommend_mesh(RecommendRequest(heads=32, kv_heads=8, seq_len=1 << 24))
    assert memory.winner is None and memory.rejected
    assert all(r.kind == "memory" for r in memory.rejected)
    assert "GiB per rank > 79.6 GiB of device memory (h100-sxm)" in memory.rejected[0].rule
    assert memory.explanation is None
    assert "No candidate is feasible" in explanation_text(None, len(memory.rejected))


def test_kv_replication_is_automatic() -> None:
    rec = recommend_mesh(RecommendRequest(heads=32, kv_heads=4, gpus=8))
    ulysses_8 = next(r for r in rec.ranked if r.prediction.candidate.ulysses == 8)
    assert ulysses_8.prediction.candidate.replication == 2


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
    rec = recommend_mesh(RecommendRequest(heads=32, kv_heads=8, tp=2, cp=2))
    assert rec.sizes.dp == 2 and rec.shape.heads == 16 and rec.shape.kv_heads == 4
    report = recommendation_report(rec)
    assert report["parallel"]["dp"] == 2
    megatron = report["frameworks"][0]["settings"]
    assert "--tensor-model-parallel-size 2" in megatron and "--context-parallel-size 2" in megatron
    with pytest.raises(
        CpbenchError, match=r"TP \(16\) must divide heads \(32\) and kv_heads \(8\)"
    ):
        recommend_mesh(RecommendRequest(heads=32, kv_heads=8, gpus=16, tp=16))


def test_framework_settings_for_a2a_p2p() -> None:
    rec = recommend_mesh(RecommendRequest(heads=32, kv_heads=8, gpus=16))
    fastest = min(rec.ranked, key=lambda r: r.time_s)
    config = fastest.prediction.candidate
    assert (config.ulysses, config.ring) == (8, 2)  # Ulysses inside each node, ring across
    # the 1x16 ring ties it (the ratio's interval contains 1) and holds a longer sequence:
    # the tie-break picks the ring; the settings of the fastest are those of a2a+p2p
    assert rec.tie is not None and fastest in rec.tie.tied and rec.tie.decided_by != "clear"
    assert rec.winner is rec.tie.tied[0]
    order = [fastest] + [r for r in rec.ranked if r is not fastest]
    settings = {f.framework: f for f in framework_settings(order, rec.sizes)}
    megatron = settings["Megatron-LM"]
    assert "--context-parallel-size 16" in megatron.settings
    assert "--cp-comm-type a2a+p2p" in megatron.settings
    assert "--hierarchical-context-parallel-sizes 8 2" in megatron.settings
    assert "set_seq_parallel_pg(8, 2, rank, world_size=16)" in settings["yunchang"].settings
    assert 'ring_impl_type="zigzag"' in settings["yunchang"].settings
    assert not settings["DeepSpeed"].expressible
    assert "cannot express a ring (R = 2)" in note(settings["DeepSpeed"])
    assert not settings["torchtitan"].expressible
    assert "ring-only with head-tail load balancing" in note(settings["torchtitan"])
    assert "context_parallel_degree 16" in settings["torchtitan"].settings


def test_deepspeed_has_no_setting_for_a_ring_winner() -> None:
    # 16 GPUs, 32/8 heads, the 1x16 ring as the winner (it ties the pick): DeepSpeed's sequence
    # parallelism is Ulysses only, so its cell is "-" and the caveats name the closest
    # Ulysses-only mesh (16x1) with its own flag and its GQA replication (8 KV heads < 16)
    rec = recommend_mesh(RecommendRequest(heads=32, kv_heads=8, gpus=16))
    ring = _by_label(rec, "1x16 zigzag")
    ranked = [ring, *(r for r in rec.ranked if r is not ring)]
    settings = {f.framework: f for f in framework_settings(ranked, rec.sizes)}
    deepspeed = settings["DeepSpeed"]
    assert not deepspeed.expressible and deepspeed.settings == "-"
    text = note(deepspeed)
    assert "cannot express a ring (R = 16)" in text and "no DeepSpeed setting runs this" in text
    assert "closest: Ulysses 16x1" in text and "--ds-sequence-parallel-size 16" in text
    assert "KV heads (8) < sequence-parallel size (16)" in text
    assert "--context-parallel-size 16" in settings["Megatron-LM"].settings


def test_cp_comm_type() -> None:
    assert cp_comm_type(1, 8) == "p2p"
    assert cp_comm_type(8, 1) == "a2a"
    assert cp_comm_type(4, 2) == "a2a+p2p"


def test_measured_configurations_rank_by_measurement(tmp_path: Path) -> None:
    profile = load_profile("cpu-local")
    rng = random.Random(0)
    shape = AttentionShape(2048, 8, 4, 64)
    records = [
        synthetic_record(MeshCandidate.for_shape(shape=shape, ulysses=u, ring=r, layout=layout, dtype="float32"), profile, 4, 0.02, rng)
        for u, r in ((1, 4), (2, 2), (4, 1))
        for layout in ("contiguous", "zigzag")
    ]
    path = tmp_path / "cpu.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    rec = recommend_mesh(
        RecommendRequest(
            heads=8, kv_heads=4, seq_len=2048, head_dim=64, gpus=4, dtype="fp32",
            results=(str(path),), top=0,
        )
    )  # fmt: skip
    assert rec.profile.name == "cpu-local-calibrated" and rec.calibration is not None
    sources = {
        (r.prediction.candidate.ulysses, r.prediction.candidate.layout): r.source for r in rec.ranked
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
    # the fastest prediction (8x2) ties the pick; the pick's ring crosses the nodes
    assert min(doc["candidates"], key=lambda c: c["time_s"])["label"] == "8x2 zigzag"
    assert doc["winner"]["label"] == doc["tie"]["pick"] and doc["tie"]["decided_by"] != "clear"
    assert doc["winner"]["bytes_per_tier"]["inter_node"] > 0


GOLDEN = Path(__file__).parent / "fixtures" / "recommend_json.jsonl"
"""`cpbench recommend ARGS --json` of eleven problems, captured before the report became typed
(`{"args": [...], "json": {...}}` a line): defaults, two nodes, TP, a documents file, a window,
all-gather only, calibrated on results (one with measured candidates), --explain, nothing
feasible."""


@pytest.mark.parametrize(
    "case",
    [json.loads(line) for line in GOLDEN.read_text(encoding="utf-8").splitlines()],
    ids=lambda case: " ".join(case["args"][4:]) or "defaults",
)
def test_json_is_the_captured_shape_plus_its_version(
    case: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(Path(__file__).parent.parent)  # the paths of the args are the checkout's
    result = runner.invoke(app, ["recommend", *case["args"], "--json"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith('{\n "schema_version": 1,\n')  # the first key
    document = json.loads(result.stdout)
    assert document.pop("schema_version") == 1
    assert_same_document(document, case["json"])


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


# ------------------------------------------------------------------- uncertainty and ties


def _probe_like(profile: HardwareProfile, residuals: tuple[float, float]) -> HardwareProfile:
    """The profile with its intra-node links stated as fitted by a probe."""
    tier = profile.intra_node
    stated = [
        dataclasses.replace(
            cost,
            source=f"measured by cpbench probe test: {kind} over 8 sizes, least-squares "
            "latency + bytes / busbw",
            fit_residual=res,
        )
        for cost, kind, res in (
            (tier.all_to_all, "all_to_all", residuals[0]),
            (tier.send_recv, "send_recv", residuals[1]),
        )
    ]
    intra = dataclasses.replace(tier, all_to_all=stated[0], send_recv=stated[1])
    links = dataclasses.replace(profile.links, intra_node=intra)
    return dataclasses.replace(profile, links=links, topology=None)


def test_probe_residual_is_a_number_and_old_profiles_state_it_in_prose() -> None:
    probe = _probe_like(load_profile("h100-sxm"), (0.198, 0.377))
    document = profile_document(probe)
    assert document["links"]["intra_node"]["send_recv"]["fit_residual"] == pytest.approx(0.377)
    assert profile_uncertainty(profile_from_dict(document), None).sigma == pytest.approx(0.377)
    for kind, res in (("all_to_all", 19.8), ("send_recv", 37.7)):  # a profile of before the field
        cost = document["links"]["intra_node"][kind]
        del cost["fit_residual"]
        cost["source"] += f" (RMS residual {res}%)"
    old = profile_from_dict(document)
    assert old.intra_node.send_recv.fit_residual == pytest.approx(0.377)
    assert profile_uncertainty(old, None).kind == "probe"


def test_sigma_of_each_source(tmp_path: Path) -> None:
    h100 = load_profile("h100-sxm")
    prior = profile_uncertainty(h100, None)
    assert prior.kind == "prior" and prior.sigma == pytest.approx(PRIOR_RELATIVE_ERROR, abs=1e-12)
    probe = profile_uncertainty(_probe_like(h100, (0.198, 0.377)), None)
    assert probe.kind == "probe" and probe.sigma == pytest.approx(0.377, abs=1e-9)
    assert "37.7%" in probe.source and "2 link fit" in probe.source
    exact = profile_uncertainty(_probe_like(h100, (0.001, 0.002)), None)
    assert exact.sigma == pytest.approx(0.05, abs=1e-12)  # the floor
    calibrated = dataclasses.replace(h100, calibration=CalibrationInfo("h100-sxm", 27, 0.08))
    cal = profile_uncertainty(calibrated, None)
    # residual 8% inflated by sqrt(27 / 25) for the fitted parameters
    assert cal.kind == "calibration"
    assert cal.sigma == pytest.approx(0.08 * (27 / 25) ** 0.5, rel=1e-9)
    # a probe profile saved and loaded keeps its stated error; recommend prints it
    path = save_profile(_probe_like(h100, (0.1, 0.2)), tmp_path / "probe.toml")
    rec = recommend_mesh(RecommendRequest(heads=32, kv_heads=8, hardware=str(path)))
    assert rec.uncertainty is not None and rec.uncertainty.kind == "probe"
    assert rec.uncertainty.sigma == pytest.approx(0.2, abs=1e-9)
    for r in rec.ranked:
        assert r.interval is not None
        assert r.low_s == pytest.approx(r.time_s * math.exp(-0.2), rel=1e-9)
        assert r.high_s == pytest.approx(r.time_s * math.exp(0.2), rel=1e-9)


def test_uncalibrated_prior_says_so_and_ties(default) -> None:
    report = recommendation_report(default)
    assert report["uncertainty"]["kind"] == "prior"
    tie = default.tie
    assert tie is not None and not tie.clear and len(tie.tied) >= 2
    u = default.uncertainty
    assert u is not None and u.split is not None
    # the prior split: total 35%, per-candidate from the published ratio error 0.11 / 0.6745
    assert total_sigma(u.split) == pytest.approx(PRIOR_RELATIVE_ERROR, rel=1e-9)
    assert u.split.ratio_sigma == pytest.approx(0.11 / 0.6745, rel=1e-3)
    # every tied prediction's ratio to the leader is within e^ratio_sigma, every other beyond
    best = min(r.time_s for r in default.ranked)
    for r in default.ranked:
        within = math.log(r.time_s / best) <= u.split.ratio_sigma
        assert (r in tie.tied) == within, r.label
    assert f"the top {len(tie.tied)} tie within x1.18 of the leader" in tie.message
    assert "cpbench sweep" in tie.message
    first = report["candidates"][0]
    assert first["interval"]["sigma"] == pytest.approx(0.35)
    assert first["interval"]["low_s"] < first["time_s"] < first["interval"]["high_s"]
    text = "\n".join(_plain(x) for x in render_recommendation(default))
    assert "uncalibrated prior" in text and "cpbench probe" in text
    assert "±35%" in text


def test_small_sigma_names_a_clear_winner(default) -> None:
    sharp = Uncertainty("calibration", 0.001, "test: 0.1%")
    ranked, tie = call_ties(with_intervals(default.ranked, sharp, []), sharp, [])
    assert tie is not None and tie.clear
    assert tie.tied[0].label == "8x1 any" and tie.runner_up is not None
    assert "is the clear winner" in tie.message and "beyond ±0%" in tie.message
    assert tie.decided_by == "clear" and tie.decision == ""
    assert ranked[0].time_s * math.exp(0.001) < tie.runner_up.time_s


def _plain(renderable: object) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def _measured(tmp_path: Path, spread: dict[tuple[int, int], float]) -> Path:
    """Records of three no-mask meshes (one layout each) whose 95% intervals are the median
    x (1 -+ spread)."""
    profile = load_profile("cpu-local")
    shape = AttentionShape(2048, 8, 4, 64)
    records = []
    for (u, r), s in spread.items():
        record = synthetic_record(
            MeshCandidate.for_shape(shape=shape, ulysses=u, ring=r, layout="contiguous", dtype="float32", causal=False), profile, 4
        )
        median = record["timing"]["median"]
        record["timing"].update(ci_low=median * (1 - s), ci_high=median * (1 + s), iterations=30)
        records.append(record)
    path = tmp_path / "measured.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _measured_request(path: Path) -> RecommendRequest:
    return RecommendRequest(
        heads=8, kv_heads=4, seq_len=2048, head_dim=64, gpus=4, dtype="fp32", causal=False,
        results=(str(path),), top=0, cp_comms=("p2p",),
    )  # fmt: skip


def test_measured_ties_use_the_measured_intervals(tmp_path: Path) -> None:
    meshes = ((1, 4), (2, 2), (4, 1))
    wide = recommend_mesh(_measured_request(_measured(tmp_path, dict.fromkeys(meshes, 0.9))))
    assert all(r.source == "measured" for r in wide.ranked)
    assert wide.tie is not None and len(wide.tie.tied) == 3  # every interval overlaps
    assert TIE_RULE in wide.tie.rule
    assert "their measured 95% intervals overlap" in wide.tie.message
    narrow = recommend_mesh(_measured_request(_measured(tmp_path, dict.fromkeys(meshes, 1e-4))))
    times = [r.time_s for r in narrow.ranked]
    assert times[1] / times[0] > 1.001  # the synthetic meshes are apart beyond 2 x 0.01%
    assert narrow.tie is not None and narrow.tie.clear
    assert narrow.tie.tied[0] is narrow.ranked[0]
    assert "is the clear winner" in narrow.tie.message
    report = recommendation_report(wide)
    cell = report["candidates"][0]["interval"]
    assert cell["sigma"] is None and cell["plus_minus"] == pytest.approx(0.9, abs=1e-9)
    assert cell["source"].startswith("measured")
    text = "\n".join(_plain(x) for x in render_recommendation(wide))
    assert "confidence intervals overlap" in " ".join(text.split())  # TIE_RULE in the caption


def test_written_scenario_loads_and_measures_exactly_the_tie(default, tmp_path: Path) -> None:
    path = write_tie_scenario(default, tmp_path / "tie.toml")
    scenario = load_scenario(str(path))
    assert scenario.device == "cuda" and scenario.world_size == 8  # h100-sxm is a GPU profile
    points = scenario.distinct("cuda", 8)
    assert default.tie is not None
    assert len(points) == len(default.tie.tied)
    wanted = set()
    for r in default.tie.tied:
        c = r.prediction.candidate
        gather = c.ring > 1 and c.all_gather
        wanted.add(
            (c.ulysses, c.ring, c.layout, "all_gather" if gather else "p2p",
             c.heads_k_stride if gather else None)
        )  # fmt: skip
    got = {
        (p.config.ulysses, p.config.ring, p.config.layout, p.config.cp_comm,
         p.config.heads_k_stride)
        for p in points
    }  # fmt: skip
    assert got == wanted
    assert all(
        (p.config.seq_len, p.config.heads, p.config.kv_heads, p.config.head_dim)
        == (131072, 32, 8, 128)
        for p in points
    )


def test_cli_write_scenario_and_json_intervals(tmp_path: Path) -> None:
    out = tmp_path / "tie.toml"
    result = runner.invoke(
        app,
        ["recommend", "--heads", "32", "--kv-heads", "8", "--top", "3", "--json",
         "--write-scenario", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["scenario_written"] == str(out) and load_scenario(str(out)).name == "recommend-tie"
    for c in doc["candidates"]:
        i = c["interval"]
        assert set(i) >= {"low_s", "high_s", "sigma", "source"}
        assert i["low_s"] == pytest.approx(c["time_s"] * math.exp(-0.35), rel=1e-9)
    assert doc["tie"]["tied"] >= 2 and not doc["tie"]["clear"]
    missing = runner.invoke(
        app, ["recommend", "--heads", "32", "--kv-heads", "8", "--write-scenario",
              str(tmp_path / "nosuch" / "x.toml")],
    )  # fmt: skip
    assert missing.exit_code == 2 and "does not exist" in missing.stderr


# ------------------------------------------------------------ ties of ratios and the one pick


def _at(r: RankedCandidate, seconds: float) -> RankedCandidate:
    """The candidate with its predicted step set to `seconds` (the whole time in the forward;
    the fwd+bwd phase adds the two)."""
    p = r.prediction
    forward = dataclasses.replace(p.forward, total_s=seconds)
    backward = dataclasses.replace(p.backward, total_s=0.0)
    return dataclasses.replace(
        r, prediction=dataclasses.replace(p, forward=forward, backward=backward), interval=None
    )


def _by_label(rec: Recommendation, label: str) -> RankedCandidate:
    return next(r for r in rec.ranked if r.label == label)


def _common_error_split() -> ErrorSplit:
    """Residuals of six problems whose candidates share a common error of +-50% (log) and
    differ among themselves by +-3%."""
    rng = random.Random(7)
    residuals = []
    for group in range(6):
        common = 0.5 if group % 2 else -0.5
        residuals += [(group, common + rng.choice((-0.03, 0.03))) for _ in range(4)]
    return split_residuals(residuals)


def test_error_split_from_residuals_separates_common_and_candidate_parts() -> None:
    split = _common_error_split()
    # within-problem spread: 0.03 each side (sample variance over 18 degrees of freedom)
    assert 0.02 <= split.candidate_sigma <= 0.045
    assert split.common_sigma == pytest.approx(0.5, abs=0.02)
    assert split.points == 24 and split.groups == 6
    # one residual per problem says nothing about the split: the stated prior share
    alone = split_residuals([(g, 0.2) for g in range(5)])
    assert alone.groups == 0 and "prior split" in alone.source
    assert total_sigma(alone) == pytest.approx(0.2, rel=1e-9)


def test_a_large_common_error_does_not_tie_a_20_percent_difference(default) -> None:
    split = _common_error_split()
    fast, slow = _at(_by_label(default, "8x1 any"), 1.0), _at(_by_label(default, "2x4 zigzag"), 1.2)
    # each time alone is uncertain to ~50%: the old test (ratio within e^total sigma) ties them
    assert math.log(1.2) <= total_sigma(split)
    assert not ratio_tied(1.0, 1.2, split.ratio_sigma)
    u = Uncertainty("calibration", total_sigma(split), "test: common 50%", split)
    ranked, tie = call_ties(with_intervals([fast, slow], u, []), u, [])
    assert tie is not None and tie.clear and tie.decided_by == "clear"
    assert ranked[0].label == "8x1 any" and tie.runner_up is not None
    assert "is the clear winner: 20% ahead" in tie.message and "ratio's ±" in tie.message


def test_a_tie_of_ratios_names_one_pick_and_the_rule_that_decided(default) -> None:
    split = _common_error_split()
    u = Uncertainty("calibration", total_sigma(split), "test", split)
    # 1x8 holds 7.9M tokens and 8x1 9.8M: asked for 7.5M, 1x8's memory binds (within 10%)
    near_full = recommend_mesh(RecommendRequest(heads=32, kv_heads=8, seq_len=7_500_000))
    cases = [
        # memory binds for the faster one: the one with headroom
        (near_full, ("1x8 zigzag", 1.00), ("8x1 any", 1.02), "8x1 any", "memory"),
        # at 131K nothing binds: the likeliest fastest, though 8x1 holds more
        (default, ("1x8 zigzag", 1.00), ("8x1 any", 1.02), "1x8 zigzag", "likeliest"),
        (default, ("4x2 zigzag", 1.00), ("2x4 zigzag", 1.02), "4x2 zigzag", "likeliest"),
        # two meshes priced equal: one CP axis is the simpler setting
        (default, ("4x2 zigzag", 1.00), ("8x1 any", 1.0005), "8x1 any", "simpler_setting"),
    ]
    for rec, (a, ta), (b, tb), pick, rule in cases:
        pair = [_at(_by_label(rec, a), ta), _at(_by_label(rec, b), tb)]
        pair.sort(key=lambda r: r.time_s)
        assert ratio_tied(pair[0].time_s, pair[1].time_s, split.ratio_sigma)
        ranked, tie = call_ties(with_intervals(pair, u, []), u, [])
        assert tie is not None and len(tie.tied) == 2 and not tie.clear
        assert tie.decided_by == rule, (a, b, tie.decision)
        assert ranked[0].label == pick and tie.tied[0] is ranked[0]
        assert f"pick {pick}: " in tie.message and tie.decision in tie.message
        if rule == "likeliest":
            # P(faster) of a 2% lead under the ratio's sigma: Phi(ln 1.02 / sigma_ratio)
            p = 0.5 * math.erfc(-math.log(1.02) / (split.ratio_sigma * math.sqrt(2)))
            assert f"with probability {p:.2f}" in tie.decision, tie.decision


def test_the_16_gpu_example_picks_the_likelier_mesh_and_says_how_likely() -> None:
    """Issue 40: 1x16 (109 ms) was picked over 8x2 (97.8 ms) by a tie-break while neither's
    memory binds; the likelier-faster 8x2 is the pick, and the probability is printed."""
    rec = recommend_mesh(RecommendRequest(heads=32, kv_heads=8, gpus=16, gpus_per_node=8))
    winner = rec.winner.prediction.candidate
    assert (winner.ulysses, winner.ring) == (8, 2)
    assert rec.tie is not None and rec.tie.decided_by == "likeliest"
    assert "with probability" in rec.tie.decision and "with probability" in rec.tie.message
    sigma = rec.uncertainty.split.ratio_sigma
    ring = _by_label(rec, "1x16 zigzag")
    p = faster_probability(rec.winner.time_s, ring.time_s, sigma)
    assert p == pytest.approx(0.75, abs=0.02)  # the number, from the model's sigma


def test_cli_names_one_pick_with_its_tie_break(default) -> None:
    result = runner.invoke(app, ["recommend", "--heads", "32", "--kv-heads", "8", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    tie = doc["tie"]
    assert tie["pick"] == doc["winner"]["label"] == doc["candidates"][0]["label"]
    assert tie["decided_by"] in ("memory", "likeliest", "simpler_setting")
    assert tie["decision"] and tie["decision"] in tie["message"]
    assert "interval of their ratio contains 1" in tie["rule"]
    u = doc["uncertainty"]
    assert u["ratio_sigma"] == pytest.approx(2**0.5 * u["candidate_sigma"], rel=1e-9)
    assert u["common_sigma"] ** 2 + u["candidate_sigma"] ** 2 == pytest.approx(
        u["sigma"] ** 2, rel=1e-9
    )


def test_calibrated_split_comes_from_the_within_problem_residuals(tmp_path: Path) -> None:
    measured = _measured(tmp_path, dict.fromkeys(((1, 4), (2, 2), (4, 1)), 0.01))
    rec = recommend_mesh(_measured_request(measured))
    u = rec.uncertainty
    assert u is not None and u.kind == "calibration" and u.split is not None
    assert u.split.points == 3 and u.split.groups == 1  # three meshes of one problem
    assert u.split.candidate_sigma <= u.sigma + 1e-12
    assert total_sigma(u.split) == pytest.approx(u.sigma, rel=1e-9)


def test_yunchang_gets_its_closest_ring_impl_for_doc_zigzag(tmp_path: Path) -> None:
    # issue 39: a doc_zigzag (or balanced) pick raised KeyError in yunchang_setting (issue's
    # repro: 9,430 x 42 + 570 x 41 tokens, L = 419,430; this one is 100 times smaller, as
    # L = 2 x odd it also leaves only doc_zigzag on a ring); yunchang has no ring_impl_type
    # for it: the setting is its closest (zigzag), labelled as such
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("42\n" * 94 + "41\n" * 6)
    rec = recommend_mesh(RecommendRequest(heads=128, kv_heads=1, seq_len=4194, gpus=8,
                                     documents=str(lengths)))  # fmt: skip
    assert rec.winner is not None
    winner = rec.winner.prediction.candidate
    assert winner.ring > 1 and winner.layout == "doc_zigzag"
    yunchang = next(f for f in rec.frameworks if f.framework == "yunchang")
    assert not yunchang.expressible and 'ring_impl_type="zigzag"' in yunchang.settings
    closest = next(c for c in yunchang.caveats if c.kind == "closest_layout")
    assert closest.name == "doc_zigzag" and closest.candidate == f"{winner.ulysses}x{winner.ring} zigzag"
    assert "no ring_impl_type for the doc_zigzag layout" in note(yunchang)
    text = " ".join(
        "\n".join(_plain(x) for x in render_recommendation(rec)).split()
    )
    assert f"closest: {winner.ulysses}x{winner.ring} zigzag (no doc_zigzag layout):" in text
    for layout in LAYOUTS:  # every layout has a setting (its own, or its closest)
        c = dataclasses.replace(winner, layout=layout)
        p = dataclasses.replace(rec.winner.prediction, candidate=c)
        setting = yunchang_setting(p, rec.sizes)
        assert setting.expressible == (layout in YUNCHANG_RING_IMPL_TYPES), layout
        assert "ring_impl_type=" in setting.settings


def test_the_framework_table_is_validated() -> None:
    table = framework_table()
    assert table is framework_table()  # loaded once
    # yunchang's names in the table are the ones cpbench's own yunchang adapter runs
    assert table.training.yunchang.ring_impl_types == YUNCHANG_RING_IMPL_TYPES
    assert set(table.caveats) == set(get_args(CaveatKind))
    data = table.model_dump()
    del data["caveats"]["window"]
    with pytest.raises(ValidationError, match="caveats without words: window"):
        FrameworkTable.model_validate(data)
    data = table.model_dump()
    del data["training"]["yunchang"]["closest_layouts"]["balanced"]
    with pytest.raises(ValidationError, match="ring_impl_type or a closest layout"):
        FrameworkTable.model_validate(data)
    data = table.model_dump()
    data["training"]["torchtitan"]["ulysses_level"] = True
    with pytest.raises(ValidationError, match="ulysses_level"):
        FrameworkTable.model_validate(data)
    # what a framework can express is data the settings follow
    expressive = table.training.torchtitan.model_copy(update={"ulysses": True})
    rec = recommend_mesh(RecommendRequest(heads=32, kv_heads=8))
    assert rec.winner is not None and rec.winner.prediction.candidate.ulysses == 8
    from unittest import mock  # noqa: PLC0415

    training = table.training.model_copy(update={"torchtitan": expressive})
    with mock.patch("cpbench.app.recommend.frameworks.framework_table",
                    return_value=table.model_copy(update={"training": training})):  # fmt: skip
        titan = torchtitan_setting(rec.winner.prediction, rec.ranked)
    assert titan.expressible
    assert not torchtitan_setting(rec.winner.prediction, rec.ranked).expressible


def test_a_layout_too_costly_to_count_is_rejected_with_the_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # issue 39: with packed documents, doc_zigzag, striped and balanced cut each document into
    # up to 2R parts, and counting their schedules exactly grows as documents x R^2 (minutes and
    # 37 GB at 1,024 GPUs); a ranking skips those over its budget, saying so, and answers with
    # the rest. Here a budget of 50,000 part pairs stands for the real 30 million: doc_zigzag
    # at R = 16 pairs 64 x 2 x 32^2 (documents and their padding), at R = 8 a quarter of it.
    from cpbench.config import block_counts  # noqa: PLC0415 (the budget this test lowers)

    monkeypatch.setattr(block_counts, "RANKING_PART_PAIRS", 50_000)
    lengths = ",".join(str(n) for n in range(200, 264))  # 64 documents, 14,816 tokens
    rec = recommend_mesh(RecommendRequest(heads=16, kv_heads=16, seq_len=14_816, gpus=16,
                                          documents=lengths))  # fmt: skip
    skipped = [r for r in rec.rejected if r.rule.startswith("not priced")]
    assert {r.ring for r in skipped} == {16}, skipped
    assert "doc_zigzag" in skipped[0].layouts
    assert "over 50,000 part pairs" in skipped[0].rule
    ranked = {(r.prediction.candidate.ring, r.prediction.candidate.layout) for r in rec.ranked}
    assert (16, "contiguous") in ranked and (16, "doc_zigzag") not in ranked
    assert (8, "doc_zigzag") in ranked
