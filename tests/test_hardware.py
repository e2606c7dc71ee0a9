"""Hardware profiles: the shipped ones load, carry sources, round-trip; bad ones are rejected."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, get_args

import pytest

from cpbench.config.vocabulary import DTYPES
from cpbench.errors import CpbenchError
from cpbench.model.hardware.file_schema import (
    file_keys,
    profile_from_dict,
    profile_from_toml,
    profile_table_at,
    profile_to_toml,
    save_profile,
    tomllib,  # the stdlib module, or tomli on Python 3.10
)
from cpbench.model.hardware.loading import (
    CPU_PROFILE,
    FALLBACK_GPU_PROFILE,
    ProfileChoice,
    builtin_profiles,
    choose_profile,
    load_profile,
    profile_for_devices,
)
from cpbench.model.hardware.profile import (
    COLLECTIVE_KINDS,
    LINK_TIERS,
    CalibrationInfo,
    EfficiencyCurve,
    HardwareProfile,
    LinkCost,
    Peaks,
    resolve_kernel_family,
)
from cpbench.model.hardware.transforms import with_default_kernel, with_topology
from cpbench.units import GB, GIB
from tests.synthetic import scaled_bandwidth

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

SHIPPED = ("a100-80gb", "cpu-local", "h100-sxm", "h200-sxm", "l40s-pcie")


def test_shipped_profiles_are_listed() -> None:
    assert set(SHIPPED) <= set(builtin_profiles())


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_loads_with_sources(name: str) -> None:
    profile = load_profile(name)
    assert profile.name == name
    assert profile.memory.capacity_gib > 0 and profile.memory_bandwidth > 0
    assert profile.peak_flops("float32") > 0
    assert profile.memory.source and profile.peaks.source and profile.efficiency.source
    assert profile.overheads.source
    for tier in LINK_TIERS:
        link = profile.link(tier)
        for kind in COLLECTIVE_KINDS:
            cost = link.cost(kind)
            assert cost.busbw > 0 and cost.latency_s >= 0
            assert cost.source, f"{name} {tier} {kind} has no source"


def test_gpu_profiles_quote_datasheets_and_mark_estimates() -> None:
    for name in ("a100-80gb", "h100-sxm", "h200-sxm", "l40s-pcie"):
        profile = load_profile(name)
        assert "datasheet" in profile.peaks.source
        assert "datasheet" in profile.memory.source
        assert "estimate" in profile.intra_node.all_to_all.source
    cpu = load_profile("cpu-local")
    assert "estimate" in cpu.efficiency.source
    # the brief's ranges for this machine: 0.02-0.05 TFLOP/s, 1-3 GB/s, 50-200 us
    for n in (1024, 8192):
        assert 0.02e12 <= cpu.peak_flops("float32") * cpu.curve().at(n) <= 0.05e12
    for cost in (cpu.intra_node.all_to_all, cpu.intra_node.send_recv):
        assert 1 * GB <= cost.busbw <= 3 * GB
        assert 50e-6 <= cost.latency_s <= 200e-6


def test_datasheet_numbers() -> None:
    h100, a100 = load_profile("h100-sxm"), load_profile("a100-80gb")
    assert h100.peak_flops("bf16") == pytest.approx(989.5e12)
    assert a100.peak_flops("bfloat16") == pytest.approx(312e12)
    assert load_profile("h200-sxm").memory_bytes > 140 * GIB > h100.memory_bytes


@pytest.mark.parametrize("name", SHIPPED)
def test_toml_round_trip(name: str, tmp_path: Path) -> None:
    profile = load_profile(name)
    assert profile_from_toml(profile_to_toml(profile)) == profile
    path = save_profile(profile, tmp_path / f"{name}.toml", header="a header\nline two")
    loaded = load_profile(str(path))
    assert loaded == profile
    assert loaded.origin == str(path)


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(CpbenchError) as info:
        load_profile("nosuch")
    message = str(info.value)
    assert "'nosuch'" in message
    for name in SHIPPED:
        assert name in message


def test_invalid_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("name = \n")
    with pytest.raises(CpbenchError, match="is not valid TOML"):
        load_profile(str(path))


def _h100_dict() -> dict[str, Any]:
    return tomllib.loads(profile_to_toml(load_profile("h100-sxm")))


def _set(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    *parents, leaf = dotted.split(".")
    table = data
    for key in parents:
        table = table[key]
    if value is _DELETE:
        del table[leaf]
    else:
        table[leaf] = value
    return data


_DELETE = object()


@pytest.mark.parametrize(
    ("dotted", "value", "message"),
    [
        ("memory", _DELETE, "memory must be a table"),
        ("memory.capacity_gib", -1, "memory.capacity_gib must be a positive number, got -1"),
        (
            "links.inter_node.send_recv.busbw_GBps",
            0,
            "links.inter_node.send_recv.busbw_GBps must be a positive number, got 0",
        ),
        (
            "links.intra_node.all_to_all.latency_us",
            "fast",
            "latency_us must be a number >= 0, got 'fast'",
        ),
        ("efficiency.flash_attn.efficiency", [0.5, 1.5, 0.5, 0.5, 0.5, 0.5], "in (0, 1], got 1.5"),
        ("efficiency.flash_attn.seq_len", [4, 2, 8, 16, 32, 64], "must be strictly increasing"),
        ("efficiency.flash_attn.seq_len", [1, 2], "differ in length"),
        ("peak_tflops.int8", 100, "peak_tflops.int8 is not a dtype"),
        ("overheads.overlap", 1.5, "overheads.overlap must be a number in [0, 1], got 1.5"),
        ("links.intra_node.devices_per_nic", 0, "must be a positive integer, got 0"),
        ("devices_per_node", 2.5, "devices_per_node must be a positive integer, got 2.5"),
        ("colour", "blue", "unknown key(s) colour"),
        ("links.intra_node.send_recv.bandwidth", 3, "unknown key(s) bandwidth"),
        ("schema_version", 2, "schema_version must be 1, got 2"),
    ],
)
def test_malformed_profile_names_key_and_rule(dotted: str, value: Any, message: str) -> None:
    data = _set(_h100_dict(), dotted, value)
    with pytest.raises(CpbenchError) as info:
        profile_from_dict(data, origin="my.toml")
    assert message in str(info.value)
    assert "my.toml" in str(info.value)


def test_missing_dtype_peak_is_a_clear_error() -> None:
    data = _h100_dict()
    del data["peak_tflops"]["float16"]
    profile = profile_from_dict(data)
    with pytest.raises(CpbenchError, match="no peak TFLOP/s for float16"):
        profile.peak_flops("fp16")


def test_efficiency_curve_interpolates_in_log_length_and_clamps() -> None:
    curve = EfficiencyCurve((1024, 4096), (0.2, 0.6))
    assert curve.at(512) == 0.2 and curve.at(1024) == 0.2
    assert curve.at(2048) == pytest.approx(0.4)  # halfway in log2
    assert curve.at(4096) == 0.6 and curve.at(1 << 20) == 0.6
    values = [curve.at(n) for n in range(1024, 4097, 64)]
    assert values == sorted(values)


def test_link_cost_is_latency_plus_bytes_over_busbw() -> None:
    cost = LinkCost(latency_s=10e-6, busbw=100 * GB)
    assert cost.seconds(1e9, calls=3) == pytest.approx(30e-6 + 0.01)
    assert cost.seconds(1e9, calls=1, sharing=2) == pytest.approx(10e-6 + 0.02)
    assert cost.seconds(0, calls=0) == 0.0


@pytest.mark.parametrize(
    ("dotted", "value", "message"),
    [
        ("devices_per_node", True, "devices_per_node must be a positive integer, got True"),
        ("devices_per_node", "8", "devices_per_node must be a positive integer, got '8'"),
        ("memory.capacity_gib", True, "memory.capacity_gib must be a positive number, got True"),
        ("memory.bandwidth_GBps", "3", "memory.bandwidth_GBps must be a positive number, got '3'"),
        ("efficiency.flash_attn.seq_len", [1, 2, 3, 4, 5, True],
         "efficiency.flash_attn.seq_len must hold positive integers, got True"),
        ("schema_version", True, "schema_version must be 1, got True"),
        ("name", 5, "name must be a string, got 5"),
        ("name", _DELETE, "name is required"),
        ("peak_tflops", {"source": "x"},
         "peak_tflops needs at least one of float32, bfloat16, float16"),
        ("calibration", 3, "calibration must be a table"),
        ("links.intra_node.colour", 1, "[links.intra_node] has unknown key(s) colour; allowed: "
         "all_to_all, devices_per_nic, name, send_recv"),
    ],
)  # fmt: skip
def test_types_are_strict(dotted: str, value: Any, message: str) -> None:
    """No coercion: an integer key takes neither `true` nor "8", a number no string."""
    data = _set(_h100_dict(), dotted, value)
    with pytest.raises(CpbenchError) as info:
        profile_from_dict(data, origin="my.toml")
    assert str(info.value) == f"hardware profile my.toml: {message}"


def test_written_profile_keeps_the_header_and_awkward_strings(tmp_path: Path) -> None:
    odd = 'quotes " and \\ backslash,\nnew line, tab\t, unicode µs é'
    calibration = CalibrationInfo("cpu-local", 18, 0.0123456789, ("a b.jsonl", odd))
    profile = dataclasses.replace(
        load_profile("cpu-local"),
        description=odd,
        compute_slots_per_node=None,
        calibration=calibration,
    )
    path = save_profile(profile, tmp_path / "fitted.toml", header="fitted by cpbench\n\nline 3")
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# fitted by cpbench\n#\n# line 3\nschema_version = 1\n")
    loaded = load_profile(str(path))
    assert loaded.description == odd and loaded.compute_slots_per_node is None
    assert loaded.calibration is not None and loaded.calibration.files == ("a b.jsonl", odd)
    # numbers keep 6 significant digits, the rest of the profile is unchanged
    assert loaded.calibration.residual == 0.0123457
    assert loaded == dataclasses.replace(
        profile, calibration=dataclasses.replace(calibration, residual=0.0123457)
    )


def test_file_models_describe_every_key() -> None:
    assert set(file_keys(Peaks)) == {*DTYPES, "source"}
    assert profile_table_at(("links", "intra_node", "send_recv")) is LinkCost
    tables: list[type] = [HardwareProfile]
    while tables:
        model = tables.pop()
        for name, field in file_keys(model).items():
            assert field.description, f"{model.__name__}.{name} has no docstring"
            tables += [
                t for t in (field.annotation, *get_args(field.annotation))
                if hasattr(t, "__pydantic_fields__")
            ]  # fmt: skip


# ------------------------------------------------------------------ kernel families, devices


def _single_curve(name: str, family: str) -> dict[str, Any]:
    """A shipped profile in the single-curve layout of older files."""
    data = tomllib.loads(profile_to_toml(load_profile(name)))
    data["kernel_efficiency"] = data.pop("efficiency")[family]
    del data["device"]
    return data


@pytest.mark.parametrize(
    ("name", "family"), [("cpu-local", "cpu_sdpa"), ("h100-sxm", "flash_attn")]
)
def test_single_curve_profiles_still_load(name: str, family: str) -> None:
    old = profile_from_dict(_single_curve(name, family), origin="old.toml")
    new = load_profile(name)
    assert old.default_kernel == family and list(old.kernels.given) == [family]
    assert old.efficiency == new.curve(family)
    # one curve serves every kernel, as before kernel families
    for kernel in ("auto", "sdpa", "naive", "flash_attn", "flash_attn3", "cudnn"):
        assert old.curve(old.kernel_for(kernel, "float32")).at(2048) == pytest.approx(
            new.curve(family).at(2048), rel=1e-12
        )
    # written back in the new layout, it reads the same
    assert profile_from_toml(profile_to_toml(old)) == old


def test_single_curve_errors_name_the_old_key() -> None:
    data = _single_curve("h100-sxm", "flash_attn")
    data["kernel_efficiency"]["efficiency"] = [0.5, 1.5, 0.5, 0.5, 0.5, 0.5]
    with pytest.raises(CpbenchError) as info:
        profile_from_dict(data, origin="old.toml")
    assert str(info.value) == (
        "hardware profile old.toml: kernel_efficiency.efficiency must hold numbers in (0, 1], "
        "got 1.5"
    )
    both = {**_h100_dict(), "kernel_efficiency": data["kernel_efficiency"]}
    with pytest.raises(CpbenchError, match=r"has both \[efficiency\] and \[kernel_efficiency\]"):
        profile_from_dict(both, origin="both.toml")


@pytest.mark.parametrize(
    ("dotted", "value", "message"),
    [
        ("efficiency.default", "cudnn9", "efficiency.default must be one of flash_attn, "
         "flash_attn3, cudnn, cuda_sdpa, cpu_sdpa, einsum, got 'cudnn9'"),
        ("efficiency.flash", {}, "[efficiency] has unknown key(s) flash; allowed: cpu_sdpa, "
         "cuda_sdpa, cudnn, default, einsum, flash_attn, flash_attn3, source"),
        ("efficiency.flash_attn", _DELETE, "efficiency default 'flash_attn' has no "
         "[efficiency.flash_attn] curve (curves given: flash_attn3, cudnn, cuda_sdpa, einsum)"),
        ("device.kind", "tpu", "device.kind must be one of cpu, cuda, got 'tpu'"),
        ("device.names", ["H100("], "device.names must hold regular expressions; 'H100(' is "
         "not one"),
    ],
)  # fmt: skip
def test_kernel_and_device_tables_are_validated(dotted: str, value: Any, message: str) -> None:
    data = _set(_h100_dict(), dotted, value)
    with pytest.raises(CpbenchError) as info:
        profile_from_dict(data, origin="my.toml")
    assert str(info.value).startswith(f"hardware profile my.toml: {message}")


def test_hopper_profiles_default_to_flash_attention_2_with_cited_curves() -> None:
    for name in ("h100-sxm", "h200-sxm"):
        profile = load_profile(name)
        assert profile.default_kernel == "flash_attn"
        assert {"flash_attn", "flash_attn3", "cudnn"} <= set(profile.kernels.given)
        for family in ("flash_attn", "flash_attn3", "cudnn"):
            assert "arXiv:2407.08608" in profile.curve(family).source
        fa2, fa3 = profile.curve("flash_attn"), profile.curve("flash_attn3")
        # FlashAttention-3 paper, H100 bf16 head dim 128: FA2 about a third of peak at 8-16k,
        # FA3 about 1.5-2x faster (the old single curve was FA3's: 2x optimistic for FA2)
        for n in (8192, 16384):
            assert 0.30 <= fa2.at(n) <= 0.36
            assert 0.55 <= fa3.at(n) <= 0.65
            assert 1.5 <= fa3.at(n) / fa2.at(n) <= 2.0
        assert load_profile(name).curve("cuda_sdpa").source.startswith("estimate")


@pytest.mark.parametrize(
    ("kernel", "device", "dtype", "family"),
    [
        ("auto", "cuda", "bf16", "flash_attn"),
        ("auto", "cuda", "float32", "cuda_sdpa"),
        ("auto", "cpu", "float32", "cpu_sdpa"),
        ("sdpa", "cuda", "bfloat16", "cuda_sdpa"),
        ("sdpa", "cpu", "bfloat16", "cpu_sdpa"),
        ("naive", "cuda", "bfloat16", "einsum"),
        ("FA3", "cuda", "bfloat16", "flash_attn3"),
        ("cudnn", "cuda", "bfloat16", "cudnn"),
    ],
)
def test_kernel_names_resolve_to_families(
    kernel: str, device: str, dtype: str, family: str
) -> None:
    profile = load_profile("cpu-local" if device == "cpu" else "h100-sxm")
    assert profile.kernel_for(kernel, dtype) == family
    assert resolve_kernel_family(kernel, device, "flash_attn", dtype) == family


def test_auto_follows_the_profile_default_and_unknown_kernels_are_named() -> None:
    fa3_default = with_default_kernel(load_profile("h100-sxm"), "flash_attn3")
    assert fa3_default.kernel_for("auto", "bf16") == "flash_attn3"
    assert fa3_default.efficiency == load_profile("h100-sxm").curve("flash_attn3")
    assert fa3_default.curve("flash_attn") == load_profile("h100-sxm").efficiency
    with pytest.raises(CpbenchError, match="kernel 'xformers' is not one of auto, sdpa, "):
        load_profile("h100-sxm").kernel_for("xformers")


@pytest.mark.parametrize(
    ("names", "profile"),
    [
        (["NVIDIA H100 80GB HBM3"] * 8, "h100-sxm"),
        (["NVIDIA H200"], "h200-sxm"),
        (["NVIDIA A100-SXM4-80GB"], "a100-80gb"),
        (["NVIDIA L40S"], "l40s-pcie"),
        (["cpu: AMD EPYC 7B13"], "cpu-local"),
        (["NVIDIA H100 PCIe"], None),  # another device than the SXM5 card
        (["NVIDIA H200 NVL"], None),
        (["NVIDIA A100 80GB PCIe"], None),
        (["NVIDIA L40"], None),
        (["NVIDIA H100 80GB HBM3", "NVIDIA H200"], None),  # no one profile describes both
        ([], None),
    ],
)
def test_profile_for_devices(names: list[str], profile: str | None) -> None:
    assert profile_for_devices(names) == profile


@pytest.mark.parametrize(
    ("names", "profile"),
    [
        (["NVIDIA H100 80GB HBM3"] * 8, "h100-sxm"),
        (["NVIDIA A100-SXM4-80GB"], "a100-80gb"),
        (["NVIDIA L40S", "NVIDIA L40S"], "l40s-pcie"),
    ],
)
def test_choose_profile_names_the_built_in_of_the_devices(names: list[str], profile: str) -> None:
    choice = choose_profile(names)
    assert choice == ProfileChoice(profile, f"the records name {names[0]!r}")
    assert load_profile(choice.name).matches_device(names[0])


def test_choose_profile_falls_back_to_h100_with_a_warning_naming_the_devices() -> None:
    unknown = choose_profile(["Some Future GPU", "NVIDIA L40S"])  # no one profile has both
    assert unknown.name == FALLBACK_GPU_PROFILE == "h100-sxm"
    problem = "no built-in hardware profile describes 'NVIDIA L40S', 'Some Future GPU'"
    assert unknown.reason == f"fallback: {problem} (environment.devices)"
    assert unknown.warning == (
        f"{problem} (environment.devices): starting from h100-sxm; pass --hardware NAME|PATH "
        f"with a profile of this GPU"
    )
    unnamed = choose_profile([], subject="the ranks", names_from="torch.cuda.get_device_name")
    assert unnamed.name == "h100-sxm"
    assert unnamed.reason == "fallback: the ranks name no device (torch.cuda.get_device_name)"


def test_choose_profile_prefers_the_given_profile_then_the_cpu_one() -> None:
    h100 = ["NVIDIA H100 80GB HBM3"]
    assert choose_profile(h100, cpu=True, given="my.toml") == ProfileChoice(
        "my.toml", "given with --hardware"
    )
    assert choose_profile(h100, cpu=True) == ProfileChoice(
        CPU_PROFILE, "the records were measured on CPU"
    )
    assert CPU_PROFILE == "cpu-local" and CPU_PROFILE in builtin_profiles()


# ------------------------------------------------------------------------------ topology

TOPOLOGY_SHIPPED = ("l40s-pcie-2x4", "l40s-pcie-2x4-nop2p", "a100-pcie-4")


@pytest.mark.parametrize("name", TOPOLOGY_SHIPPED)
def test_topology_profiles_load_round_trip_and_mark_estimates(name: str, tmp_path: Path) -> None:
    profile = load_profile(name)
    assert profile.topology is not None
    tiers = profile.node_tiers()
    assert tiers[-1].island == profile.devices_per_node
    assert all(b.island > a.island and b.island % a.island == 0 for a, b in zip(tiers, tiers[1:], strict=False))
    for tier in tiers:
        for kind in COLLECTIVE_KINDS:
            assert "estimate" in tier.cost(kind).source, f"{name} {tier.kind} {kind}"
    loaded = load_profile(str(save_profile(profile, tmp_path / f"{name}.toml")))
    assert loaded == profile
    assert "datasheet" in profile.peaks.source


def test_topology_p2p_flag_and_crossing_bandwidth() -> None:
    p2p, no_p2p = load_profile("l40s-pcie-2x4"), load_profile("l40s-pcie-2x4-nop2p")
    assert all(t.peer_to_peer for t in p2p.node_tiers())
    assert not any(t.peer_to_peer for t in no_p2p.node_tiers())
    for profile in (p2p, no_p2p):
        inner, outer = profile.node_tiers()
        assert outer.all_to_all.busbw < inner.all_to_all.busbw  # the uplink is shared
    # the x16 uplink (31.5 GB/s line rate) shared by 4 GPUs bounds the socket tier per GPU
    assert p2p.node_tiers()[1].all_to_all.busbw <= 31.5 * GB / 4


def test_flat_profiles_are_one_island() -> None:
    h100 = load_profile("h100-sxm")
    assert h100.topology is None
    (tier,) = h100.node_tiers()
    assert (tier.kind, tier.island) == ("nvlink", 8)
    assert tier.all_to_all == h100.intra_node.all_to_all


@pytest.mark.parametrize(
    ("islands", "message"),
    [
        ([4, 6], "islands must nest"),
        ([4, 4], "islands must nest"),
        ([2, 4], "outermost island (4 devices) must be the node: devices_per_node is 8"),
    ],
)
def test_topology_table_rules(islands: list[int], message: str) -> None:
    data = tomllib.loads(profile_to_toml(load_profile("l40s-pcie-2x4")))
    tiers = data["topology"]["tiers"]
    data["topology"]["tiers"] = [{**tiers[0], "island": n} for n in islands]
    with pytest.raises(CpbenchError, match=re.escape(message)):
        profile_from_dict(data, "x.toml")


def test_with_topology_checks_the_node() -> None:
    profile = load_profile("l40s-pcie-2x4")
    assert profile.topology is not None
    assert with_topology(profile, None).topology is None
    with pytest.raises(CpbenchError, match=r"outermost must be the node \(4 devices per node\)"):
        with_topology(load_profile("a100-pcie-4"), profile.topology)
    assert scaled_bandwidth(profile, 2.0).node_tiers()[1].send_recv.busbw == pytest.approx(
        2 * profile.node_tiers()[1].send_recv.busbw
    )
