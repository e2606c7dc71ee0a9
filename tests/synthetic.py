"""Synthetic results records: ground truth for testing calibration, validation and recommend."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

from cpbench.app.probe.fit import CommMeasurement, KernelMeasurement, fit_links
from cpbench.app.probe.plan import default_settings, make_plan
from cpbench.app.probe.profile import measured_profile
from cpbench.app.probe.run import ProbeResult
from cpbench.config.problem import MeshCandidate
from cpbench.errors import CpbenchError
from cpbench.model.calibrate.measurements import Measurement
from cpbench.model.cost.prediction import predict
from cpbench.model.flops import FLOPS_CONVENTION, attention_flops
from cpbench.model.formulas import bandwidths, comm_volume
from cpbench.model.hardware.loading import load_profile
from cpbench.model.hardware.profile import COLLECTIVE_KINDS, LINK_TIERS, HardwareProfile, LinkCost
from cpbench.model.hardware.transforms import with_link_cost
from cpbench.model.memory import memory_estimate


def synthetic_record(
    candidate: MeshCandidate,
    profile: HardwareProfile,
    devices_per_node: int | None = None,
    noise: float = 0.0,
    rng: random.Random | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """A results record (schema.py) whose times are the cost model's on `profile`, each times
    (1 + noise x N(0, 1)): ground truth for testing calibration and validation."""
    rng = rng or random.Random(0)
    per_node = devices_per_node or profile.devices_per_node
    p = predict(candidate, profile, per_node)
    c = p.candidate

    def noisy(value: float) -> float:
        return max(value * (1.0 + noise * rng.gauss(0.0, 1.0)), 1e-9)

    median, compute, comm = noisy(p.step_s), noisy(p.compute_only_s), noisy(p.comm_only_s)
    world = c.world
    nodes = max(1, -(-world // per_node))
    volume = comm_volume(c)
    causal = "causal" if candidate.causal else "full"
    s = c.shape
    record_id = (
        f"L{s.seq_len}-B{s.batch}-h{s.heads}-kv{s.kv_heads}-d{s.head_dim}-{c.dtype}-{causal}-"
        f"U{c.ulysses}xR{c.ring}-{c.layout}-rep{c.replication}-auto-{candidate.phase}-"
        f"{device}-w{world}"
    )
    documents = candidate.mask.documents if candidate.mask.has_documents else None
    if documents:
        record_id += "-docs" + "_".join(map(str, documents))
    flops = attention_flops(
        s, candidate.causal, "forward" if candidate.phase == "fwd" else "forward_backward"
    )
    return {
        "schema_version": 1,
        "id": record_id,
        "scenario": "synthetic",
        "status": "ok",
        "error": None,
        "config": {
            "seq_len": s.seq_len,
            "batch": s.batch,
            "heads": s.heads,
            "kv_heads": s.kv_heads,
            "head_dim": s.head_dim,
            "dtype": c.dtype,
            "causal": candidate.causal,
            "ulysses": c.ulysses,
            "ring": c.ring,
            "layout": c.layout,
            "kv_replication": c.replication,
            "backend": "auto",
            "kernel": "synthetic",
            "device": device,
            "world_size": world,
            "nodes": nodes,
            "phase": candidate.phase,
            "scheme": c.scheme,
            "documents": list(documents) if documents else None,
        },
        "timing": {
            "phase": candidate.phase,
            "median": median,
            "p10": median,
            "p90": median,
            "samples": [median],
            "compute_only": compute,
            "comm_only": comm,
            "exposed_comm": max(0.0, median - compute),
        },
        "comm": {
            "analytic_bytes": {
                "fwd": volume.bytes_sent("forward"),
                "bwd": volume.bytes_sent("backward"),
            },
            "measured_bytes": {
                "fwd": [volume.bytes_sent("forward")] * world,
                "bwd": [volume.bytes_sent("backward")] * world,
            },
            "match": True,
        },
        "memory": {"analytic_peak_bytes": memory_estimate(c).peak("forward_backward")},
        "flops": {
            "convention": FLOPS_CONVENTION,
            "global": flops,
            "achieved_tflops": flops / median / 1e12,
        },
    }


def step_time_measurements(
    candidates: list[MeshCandidate],
    truth: HardwareProfile,
    devices_per_node: int,
    noise: float,
    rng: random.Random,
    device: str = "cuda",
) -> list[Measurement]:
    """Measurements of step times alone (no compute-only / comm-only times), each the truth's
    prediction x exp(noise x N(0, 1)) (log-normal noise)."""
    out = []
    for c in candidates:
        step = predict(c, truth, devices_per_node, memory=False).step_s
        median = step * math.exp(noise * rng.gauss(0.0, 1.0))
        label = f"{c.shape.seq_len}-{c.shape.heads}-{c.shape.head_dim}-{c.ulysses}x{c.ring}"
        out.append(Measurement(label, c, devices_per_node, median, None, None, device))
    return out


def scaled_bandwidth(profile: HardwareProfile, factor: float) -> HardwareProfile:
    """A copy with every busbw multiplied by `factor` (a what-if: the same machine with faster links)."""
    if factor <= 0:
        raise CpbenchError(f"bandwidth factor must be positive, got {factor}")

    def scaled(cost: LinkCost) -> LinkCost:
        return replace(cost, busbw=cost.busbw * factor)

    result = profile
    for tier in LINK_TIERS:
        for kind in COLLECTIVE_KINDS:
            result = with_link_cost(result, tier, kind, scaled(result.link(tier).cost(kind)))
    if result.topology is not None:
        tiers = tuple(
            replace(t, all_to_all=scaled(t.all_to_all), send_recv=scaled(t.send_recv))
            for t in result.topology.tiers
        )
        result = replace(result, topology=replace(result.topology, tiers=tiers))
    return result


def synthetic_probe_result() -> ProbeResult:
    """A probe made without ranks: the plan of 4 CPU ranks, times from a known line (1 ms +
    size / 0.5 GB/s), the kernel shapes at 10 ms steps; the rest as `run_probe` assembles it."""
    prior = load_profile("cpu-local")
    plan = make_plan(default_settings("cpu", 4), prior)
    comm = []
    for t in plan.comm_tests:
        seconds = 1e-3 + t.size_bytes / 0.5e9
        alg, bus = bandwidths(t.size_bytes, seconds, t.kind, t.group_size)
        comm.append(CommMeasurement(t, seconds, 7, alg, bus, "numa_node"))
    fits = fit_links(prior, [(m.test, m.seconds) for m in comm])
    peak = prior.peak_flops("float32")
    kernels = [
        KernelMeasurement(k, 0.01 * (i + 1), 3, k.flops("fwd+bwd"),
                          k.flops("fwd+bwd") / (peak * 0.01 * (i + 1)))
        for i, k in enumerate(plan.kernel_tests)
    ]  # fmt: skip
    profile, notes = measured_profile(prior, fits, kernels, "cpu_sdpa", "float32", "fwd+bwd",
                                      "2030-01-01, test")  # fmt: skip
    return ProbeResult(
        plan, prior, "no GPU: the CPU profile", profile, tuple(comm), tuple(fits),
        tuple(kernels), "cpu_sdpa", "host, 4 x cpu: test", "2030-01-01 00:00 UTC", 12.5, 10.0,
        "/tmp/probe-profile.toml", tuple(notes),
    )  # fmt: skip
