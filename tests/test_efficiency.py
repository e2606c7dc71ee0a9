"""`cpbench efficiency` and the ring's overhead removals: the plan's uninitialised-accumulator
rule, the dK/dV accumulation straight into the received buffer, the efficiency arithmetic,
the profile buckets, the 80-column tables, one small real run and one small profile on 2
gloo ranks."""

from __future__ import annotations

import io
import json
import statistics

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from cpbench.app.efficiency.cases import (
    CONVENTION,
    EfficiencyCase,
    EfficiencyReport,
    EfficiencySettings,
    cases_of,
)
from cpbench.app.efficiency.measure import _timing, run_efficiency, with_peers
from cpbench.app.efficiency.profile import bucket_of, profile_steps
from cpbench.attention.layouts import packing
from cpbench.attention.ring import _add_grads, _union_length, ring_plan
from cpbench.cli.main import app
from cpbench.config.masks import MaskSpec
from cpbench.errors import CpbenchError
from cpbench.render.efficiency import efficiency_tables, profile_table
from tests.conftest import lend

MASKS = [
    MaskSpec(causal=True),
    MaskSpec(causal=False),
    MaskSpec(causal=True, documents=(96, 160, 256)),
    MaskSpec(causal=True, window=100),
    MaskSpec(causal=True, documents=(200, 312), window=64),
]


@pytest.mark.torch_free
@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped", "doc_zigzag", "balanced"])
@pytest.mark.parametrize("mesh", [(1, 2), (1, 4), (2, 2), (4, 1)])
@pytest.mark.parametrize("mask", MASKS, ids=lambda m: m.short_key())
def test_uninitialised_accumulators_are_assigned_before_read(
    mask: MaskSpec, mesh: tuple[int, int], layout: str
) -> None:
    """Where the plan says every local row is touched (`rows_touched` = n), every piece is
    either the first on its rows (assigned) or lies wholly inside rows assigned earlier, so
    no merge and no dQ addition reads uninitialised memory."""
    u, r = mesh
    pack = packing(512, u, r, layout, mask)
    n = pack.seq_len // r
    for j in range(r):
        plan = ring_plan(pack, j)
        assigned: list[tuple[int, int]] = []
        for step in plan.pieces:
            for p in step:
                span = (p.rows.start, p.rows.stop)
                if plan.rows_touched:
                    grows = _union_length([*assigned, span]) - _union_length(assigned)
                    assert p.first or grows == 0, (mask, mesh, layout, j, span)
                    if p.first:
                        assert grows == span[1] - span[0]
                assigned.append(span)
        assert plan.rows_touched in (0, _union_length(assigned))
        # causal / full masks on the global layouts: every row is touched, so no fill at all
        if mask.documents is None and mask.window is None and layout != "doc_zigzag":
            assert plan.rows_touched == n


def test_add_grads_equals_zero_fill_and_add() -> None:
    """Accumulating piece gradients straight into the received accumulator (or, for a chunk's
    first step, copying one whole-chunk piece in) equals the old zero-filled block buffer
    added to the received accumulator, exactly (same fp32 additions)."""
    g = torch.Generator().manual_seed(3)
    kv = torch.randn(1, 64, 2, 4, 8, generator=g)
    pieces = [(slice(0, 64), torch.randn(1, 64, 4, 8, generator=g),
               torch.randn(1, 64, 4, 8, generator=g))]
    block = torch.zeros(kv.shape)
    block[:, :, 0] += pieces[0][1]
    block[:, :, 1] += pieces[0][2]
    assert torch.equal(_add_grads(None, pieces, kv), block)
    parts = [(slice(0, 16), torch.randn(1, 16, 4, 8, generator=g),
              torch.randn(1, 16, 4, 8, generator=g)),
             (slice(40, 64), torch.randn(1, 24, 4, 8, generator=g),
              torch.randn(1, 24, 4, 8, generator=g))]
    block = torch.zeros(kv.shape)
    for cols, dk, dv in parts:
        block[:, cols, 0] += dk
        block[:, cols, 1] += dv
    received = torch.randn(kv.shape, generator=g)
    expected = received.clone().add_(block)
    assert torch.allclose(_add_grads(received.clone(), parts, kv), expected, rtol=0, atol=1e-6)
    assert torch.equal(_add_grads(None, parts, kv), block)  # first step, partial columns
    # bf16 piece gradients land in the fp32 accumulator
    half = [(slice(0, 64), pieces[0][1].bfloat16(), pieces[0][2].bfloat16())]
    acc = _add_grads(None, half, kv)
    assert acc.dtype == torch.float32
    assert torch.equal(acc[:, :, 0], pieces[0][1].bfloat16().float())


