"""Cost model: placement, monotonic properties, traffic accounting, records."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from cpbench.config.constraints import AttentionShape
from cpbench.config.problem import CpProblem, MeshCandidate
from cpbench.config.vocabulary import GLOBAL_LAYOUTS as LAYOUTS
from cpbench.errors import CpbenchError
from cpbench.model.cost.prediction import predict
from cpbench.model.cost.records import prediction_for_record
from cpbench.model.cost.work import closed_form_step_pair_stats, step_pair_stats
from cpbench.model.formulas import comm_volume
from cpbench.model.hardware.loading import load_profile
from cpbench.model.hardware.transforms import with_table
from cpbench.model.memory import memory_estimate
from cpbench.model.topology import placement
from cpbench.render.recommend.explanation import placement_text
from tests.synthetic import scaled_bandwidth

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

H100 = load_profile("h100-sxm")
CPU = load_profile("cpu-local")
SHAPE = AttentionShape(65536, 32, 8, 128)
MESHES_16 = [(u, 16 // u) for u in (1, 2, 4, 8, 16)]


# ------------------------------------------------------------------------------ placement


def test_ulysses_8_on_8_gpus_per_node_stays_inside() -> None:
    p = placement(8, 1, 8)
    assert p.ulysses_tier == "intra_node" and p.ulysses_peers_in_node == 8
    assert p.nodes == 1
    assert "stays inside a node" in placement_text(p)


def test_ulysses_16_on_two_nodes_of_8_crosses() -> None:
    p = placement(16, 1, 8)
    assert p.ulysses_tier == "inter_node" and p.nodes == 2
    assert p.ulysses_peers_in_node == 8
    assert p.ulysses_inter_fraction == pytest.approx(8 / 15)
    assert "spans nodes" in placement_text(p)


def test_ring_strided_by_ulysses_crosses_when_the_mesh_exceeds_a_node() -> None:
    inside = placement(4, 2, 8)
    assert inside.ulysses_tier == inside.ring_tier == "intra_node"
    usp = placement(8, 2, 8)
    assert usp.ulysses_tier == "intra_node" and usp.ring_tier == "inter_node"
    assert usp.ring_crossing_hops == 2
    ring = placement(1, 16, 8)
    assert ring.ring_tier == "inter_node" and ring.ring_crossing_hops == 2
    assert "crosses nodes on 2 of 16 hops" in placement_text(ring)


def test_tensor_parallel_stride_spreads_the_cp_group() -> None:
    # TP = 2 in Megatron's order: CP ranks sit 2 global ranks apart, so 8 CP ranks span 2 nodes
    assert placement(8, 1, 8, rank_stride=2).ulysses_tier == "inter_node"
    assert placement(4, 1, 8, rank_stride=2).ulysses_tier == "intra_node"


def test_placement_rejects_bad_sizes() -> None:
    with pytest.raises(CpbenchError, match="devices per node must be a positive integer, got 0"):
        placement(2, 2, 0)


# ------------------------------------------------------------------------------ step work


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("ring", [1, 2, 3, 4, 8])
def test_closed_form_step_work_matches_flops_module(layout: str, causal: bool, ring: int) -> None:
    seq_len = 2 * ring * 24
    assert closed_form_step_pair_stats(seq_len, ring, layout, causal) == step_pair_stats(
        seq_len, ring, layout, causal
    )


# --------------------------------------------------------------------------- monotonicity


@pytest.mark.parametrize(("ulysses", "ring"), MESHES_16)
@pytest.mark.parametrize("gpus_per_node", [4, 8, 16])
def test_more_bandwidth_is_never_slower(ulysses: int, ring: int, gpus_per_node: int) -> None:
    candidate = MeshCandidate.for_shape(shape=SHAPE, ulysses=ulysses, ring=ring, layout="zigzag")
    slow = predict(candidate, H100, gpus_per_node)
    fast = predict(candidate, scaled_bandwidth(H100, 2.0), gpus_per_node)
    assert fast.step_s <= slow.step_s
    assert fast.comm_only_s < slow.comm_only_s
    assert fast.forward.total_s <= slow.forward.total_s


@pytest.mark.parametrize(("ulysses", "ring"), [(u, r) for u, r in MESHES_16 if r > 1])
@pytest.mark.parametrize("profile", [H100, CPU], ids=["h100", "cpu"])
def test_zigzag_not_slower_than_contiguous_for_causal(
    ulysses: int, ring: int, profile: Any
) -> None:
    zigzag = predict(MeshCandidate.for_shape(shape=SHAPE, ulysses=ulysses, ring=ring, layout="zigzag"), profile, 8)
    contiguous = predict(MeshCandidate.for_shape(shape=SHAPE, ulysses=ulysses, ring=ring, layout="contiguous"), profile, 8)
    assert zigzag.step_s <= contiguous.step_s
    assert zigzag.phase_time.imbalance_s <= contiguous.phase_time.imbalance_s
    assert contiguous.work_imbalance >= 1.5 and zigzag.work_imbalance == pytest.approx(1.0)


def test_shared_compute_slots_hide_the_causal_imbalance() -> None:
    # 4 ranks on 2 CPU cores: the busiest rank borrows the idle ranks' core, so the total
    # work sets the step; on GPUs (a slot per rank) the busiest rank does
    shape = AttentionShape(4096, 8, 8, 64)
    cpu = [predict(MeshCandidate.for_shape(shape=shape, ulysses=1, ring=4, layout=lay, dtype="float32"), CPU, 4) for lay in LAYOUTS[:2]]
    # (per ring step: at the last step only one rank of four works, so a little remains)
    assert cpu[0].forward.imbalance_s < 0.15 * cpu[0].forward.compute_s
    assert cpu[0].step_s == pytest.approx(cpu[1].step_s, rel=0.15)
    gpu = replace(CPU, compute_slots_per_node=None)
    spread = [predict(MeshCandidate.for_shape(shape=shape, ulysses=1, ring=4, layout=lay, dtype="float32"), gpu, 4) for lay in LAYOUTS[:2]]
    assert spread[0].step_s > 1.4 * spread[1].step_s
    # and the shared node is slower overall: 4 ranks on 2 slots
    assert cpu[1].forward.compute_s == pytest.approx(2 * spread[1].forward.compute_s)


def test_without_a_causal_mask_layouts_cost_the_same() -> None:
    times = {
        predict(MeshCandidate.for_shape(shape=SHAPE, ulysses=2, ring=8, layout=layout, causal=False), H100, 8).step_s
        for layout in LAYOUTS
    }
    assert len({round(t, 12) for t in times}) == 1


# ------------------------------------------------------------------------------- accounting


@pytest.mark.parametrize(("ulysses", "ring"), MESHES_16)
@pytest.mark.parametrize("gpus_per_node", [4, 8, 16])
def test_bytes_per_tier_sum_to_comm_volume(ulysses: int, ring: int, gpus_per_node: int) -> None:
    prediction = predict(MeshCandidate.for_shape(shape=SHAPE, ulysses=ulysses, ring=ring, layout="zigzag"), H100, gpus_per_node)
    volume = comm_volume(prediction.candidate)
    assert sum(prediction.bytes_by_tier("forward").values()) == volume.bytes_sent("forward")
    assert sum(prediction.bytes_by_tier("backward").values()) == volume.bytes_sent("backward")
    total = volume.bytes_sent("forward") + volume.bytes_sent("backward")
    assert sum(prediction.bytes_by_tier().values()) == total
    for kind, stage in (("all_to_all", "ulysses"), ("send_recv", "ring")):
        sent = sum(
            s.bytes_sent
            for p in ("forward", "backward")
            for s in volume.stages(p)
            if s.stage == stage
        )
        assert sum(t.total_bytes for t in prediction.traffic if t.kind == kind) == sent


def test_breakdown_adds_up() -> None:
    for ulysses, ring in MESHES_16:
        for layout in ("contiguous", "zigzag"):
            p = predict(MeshCandidate.for_shape(shape=SHAPE, ulysses=ulysses, ring=ring, layout=layout), H100, 8)
            for t in (p.forward, p.backward, p.forward_backward):
                assert t.compute_s + t.imbalance_s + t.exposed_comm_s == pytest.approx(t.total_s)
                assert t.exposed_comm_s >= 0 and t.imbalance_s >= 0
                assert t.exposed_comm_s <= t.comm_s + 1e-12


def test_ulysses_all_to_all_by_hand() -> None:
    # U = 8 inside a node, forward: 3 all-to-alls (Q, K/V, O), each latency + bytes / busbw
    p = predict(MeshCandidate.for_shape(shape=SHAPE, ulysses=8, ring=1, layout="contiguous"), H100, 8)
    link = H100.intra_node.all_to_all
    sent = comm_volume(p.candidate).bytes_sent("forward")
    assert p.forward.ulysses_comm_s == pytest.approx(3 * link.latency_s + sent / link.busbw)
    assert p.forward.exposed_comm_s == pytest.approx(p.forward.ulysses_comm_s)


def test_ring_hops_hide_behind_long_compute() -> None:
    # a long sequence on NVLink: every K/V hop is shorter than its step's compute
    p = predict(MeshCandidate.for_shape(shape=SHAPE, ulysses=1, ring=8, layout="zigzag"), H100, 8)
    forward = p.forward
    assert forward.ring_comm_s > 0
    assert forward.exposed_comm_s < 0.2 * forward.ring_comm_s
    # the backward's last dK/dV hop home is never hidden
    home = H100.intra_node.send_recv.seconds(
        comm_volume(p.candidate).collectives("backward")[1].bytes_per_call
    )
    assert p.backward.exposed_comm_s >= home


def test_memory_and_longest_sequence() -> None:
    config = CpProblem(seq_len=65536, heads=32, kv_heads=8, head_dim=128, ulysses=2, ring=4, layout="zigzag").require_feasible()
    p = predict(config, H100, 8)
    assert p.memory_bytes == memory_estimate(config).peak("forward_backward")
    assert p.fits and p.memory_rule() is None
    assert p.max_seq_len >= 65536
    small = with_table(H100, "memory", capacity_gib=0.1)
    rule = predict(config, small, 8).memory_rule()
    assert rule is not None and "GiB per rank > 0.1 GiB" in rule


def test_candidate_from_record_config_and_infeasible() -> None:
    config = {
        "seq_len": 4096,
        "batch": 1,
        "heads": 8,
        "kv_heads": 2,
        "head_dim": 64,
        "dtype": "float32",
        "causal": True,
        "ulysses": 4,
        "ring": 1,
        "layout": "contiguous",
        "kv_replication": 2,
        "world_size": 4,
        "nodes": 1,
        "phase": "fwd",
    }
    p = predict(config, CPU)
    assert p.candidate.replication == 2 and p.candidate.phase == "fwd"
    assert p.step_s == p.forward.total_s
    with pytest.raises(CpbenchError, match="ulysses \\(3\\) must divide heads \\(8\\)"):
        predict({**config, "ulysses": 3}, CPU)
    with pytest.raises(CpbenchError, match="results config lacks seq_len"):
        predict({k: v for k, v in config.items() if k != "seq_len"}, CPU)


def test_prediction_for_record() -> None:
    config = {"seq_len": 2048, "heads": 8, "kv_heads": 8, "head_dim": 64, "ulysses": 2,
              "ring": 2, "layout": "zigzag", "dtype": "float32", "world_size": 4, "nodes": 2,
              "phase": "fwd+bwd"}  # fmt: skip
    p = prediction_for_record({"status": "ok", "config": config}, CPU)
    assert p is not None and p.step_s == p.forward_backward.total_s
    assert p.placement.devices_per_node == 2 and p.placement.ring_tier == "inter_node"
    assert prediction_for_record({"status": "failed", "config": config}, CPU) is None
    assert prediction_for_record({"status": "ok"}, CPU) is None
    assert prediction_for_record({"status": "ok", "config": {**config, "ring": 3}}, CPU) is None


# --------------------------------------------------------------------- kernel curve choice

KERNEL_SHAPE = AttentionShape(65536, 32, 8, 128)


@pytest.mark.parametrize(
    ("kernel", "family"),
    [("auto", "flash_attn"), ("flash_attn", "flash_attn"), ("sdpa", "cuda_sdpa"),
     ("flash_attn3", "flash_attn3"), ("cudnn", "cudnn"), ("naive", "einsum")],
)  # fmt: skip
def test_prediction_reads_the_curve_of_the_kernel_it_runs(kernel: str, family: str) -> None:
    candidate = MeshCandidate.for_shape(shape=KERNEL_SHAPE, ulysses=2, ring=4, layout="zigzag", dtype="bfloat16", kernel=kernel)
    p = predict(candidate, H100)
    n = p.kernel_seq_len
    assert n == 65536 // 4
    assert p.kernel == family and p.curve_kernel == family
    expected = H100.peak_flops("bf16") * H100.curve(family).at(n) / 1e12
    assert p.attention_tflops == pytest.approx(expected, rel=1e-12)
    assert f"{family} efficiency curve of h100-sxm" in p.curve_note
    assert p.curve_source == H100.curve(family).source


def test_faster_kernel_families_predict_faster_steps() -> None:
    def step(kernel: str) -> float:
        candidate = MeshCandidate.for_shape(shape=KERNEL_SHAPE, ulysses=2, ring=4, layout="zigzag", dtype="bfloat16", kernel=kernel)
        return predict(candidate, H100).compute_only_s

    # FA3 paper, H100: FA3 1.5-2x FA2; cuDNN between; einsum far slower
    assert 1.5 <= step("flash_attn") / step("flash_attn3") <= 2.0
    assert step("flash_attn3") < step("cudnn") < step("flash_attn") < step("naive")


def test_a_family_without_a_curve_reads_the_default_and_says_so() -> None:
    a100 = load_profile("a100-80gb")
    candidate = MeshCandidate.for_shape(shape=KERNEL_SHAPE, ulysses=2, ring=4, layout="zigzag", dtype="bfloat16", kernel="cudnn")
    p = predict(candidate, a100)
    assert p.kernel == "cudnn" and p.curve_kernel == "flash_attn"
    assert p.attention_tflops == pytest.approx(
        a100.peak_flops("bf16") * a100.efficiency.at(p.kernel_seq_len) / 1e12, rel=1e-12
    )
    assert "a100-80gb has no cudnn efficiency curve, its default flash_attn curve was used" in (
        p.curve_note
    )


def test_record_kernel_then_backend_choose_the_curve() -> None:
    config = {"seq_len": 16384, "heads": 32, "kv_heads": 8, "head_dim": 128, "ulysses": 2,
              "ring": 2, "layout": "zigzag", "dtype": "bfloat16", "device": "cuda"}  # fmt: skip
    used = {**config, "backend": "auto", "kernel": "flash_attn3"}
    assert MeshCandidate.from_record(used).kernel == "flash_attn3"
    assert predict(used, H100).kernel == "flash_attn3"
    # kernel unknown (a synthetic or future name) or null: the requested backend, else auto
    assert MeshCandidate.from_record({**config, "kernel": None, "backend": "sdpa"}).kernel == "sdpa"
    assert MeshCandidate.from_record({**config, "kernel": "synthetic"}).kernel == "auto"
    assert predict({**config, "kernel": "sdpa"}, CPU).kernel == "cpu_sdpa"
    with pytest.raises(CpbenchError, match="kernel 'xformers' is not one of auto, sdpa"):
        MeshCandidate.for_shape(shape=KERNEL_SHAPE, ulysses=2, ring=4, kernel="xformers")


# ------------------------------------------------------------------ kernel: head dim factor


def test_head_dim_factor_is_the_published_table_relative_to_128() -> None:
    from cpbench.model.cost.kernel import head_dim_factor, kernel_factor  # noqa: PLC0415

    # hand-computed from apache/tvm tl_doc/flash_perf.md (RTX 4090, L=2k, TFLOP/s)
    assert head_dim_factor(32, True, "forward") == pytest.approx(126.78 / 151.19, rel=1e-12)
    assert head_dim_factor(64, False, "backward") == pytest.approx(124.81 / 124.57, rel=1e-12)
    assert head_dim_factor(256, True, "forward") == pytest.approx(144.12 / 151.19, rel=1e-12)
    assert head_dim_factor(256, True, "backward") == 1.0  # no 256 column: constant beyond 128
    assert head_dim_factor(16, True, "backward") == pytest.approx(86.48 / 99.23, rel=1e-12)
    # between measured dims: linear in log2(d), so d=45 (log2 5.49) lies between 32 and 64
    mid = head_dim_factor(45, True, "forward")
    assert head_dim_factor(32, True, "forward") < mid < head_dim_factor(64, True, "forward")
    for phase in ("forward", "backward"):
        for causal in (True, False):
            assert head_dim_factor(128, causal, phase) == 1.0  # type: ignore[arg-type]
    assert kernel_factor("flash_attn", "cpu", 32, True, "forward") == 1.0
    assert kernel_factor("fa3", "cuda", 32, True, "forward") == 1.0


def test_predictions_run_the_kernel_at_the_head_dim_factor() -> None:
    from cpbench.model.cost.kernel import head_dim_factor  # noqa: PLC0415

    h100 = load_profile("h100-sxm")
    for head_dim in (32, 64, 128):
        c = MeshCandidate.for_shape(
            AttentionShape(8192, 32, 8, head_dim), ulysses=1, ring=1, layout="contiguous",
            dtype="bfloat16", causal=True, kernel="flash_attn",
        )  # fmt: skip
        p = predict(c, h100, 1)
        curve_rate = h100.peak_flops("bfloat16") * h100.curve("flash_attn").at(8192)
        for phase, t in (("forward", p.forward), ("backward", p.backward)):
            kernel_s = t.compute_s - t.steps * h100.step_overhead_s - t.memory_bound_s
            rate = t.slowest_flops / kernel_s
            assert rate / curve_rate == pytest.approx(
                head_dim_factor(head_dim, True, phase), rel=1e-9  # type: ignore[arg-type]
            ), (head_dim, phase)
        assert (f"at head dim {head_dim}" in p.curve_note) == (head_dim != 128)
    cpu = load_profile("cpu-local")
    c = MeshCandidate.for_shape(
        AttentionShape(1024, 8, 4, 32), ulysses=1, ring=1, layout="contiguous", dtype="float32"
    )
    assert predict(c, cpu, 1).head_dim_factors == (1.0, 1.0)
