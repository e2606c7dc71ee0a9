"""Rank every U x R x layout candidate of the CP degree with the cost model (calibrated on
measurements when results files are given; measured candidates ranked by measurement)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from cpbench.app.formulas import mask_from_options
from cpbench.app.recommend.explain import explain
from cpbench.app.recommend.frameworks import framework_settings
from cpbench.app.recommend.parallel import ParallelSizes, solve_parallel_sizes
from cpbench.app.recommend.types import (
    DEFAULT_HARDWARE,
    RankedCandidate,
    Recommendation,
    RecommendRequest,
    Rejection,
    comm_label,
    layout_label,
    rank_key,
)
from cpbench.app.recommend.uncertainty import call_ties, profile_uncertainty, with_intervals
from cpbench.config.bench import factorizations
from cpbench.config.block_counts import CountingTooCostly, counting_budget
from cpbench.config.constraints import AttentionShape, check_mesh
from cpbench.config.masks import MaskSpec
from cpbench.config.problem import MeshCandidate, check_phase, check_positive_int
from cpbench.config.vocabulary import CP_COMMS, GLOBAL_LAYOUTS, LAYOUTS, CpComm, canonical_dtype
from cpbench.errors import CpbenchError
from cpbench.model.calibrate import (
    Measurement,
    default_prior,
    fit_profile,
    measurements_from_records,
)
from cpbench.model.cost.prediction import predict
from cpbench.model.hardware.loading import load_profile
from cpbench.model.hardware.profile import HardwareProfile
from cpbench.results.store import read_records, status_summary


def load_results(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """Records of JSONL results files (cpbench.results.store: a torn last line is skipped, a
    malformed line elsewhere is a CpbenchError naming the file and line)."""
    return read_records([Path(p) for p in paths])


def recommend_mesh(request: RecommendRequest) -> Recommendation:
    """Rank every U x R x layout candidate of the CP degree; see the module docstring."""
    _check_request(request)
    AttentionShape(
        request.seq_len, request.heads, request.kv_heads, request.head_dim, request.batch
    )
    sizes = solve_parallel_sizes(
        request.gpus, request.tp, request.pp, request.cp, request.batch, request.grad_accum
    )
    shape = _tp_shape(request)
    mask = mask_from_options(
        request.seq_len, request.causal, request.documents, request.window, request.seed
    )
    records = load_results(request.results) if request.results else []
    measurements = measurements_from_records(records)
    if request.results and not measurements:
        raise CpbenchError(
            f"no usable record in {', '.join(map(str, request.results))}: "
            f"{status_summary(records)}; --results needs status 'ok' records of cpbench's "
            f"training steps with a feasible config and timing.median"
        )
    profile, warnings = _profile_for(request, measurements)
    calibration = None
    if measurements:
        calibration = fit_profile(measurements, profile, files=request.results)
        profile = calibration.profile
    per_node = request.gpus_per_node or profile.devices_per_node
    _check_nodes(request.gpus, per_node)
    ranked, rejected = _evaluate(request, sizes, shape, mask, profile, per_node, measurements)
    uncertainty = profile_uncertainty(profile, calibration, measurements)
    ranked, tie = call_ties(with_intervals(ranked, uncertainty, records), uncertainty, records)
    frameworks = framework_settings(ranked, sizes) if ranked else ()
    return Recommendation(
        request=request,
        profile=profile,
        sizes=sizes,
        shape=shape,
        gpus_per_node=per_node,
        ranked=tuple(ranked),
        rejected=tuple(rejected),
        explanation=explain(ranked, profile, tie.decision if tie else "") if ranked else None,
        frameworks=frameworks,
        calibration=calibration,
        warnings=warnings,
        mask=mask,
        uncertainty=uncertainty,
        tie=tie,
    )


def _check_request(request: RecommendRequest) -> None:
    check_phase(request.phase)
    if request.top < 0:
        raise CpbenchError(f"top must be >= 0 (0 lists all), got {request.top}")
    if request.gpus_per_node is not None:
        check_positive_int("gpus per node", request.gpus_per_node)
    canonical_dtype(request.dtype)


def _check_nodes(gpus: int, per_node: int) -> None:
    if gpus > per_node and gpus % per_node:
        raise CpbenchError(
            f"gpus ({gpus}) must be a multiple of gpus per node ({per_node}) when they span nodes"
        )


def _tp_shape(request: RecommendRequest) -> AttentionShape:
    """The attention problem of one TP rank: Megatron splits query heads and KV heads by TP."""
    tp = request.tp
    if request.heads % tp or request.kv_heads % tp:
        raise CpbenchError(
            f"TP ({tp}) must divide heads ({request.heads}) and kv_heads ({request.kv_heads}): "
            f"tensor parallelism gives each TP rank heads / TP query and KV heads"
        )
    heads, kv_heads = request.heads // tp, request.kv_heads // tp
    return AttentionShape(request.seq_len, heads, kv_heads, request.head_dim, request.batch)


def _profile_for(
    request: RecommendRequest, measurements: Sequence[Measurement]
) -> tuple[HardwareProfile, tuple[str, ...]]:
    """The profile to rank with (the one given, the measured GPU's, or the default) and the
    warning when the measured GPU has no built-in profile."""
    if not request.hardware and not measurements:
        return load_profile(DEFAULT_HARDWARE), ()
    choice = default_prior(measurements, request.hardware)
    return load_profile(choice.name), (choice.warning,) if choice.warning else ()


def requested_comms(
    request: RecommendRequest, measurements: Sequence[Measurement]
) -> tuple[CpComm, ...]:
    """The ring-axis exchanges to rank: the request's, or (None) both without measurements
    and those measured with them (p2p when none says otherwise)."""
    if request.cp_comms is not None:
        return request.cp_comms
    if not measurements:
        return CP_COMMS
    measured = {m.candidate.cp_comm for m in measurements if m.candidate.ring > 1}
    return tuple(c for c in CP_COMMS if c in measured) or ("p2p",)


def _comm_options(
    comms: tuple[CpComm, ...],
    request: RecommendRequest,
    shape: AttentionShape,
    ulysses: int,
    ring: int,
    kv_replication: int,
) -> list[tuple[str, int | None]]:
    """(cp_comm, heads_k_stride) pairs worth ranking on a mesh: p2p, and with a ring axis the
    all-gather with each requested stride that divides the KV heads a rank gathers (a stride
    equal to all of them is the unstrided gather, listed once)."""
    options: list[tuple[str, int | None]] = []
    if "p2p" in comms or ring == 1:
        options.append(("p2p", None))
    if ring == 1 or "all_gather" not in comms:
        return options
    per_rank = kv_replication * shape.kv_heads // ulysses
    strides: list[int | None] = []
    for stride in request.heads_k_strides:
        resolved = None if stride is None or stride == per_rank else stride
        if resolved is not None and per_rank % resolved:
            continue
        if resolved not in strides:
            strides.append(resolved)
    options.extend(("all_gather", s) for s in strides)
    return options


def _candidate_layouts(ring: int, mask: MaskSpec) -> tuple[str, ...]:
    """Layouts worth comparing on a ring: one without a ring or a causal mask (they cost the
    same); the global ones for causal attention over one sequence (a window included: the
    model finds that contiguous needs the fewest ring steps); all five with packed documents
    (doc_zigzag and balanced are built for them)."""
    if ring == 1 or not mask.causal:
        return ("contiguous",)
    if mask.documents is not None and len(mask.documents) > 1:
        return LAYOUTS
    return GLOBAL_LAYOUTS


def _evaluate(
    request: RecommendRequest,
    sizes: ParallelSizes,
    shape: AttentionShape,
    mask: MaskSpec,
    profile: HardwareProfile,
    per_node: int,
    measurements: Sequence[Measurement],
) -> tuple[list[RankedCandidate], list[Rejection]]:
    comms = requested_comms(request, measurements)
    ranked: list[RankedCandidate] = []
    mesh_rules: dict[tuple[int, int, str], list[str]] = {}
    memory: list[Rejection] = []
    for ulysses, ring in factorizations(sizes.cp):
        for layout in _candidate_layouts(ring, mask):
            feasibility = check_mesh(shape, ulysses, ring, layout)
            if not feasibility.ok:
                key = (ulysses, ring, feasibility.reason or "infeasible")
                label = layout if request.causal and ring > 1 else "any"
                mesh_rules.setdefault(key, []).append(label)
                continue
            options = _comm_options(
                comms, request, shape, ulysses, ring, feasibility.kv_replication
            )
            for cp_comm, stride in options:
                candidate = MeshCandidate.for_shape(
                    shape, ulysses=ulysses, ring=ring, layout=layout, dtype=request.dtype,
                    causal=mask.causal, phase=request.phase, documents=mask.documents,
                    window=mask.window, cp_comm=cp_comm, heads_k_stride=stride,
                )  # fmt: skip
                try:
                    with counting_budget():
                        prediction = predict(candidate, profile, per_node, rank_stride=sizes.tp)
                except CountingTooCostly as refused:
                    key = (ulysses, ring, refused.rule)
                    mesh_rules.setdefault(key, []).append(layout)
                    break  # the packing is the layout's, whatever the exchange
                rule = prediction.memory_rule()
                if rule is not None:
                    label = layout_label(prediction) + comm_label(prediction)
                    comm = prediction.candidate.cp_comm
                    memory.append(Rejection(ulysses, ring, (label,), rule, "memory", comm))
                    continue
                measured = matching_measurement(candidate, measurements)
                found = (measured.median_s, measured.record_id) if measured else (None, None)
                ranked.append(RankedCandidate(prediction, *found))
    ranked.sort(key=rank_key)
    rejected = [
        Rejection(u, r, tuple(layouts), rule, "mesh")
        for (u, r, rule), layouts in mesh_rules.items()
    ]
    return ranked, rejected + _merge_memory_rejections(memory)


def _merge_memory_rejections(rejections: Sequence[Rejection]) -> list[Rejection]:
    """One row per mesh: its layouts need the same memory (their longest sequences differ
    only by the layout's divisor); the row keeps the first layout's rule."""
    merged: dict[tuple[int, int, str], Rejection] = {}
    for r in rejections:
        key = (r.ulysses, r.ring, r.cp_comm)
        first = merged.get(key)
        merged[key] = r if first is None else replace(first, layouts=first.layouts + r.layouts)
    return list(merged.values())


def matching_measurement(
    candidate: MeshCandidate, measurements: Sequence[Measurement]
) -> Measurement | None:
    """The measurement of this configuration (R = 1 or no mask: any layout matches)."""
    layout_matters = candidate.causal and candidate.ring > 1
    for m in measurements:
        c = m.candidate
        if (
            c.shape == candidate.shape
            and (c.ulysses, c.ring) == (candidate.ulysses, candidate.ring)
            and (c.layout == candidate.layout or not layout_matters)
            and canonical_dtype(c.dtype) == canonical_dtype(candidate.dtype)
            and c.mask == candidate.mask
            and c.phase == candidate.phase
            and _comm_of(c) == _comm_of(candidate)
        ):
            return m
    return None


def _comm_of(candidate: MeshCandidate) -> tuple[str, int | None]:
    """How a candidate's ring axis exchanges K/V (p2p whenever R = 1)."""
    if candidate.ring == 1 or candidate.cp_comm == "p2p":
        return ("p2p", None)
    return (candidate.cp_comm, candidate.heads_k_stride)