@pytest.mark.torch_free
def test_timing_arithmetic_and_peer_ratio() -> None:
    single = [4.0, 4.4, 4.2]
    case = EfficiencyCase("cpbench", 1, 2, "zigzag")
    t = _timing(case, [2.5, 2.1, 2.2], single, 2)
    assert t.best == 2.1 and t.median == 2.2
    assert t.spread == pytest.approx((2.5 - 2.1) / 2.2, abs=1e-12)
    assert t.efficiency_best == pytest.approx(4.0 / (2 * 2.1), abs=1e-12)
    assert t.efficiency_median == pytest.approx(4.2 / (2 * 2.2), abs=1e-12)
    peers = [
        t,
        _timing(EfficiencyCase("torch_cp", 1, 2, "zigzag"), [2.4, 2.6, 2.5], single, 2),
        _timing(EfficiencyCase("torch_cp:alltoall", 1, 2, "zigzag"), [2.3, 2.3, 2.3], single, 2),
        _timing(EfficiencyCase("torch_cp", 1, 2, "contiguous"), [1.0, 1.0, 1.0], single, 2),
    ]
    out = with_peers(peers)
    assert out[0].peer == "torch_cp:alltoall"  # fastest library on the same mesh and layout
    assert out[0].vs_peer == pytest.approx(2.2 / 2.3, abs=1e-12)
    assert all(o.vs_peer is None for o in out[1:])


@pytest.mark.torch_free
def test_cases_cover_every_mesh_and_settings_are_checked() -> None:
    settings = EfficiencySettings(impls=("cpbench",))
    cases = cases_of(settings, 4)
    meshes = {(c.ulysses, c.ring, c.layout) for c in cases}
    assert meshes == {(1, 4, "zigzag"), (1, 4, "contiguous"), (2, 2, "zigzag"),
                      (2, 2, "contiguous"), (4, 1, "contiguous")}
    with pytest.raises(CpbenchError, match="world sizes must be >= 2"):
        EfficiencySettings(world_sizes=(1,))
    with pytest.raises(CpbenchError, match="rounds must be >= 1, got 0"):
        EfficiencySettings(rounds=0)


@pytest.mark.torch_free
@pytest.mark.parametrize(
    ("name", "bucket"),
    [
        ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attention kernels"),
        ("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>", "attention kernels"),
        ("aten::copy_", "copies"),
        ("Memcpy DtoD (Device -> Device)", "copies"),
        ("aten::fill_", "fills"),
        ("aten::logaddexp", "merge / accumulate"),
        ("aten::add_", "merge / accumulate"),
        ("c10d::send", "comm calls"),
        ("ncclDevKernel_SendRecv", "comm calls"),
        ("cpbench::wait_dkv", "waits"),
        ("cpbench::a2a", "waits"),
        ("RingAttentionBackward", "other ops & autograd"),
    ],
)
def test_profile_buckets(name: str, bucket: str) -> None:
    assert bucket_of(name) == bucket


@pytest.fixture(scope="module")
def small_report(pool) -> EfficiencyReport:  # type: ignore[no-untyped-def]
    from cpbench.app.efficiency import measure  # noqa: PLC0415

    settings = EfficiencySettings(
        seq_len=256, heads=4, kv_heads=4, head_dim=16, world_sizes=(2,),
        dtypes=("float32",), impls=("cpbench", "torch_cp", "ring_flash_attn"), rounds=3,
        timeout=240.0,
    )
    with pytest.MonkeyPatch.context() as patch:
        lend(pool, patch, measure)  # on the session's 2 ranks
        return run_efficiency(settings)


