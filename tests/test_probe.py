"""`cpbench probe`: the plan follows the formulas, the fit recovers known lines, the written
profile loads and `recommend` accepts it, a real probe on 2 gloo ranks, bad input exits 2."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cpbench.app.probe.fit import KernelMeasurement, attribution, fit_links
from cpbench.app.probe.plan import (
    CommTest,
    KernelTest,
    ProbeSettings,
    check_settings,
    default_settings,
    make_plan,
)
from cpbench.app.probe.profile import measured_profile
from cpbench.app.probe.run import probe_report
from cpbench.cli.main import app
from cpbench.errors import CpbenchError
from cpbench.model.hardware.file_schema import profile_to_toml, save_profile
from cpbench.model.hardware.loading import load_profile
from cpbench.units import GB
from tests import rank_tasks
from tests.golden import assert_same_document
from tests.synthetic import synthetic_probe_result

runner = CliRunner()
CPU = load_profile("cpu-local")


def _settings(**kw: object) -> ProbeSettings:
    return replace(default_settings("cpu", 4), **kw)  # type: ignore[arg-type]


def test_plan_sizes_are_the_configurations_messages() -> None:
    """2x2 at L=4096, 8 heads, d 64, fp32: a2a_q hands in S*h*d*4 = 1024*8*64*4 bytes, a ring
    hop of K/V is 2*(L/R)*(h_kv/U)*d*4 = 2*2048*4*64*4; every mesh of 4 is probed."""
    plan = make_plan(_settings(seq_lens=(4096,)), CPU)
    assert plan.meshes == ((1, 4), (2, 2), (4, 1))
    sizes = {(t.kind, t.mesh, t.size_bytes) for t in plan.comm_tests}
    assert ("all_to_all", "2x2", 1024 * 8 * 64 * 4) in sizes
    assert ("all_to_all", "2x2", 2 * 1024 * 8 * 64 * 4) in sizes  # a2a_kv: K and V packed
    assert ("send_recv", "2x2", 2 * 2048 * 4 * 64 * 4) in sizes
    assert ("send_recv", "1x4", 2 * 1024 * 8 * 64 * 4) in sizes
    assert not any(t.kind == "all_to_all" and t.ulysses == 1 for t in plan.comm_tests)
    assert not any(t.kind == "send_recv" and t.ring == 1 for t in plan.comm_tests)
    smalls = [t for t in plan.comm_tests if t.origin == "small (latency)"]
    assert len(smalls) == 2 * 4  # two sizes on each of the four group shapes
    kernels = {(k.seq_len, k.heads) for k in plan.kernel_tests}
    assert kernels == {(1024, 8), (2048, 4), (4096, 2)}  # L/R with h/U heads per rank
    assert plan.kernel_ranks == 2  # cpu-local's compute slots


def test_bytes_sent_follows_the_counting_convention() -> None:
    a2a = CommTest("all_to_all", 4, 1, 4096, "x")
    hop = CommTest("send_recv", 1, 4, 4096, "x")
    assert a2a.bytes_sent == pytest.approx(4096 * 3 / 4, rel=1e-12)
    assert hop.bytes_sent == 4096


def test_fit_recovers_a_known_line() -> None:
    """Times made from latency 120 us and busbw 2 GB/s (all-to-all) / 50 us and 3 GB/s
    (send/recv) come back within 1%."""
    plan = make_plan(_settings(), CPU)
    timed = []
    for t in plan.comm_tests:
        latency, busbw = (120e-6, 2 * GB) if t.kind == "all_to_all" else (50e-6, 3 * GB)
        timed.append((t, latency + t.bytes_sent / busbw))
    fits = {f.kind: f for f in fit_links(CPU, timed)}
    assert fits["all_to_all"].latency_s == pytest.approx(120e-6, rel=0.01)
    assert fits["all_to_all"].busbw == pytest.approx(2 * GB, rel=0.01)
    assert fits["send_recv"].latency_s == pytest.approx(50e-6, rel=0.01)
    assert fits["send_recv"].busbw == pytest.approx(3 * GB, rel=0.01)
    assert fits["all_to_all"].residual < 0.01
    assert fits["all_to_all"].tier == "numa_node"


def test_attribution_on_a_two_switch_node() -> None:
    """On the 2 x 4 PCIe profile a Ulysses group of 8 crosses the socket tier, one of 4 stays
    under its switch; the fit replaces only the tiers that were measured."""
    prior = load_profile("l40s-pcie-2x4")
    assert attribution(prior, CommTest("all_to_all", 8, 1, 1 << 20, "x"))[1] == "socket"
    assert attribution(prior, CommTest("all_to_all", 4, 2, 1 << 20, "x"))[1] == "pcie_switch"
    tests = [CommTest("all_to_all", 4, 2, s, "x") for s in (4096, 1 << 20, 1 << 24)]
    fits = fit_links(prior, [(t, 10e-6 + t.bytes_sent / (5 * GB)) for t in tests])
    assert [(f.tier, f.kind) for f in fits] == [("pcie_switch", "all_to_all")]
    profile, _ = measured_profile(prior, fits, [], "flash_attn", "bfloat16", "fwd", "now, here")
    assert profile.topology is not None
    switch, socket = profile.topology.tiers
    assert "measured by cpbench probe now, here" in switch.all_to_all.source
    assert socket.all_to_all == prior.topology.tiers[1].all_to_all  # type: ignore[union-attr]


def _kernel(n: int, heads: int, seconds: float) -> KernelMeasurement:
    shape = KernelTest(n, heads, heads, 64, 1, (f"L={n}",))
    flops = shape.flops("fwd+bwd")
    return KernelMeasurement(
        shape, seconds, 3, flops, flops / (CPU.peak_flops("float32") * seconds)
    )


def test_measured_profile_loads_back(tmp_path: Path) -> None:
    """The written profile loads, has a one-island topology with the fitted links, the kernel
    curve at the measured lengths (FLOP-weighted over shapes of one length) and probe sources."""
    plan = make_plan(_settings(), CPU)
    timed = [(t, 1e-3 + t.bytes_sent / (0.5 * GB)) for t in plan.comm_tests]
    fits = fit_links(CPU, timed)
    kernels = [_kernel(1024, 8, 0.2), _kernel(2048, 4, 0.3), _kernel(2048, 8, 0.6)]
    profile, notes = measured_profile(
        CPU, fits, kernels, "cpu_sdpa", "float32", "fwd+bwd", "2030-01-01, test"
    )
    path = save_profile(profile, tmp_path / "p.toml")
    loaded = load_profile(str(path))
    assert loaded.intra_node.all_to_all.busbw == pytest.approx(0.5 * GB, rel=0.01)
    assert loaded.intra_node.send_recv.latency_s == pytest.approx(1e-3, rel=0.01)
    assert loaded.topology is not None and len(loaded.topology.tiers) == 1
    assert loaded.topology.tiers[0].island == CPU.devices_per_node
    assert "measured by cpbench probe 2030-01-01, test" in loaded.intra_node.all_to_all.source
    curve = loaded.curve("cpu_sdpa")
    assert curve.seq_lens == (1024, 2048)
    expected = (kernels[1].flops + kernels[2].flops) / (CPU.peak_flops("float32") * (0.3 + 0.6))
    assert curve.at(2048) == pytest.approx(expected, rel=1e-4)
    assert "measured by cpbench probe" in curve.source
    assert loaded.peak_tflops == CPU.peak_tflops  # the prior's peak stays
    assert not notes
    assert "cpu-local-probe" in profile_to_toml(profile)


def test_efficiency_above_peak_is_clipped() -> None:
    fast = _kernel(1024, 8, 1e-3)  # far above 0.078 TFLOP/s
    profile, notes = measured_profile(CPU, [], [fast], "cpu_sdpa", "float32", "fwd+bwd", "t")
    assert profile.curve("cpu_sdpa").values == (1.0,)
    assert notes and "exceeds the prior's peak" in notes[0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"world_size": 1}, "world size must be at least 2"),
        ({"budget_s": 0.0}, "budget must be a positive number"),
        ({"heads": 6, "kv_heads": 4}, "heads (6) must be a multiple of kv heads (4)"),
        ({"seq_lens": ()}, "sequence lengths must be positive"),
    ],
)
def test_bad_settings_name_the_rule(change: dict, message: str) -> None:
    with pytest.raises(CpbenchError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_settings(_settings(**change))


def test_no_feasible_mesh_is_an_error() -> None:
    with pytest.raises(CpbenchError, match="no U x R mesh of world size 4 accepts"):
        make_plan(_settings(seq_lens=(6,)), CPU)


def test_world_beyond_the_node_is_an_error() -> None:
    with pytest.raises(CpbenchError, match=r"world size \(16\) > devices per node"):
        make_plan(replace(default_settings("cuda", 16), dtype="bfloat16"), load_profile("h100-sxm"))


@pytest.mark.parametrize(
    "args",
    [
        ["--world-size", "1"],
        ["--budget", "-1"],
        ["--heads", "6", "--kv-heads", "4"],
        ["--hardware", "no-such-profile"],
    ],
)
def test_cli_bad_input_exits_2(args: list[str]) -> None:
    result = runner.invoke(app, ["probe", "--device", "cpu", *args])
    assert result.exit_code == 2, result.output


NCCL_TESTS_BUSBW_FACTOR = {"all_to_all": lambda n: (n - 1) / n, "send_recv": lambda n: 1.0}
"""busbw / algbw per operation, from nccl-tests' doc/PERFORMANCE.md ("Summary": AlltoAll
(n-1)/n) and src/sendrecv.cu (factor 1), where algbw = S / t and S is the operation's send
buffer: count x nranks x type size for an all-to-all, count x type size for a send/recv."""


def test_probe_on_two_gloo_ranks(tmp_path: Path, pool) -> None:  # type: ignore[no-untyped-def]
    """A real probe (2 ranks, one short length, small budget) writes a profile that loads and
    that `recommend --hardware` accepts; its algbw and busbw are nccl-tests' definitions
    applied to the measured time and to the bytes the same plan's collectives hand to
    torch.distributed, counted at that boundary on the session's ranks (tests/rank_tasks.py),
    to 1e-9."""
    out = tmp_path / "probe.toml"
    result = runner.invoke(
        app,
        ["probe", "--world-size", "2", "--device", "cpu", "--seq-len", "1024", "--budget", "3",
         "-o", str(out), "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["meshes"] == ["1x2", "2x1"]
    assert {row["kind"] for row in report["comm"]} == {"all_to_all", "send_recv"}
    settings = replace(default_settings("cpu", 2), seq_lens=(1024,), budget_s=3.0)
    plan = make_plan(settings, load_profile(report["prior"]["name"]))
    assert [(t.kind, t.mesh, t.size_bytes) for t in plan.comm_tests] == [
        (row["kind"], row["mesh"], row["size_bytes"]) for row in report["comm"]
    ]
    counted = pool(2).run(rank_tasks.probe_boundary_bytes, plan, 0.05)
    assert counted[0] == counted[1]  # both ranks hand in the same buffers
    for row, (kind, size, ranks) in zip(report["comm"], counted[0], strict=True):
        assert (kind, ranks) == (row["kind"], row["group_size"]), row
        assert row["time_s"] > 0
        algbw = size / row["time_s"] / 1e9  # GB = 1e9 bytes
        assert row["algbw_GBps"] == pytest.approx(algbw, rel=1e-9), row
        busbw = algbw * NCCL_TESTS_BUSBW_FACTOR[kind](ranks)
        assert row["busbw_GBps"] == pytest.approx(busbw, rel=1e-9), row
    profile = load_profile(str(out))
    assert profile.topology is not None
    assert "measured by cpbench probe" in profile.intra_node.send_recv.source
    assert 0 < profile.curve("cpu_sdpa").values[0] <= 1
    recommended = runner.invoke(
        app,
        ["recommend", "--heads", "8", "--kv-heads", "8", "--gpus", "4", "--seq-len", "8192",
         "--hardware", str(out)],
    )  # fmt: skip
    assert recommended.exit_code == 0, recommended.output


def test_json_is_the_captured_shape_plus_its_version() -> None:
    """The --json of a probe (`tests.synthetic.synthetic_probe_result`) is the document captured
    before the report became typed (tests/fixtures/probe_json.json) with `schema_version` first
    (`tests.golden.assert_same_document`)."""
    report = probe_report(synthetic_probe_result())
    document = report.model_dump(mode="json")
    assert next(iter(document)) == "schema_version"
    assert document.pop("schema_version") == 1
    golden = (Path(__file__).parent / "fixtures" / "probe_json.json").read_text(encoding="utf-8")
    assert_same_document(document, json.loads(golden))
    assert type(report).model_validate(report.model_dump(mode="json")) == report