def test_small_run_measures_every_cpbench_mesh(small_report: EfficiencyReport) -> None:
    document = small_report.to_dict()
    (group,) = document["groups"]
    assert (group["world_size"], group["dtype"]) == (2, "float32")
    base = group["baseline"]
    assert base["status"] == "ok" and len(base["samples"]) == 3
    assert base["efficiency_best"] == pytest.approx(1.0, abs=1e-12)
    by = {(c["case"]["impl"], c["case"]["ulysses"], c["case"]["ring"], c["case"]["layout"]): c
          for c in group["cases"]}
    for key in [("cpbench", 1, 2, "zigzag"), ("cpbench", 1, 2, "contiguous"),
                ("cpbench", 2, 1, "contiguous")]:
        c = by[key]
        assert c["status"] == "ok", c["reason"]
        assert len(c["samples"]) == 3 and all(s > 0 for s in c["samples"])
        assert c["efficiency_best"] == pytest.approx(
            min(base["samples"]) / (2 * min(c["samples"])), rel=1e-12)
        assert c["efficiency_median"] == pytest.approx(
            statistics.median(base["samples"]) / (2 * statistics.median(c["samples"])),
            rel=1e-12)
    # torch_cp has no Ulysses; ring-flash-attn runs only in 16 bits: skipped with the rule
    assert by[("torch_cp", 2, 1, "contiguous")]["status"] == "skipped"
    assert "ulysses = 1" in by[("torch_cp", 2, 1, "contiguous")]["reason"]
    rf = by[("ring_flash_attn", 1, 2, "zigzag")]
    assert rf["status"] == "skipped" and rf["reason"]
    if by[("torch_cp", 1, 2, "zigzag")]["status"] == "ok":
        zig = by[("cpbench", 1, 2, "zigzag")]
        assert zig["peer"] == "torch_cp"
        assert zig["vs_peer"] == pytest.approx(
            zig["median"] / by[("torch_cp", 1, 2, "zigzag")]["median"], rel=1e-12)
    json.dumps(document)  # the JSON document is plain data
    assert document["convention"] == CONVENTION


@pytest.mark.torch_free
@pytest.mark.parametrize("width", [80, 100])
def test_table_fits_the_console(small_report: EfficiencyReport, width: int) -> None:
    console = Console(width=width, file=io.StringIO(), color_system=None, force_terminal=False)
    for renderable in efficiency_tables(small_report):
        console.print(renderable)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert max(len(line) for line in text.splitlines()) <= width
    assert "cpbench U1xR2 zigzag" in text and "single process" in text
    assert "efficiency = t_single / (P x t_case)" in " ".join(text.split())


@pytest.mark.torch_free
def test_cli_rejects_unknown_dtype_naming_it() -> None:
    result = CliRunner().invoke(app, ["efficiency", "--dtype", "float64"])
    assert result.exit_code == 2
    assert "--dtype 'float64' is not one of float32, bfloat16, float16" in " ".join(
        result.output.split()
    )


def test_profile_shows_the_median_step_of_each_case(pool, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """3 profiled steps per case on 2 gloo ranks: the step shown is the one of median wall
    time, its buckets are one step's (they add up to no more than its wall time; the single
    process is all kernel), and the table fits 80 columns with every profiled wall listed."""
    settings = EfficiencySettings(
        seq_len=512, heads=4, kv_heads=4, head_dim=16, world_sizes=(2,), dtypes=("float32",),
        impls=("cpbench",), rounds=3, timeout=240.0,
    )
    from cpbench.app.efficiency import profile  # noqa: PLC0415

    lend(pool, monkeypatch, profile)  # on the session's 2 ranks
    profiles = profile_steps(settings, "float32")
    assert [p.label for p in profiles] == [
        "single process", "cpbench U1xR2 zigzag", "cpbench U2xR1 contiguous"
    ]
    for p in profiles:
        assert len(p.walls) == 3
        assert p.wall == statistics.median(p.walls)
        assert p.device == {}
        # self times of one thread's events: they add up to at most the step (10% for the
        # profiler's own bookkeeping at this tiny size)
        assert all(t >= 0.0 for t in p.cpu.values()) and sum(p.cpu.values()) <= p.wall * 1.1
        assert p.cpu["attention kernels"] > 0.0
    assert profiles[0].cpu["attention kernels"] == max(profiles[0].cpu.values())
    ring = profiles[1]
    assert ring.cpu["comm calls"] + ring.cpu["waits"] > 0.0  # the ring exchanged K/V
    assert profiles[0].cpu["comm calls"] == profiles[0].cpu["waits"] == 0.0
    console = Console(width=80, file=io.StringIO(), color_system=None, force_terminal=False)
    console.print(profile_table(profiles, "float32"))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "median of 3 profiled steps" in " ".join(text.split())
    walls_line = next(line for line in text.splitlines() if "walls profiled" in line)
    assert len(walls_line.split("│")) >= 4
