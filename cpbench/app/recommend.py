"""Application service of `cpbench recommend`, `cpbench calibrate` and `cpbench validate`.

`recommend` ranks every U x R factorisation of the CP degree and every layout with the cost
model (calibrated on measurements when results files are given; measured configurations are
ranked by their measurement), lists the rejected ones with the rule that rejects them, explains
the winner and prints the settings that reproduce it in Megatron-LM, DeepSpeed, yunchang and
torchtitan. `*_report` functions return JSON-serialisable dicts (the `--json` answers);
`render_*` functions turn them into rich renderables. The CLI is a thin wrapper around both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpbench.config.constraints import AttentionShape, check_mesh
from cpbench.config.vocabulary import LAYOUTS, PHASE_PASSES, YUNCHANG_RING_IMPL_TYPES, Phase
from cpbench.errors import CpbenchError
from cpbench.model.calibrate import (
    CalibrationResult,
    Measurement,
    calibrate,
    calibration_summary,
    default_prior_name,
    measurements_from_records,
)
from cpbench.model.cost import MeshCandidate, Prediction, check_phase, predict
from cpbench.model.flops import FLOPS_CONVENTION
from cpbench.model.formulas import canonical_dtype
from cpbench.model.hardware import GB, GIB, HardwareProfile, load_profile
from cpbench.results.store import read_records

DEFAULT_HARDWARE = "h100-sxm"
TIME_CONVENTION = (
    "times are per attention layer and micro-batch on the slowest rank; "
    "compute = kernel time at perfect balance; imbalance = extra time of the busiest rank per "
    "ring step; exposed comm = communication not hidden behind compute"
)


# ------------------------------------------------------------------------------ results IO


def load_results(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """Records of JSONL results files (cpbench.results.store: a torn last line is skipped, a
    malformed line elsewhere is a CpbenchError naming the file and line)."""
    return read_records([Path(p) for p in paths])


# -------------------------------------------------------------------------- parallel sizes


@dataclass(frozen=True)
class ParallelSizes:
    """Megatron's device dimensions: world = TP x CP x PP x DP, and the global batch."""

    world: int
    """GPUs in total."""
    tp: int
    """Tensor-parallel size."""
    cp: int
    """Context-parallel size (U x R)."""
    pp: int
    """Pipeline-parallel size."""
    dp: int
    """Data-parallel size: world / (TP x CP x PP)."""
    micro_batch: int
    """Sequences per micro-batch and data-parallel rank."""
    grad_accum: int
    """Micro-batches accumulated per optimizer step."""

    @property
    def global_batch(self) -> int:
        """micro_batch x grad_accum x DP sequences per optimizer step."""
        return self.micro_batch * self.grad_accum * self.dp

    def world_formula(self) -> str:
        """`world = TP x CP x PP x DP` with the numbers."""
        return f"world {self.world} = TP {self.tp} x CP {self.cp} x PP {self.pp} x DP {self.dp}"

    def batch_formula(self) -> str:
        """`global batch = micro_batch x grad_accum x DP` with the numbers."""
        return (
            f"global batch = micro_batch {self.micro_batch} x grad_accum {self.grad_accum} "
            f"x DP {self.dp} = {self.global_batch} sequence(s) per optimizer step"
        )


def solve_parallel_sizes(
    gpus: int,
    tp: int = 1,
    pp: int = 1,
    cp: int | None = None,
    micro_batch: int = 1,
    grad_accum: int = 1,
) -> ParallelSizes:
    """Solve world = TP x CP x PP x DP; CP defaults to gpus / (TP x PP) (DP = 1)."""
    for name, value in (
        ("gpus", gpus),
        ("tp", tp),
        ("pp", pp),
        ("micro batch", micro_batch),
        ("grad accum", grad_accum),
    ):
        _check_positive(name, value)
    if gpus % (tp * pp):
        raise CpbenchError(
            f"gpus ({gpus}) must be divisible by TP x PP = {tp} x {pp} = {tp * pp} "
            f"(world = TP x CP x PP x DP)"
        )
    if cp is None:
        cp = gpus // (tp * pp)
    _check_positive("cp", cp)
    model = tp * cp * pp
    if gpus % model:
        raise CpbenchError(
            f"gpus ({gpus}) must be divisible by TP x CP x PP = {tp} x {cp} x {pp} = {model} "
            f"(world = TP x CP x PP x DP)"
        )
    return ParallelSizes(gpus, tp, cp, pp, gpus // model, micro_batch, grad_accum)


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CpbenchError(f"{name} must be a positive integer, got {value!r}")


def divisors(n: int) -> list[int]:
    """Divisors of n, increasing."""
    return [d for d in range(1, n + 1) if n % d == 0]


# --------------------------------------------------------------------------------- request


@dataclass(frozen=True)
class RecommendRequest:
    """What `cpbench recommend` is asked."""

    heads: int
    """Query heads of the model."""
    kv_heads: int
    """KV heads of the model."""
    seq_len: int = 131072
    """Global sequence length."""
    head_dim: int = 128
    """Head dimension."""
    batch: int = 1
    """Micro-batch (sequences per step of one data-parallel rank)."""
    gpus: int = 8
    """GPUs in total."""
    gpus_per_node: int | None = None
    """Devices per node; None = the hardware profile's."""
    hardware: str | None = None
    """Profile name or TOML path; None = h100-sxm (cpu-local when all results are CPU runs)."""
    dtype: str = "bfloat16"
    """Activation dtype."""
    causal: bool = True
    """Causal mask."""
    tp: int = 1
    """Tensor-parallel size (splits the heads before CP)."""
    pp: int = 1
    """Pipeline-parallel size."""
    cp: int | None = None
    """Context-parallel size; None = gpus / (TP x PP)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (global batch formula)."""
    phase: Phase = "fwd+bwd"
    """Rank by the forward step, or forward+backward (training)."""
    results: tuple[str, ...] = ()
    """Results files: calibrate the profile on them, rank measured configurations by their
    measurement."""
    top: int = 10
    """Feasible candidates to list (0 = all)."""


@dataclass(frozen=True)
class RankedCandidate:
    """A feasible candidate with its prediction and, when measured, its measurement."""

    prediction: Prediction
    """The (calibrated) model's prediction."""
    measured_s: float | None = None
    """Measured step time (results record median) when this configuration was measured."""
    record_id: str | None = None
    """Id of the record measured."""

    @property
    def time_s(self) -> float:
        """What it is ranked by: the measurement when there is one, else the prediction."""
        return self.measured_s if self.measured_s is not None else self.prediction.step_s

    @property
    def source(self) -> str:
        """measured or model."""
        return "measured" if self.measured_s is not None else "model"

    @property
    def label(self) -> str:
        """`U x R layout`."""
        c = self.prediction.config
        return f"{c.ulysses}x{c.ring} {layout_label(self.prediction)}"


@dataclass(frozen=True)
class Rejection:
    """A candidate that cannot run, with the rule that rejects it."""

    ulysses: int
    """U."""
    ring: int
    """R."""
    layouts: tuple[str, ...]
    """Layouts the rule rejects."""
    rule: str
    """The rule with the numbers (check_mesh's reason, or the memory rule)."""
    kind: str
    """mesh or memory."""


@dataclass(frozen=True)
class FrameworkSetting:
    """How to run the winner (or the closest thing) in one framework."""

    framework: str
    """Megatron-LM, DeepSpeed, yunchang or torchtitan."""
    expressible: bool
    """Whether the framework can express the winning mesh and layout."""
    settings: str
    """Flags, config keys or code."""
    note: str
    """What to watch out for, or what the framework runs instead."""


@dataclass(frozen=True)
class Recommendation:
    """The answer of `recommend`."""

    request: RecommendRequest
    """The question."""
    profile: HardwareProfile
    """The profile used (calibrated when results were given)."""
    sizes: ParallelSizes
    """TP x CP x PP x DP."""
    shape: AttentionShape
    """The attention problem of one TP rank (heads / TP)."""
    gpus_per_node: int
    """Devices per node used for placement."""
    ranked: tuple[RankedCandidate, ...]
    """Feasible candidates, fastest first (all of them)."""
    rejected: tuple[Rejection, ...]
    """Infeasible candidates with their rules."""
    explanation: str
    """One paragraph on the winner."""
    frameworks: tuple[FrameworkSetting, ...]
    """Settings per framework."""
    calibration: CalibrationResult | None
    """The calibration done on the results, if any."""

    @property
    def winner(self) -> RankedCandidate | None:
        """The fastest feasible candidate."""
        return self.ranked[0] if self.ranked else None


def layout_label(prediction: Prediction) -> str:
    """The layout, or `any` when it cannot matter (R = 1, or no causal mask)."""
    if prediction.config.ring == 1 or not prediction.candidate.causal:
        return "any"
    return prediction.config.layout


# ------------------------------------------------------------------------------- recommend


def recommend(request: RecommendRequest) -> Recommendation:
    """Rank every U x R x layout candidate of the CP degree; see the module docstring."""
    _check_request(request)
    AttentionShape(
        request.seq_len, request.heads, request.kv_heads, request.head_dim, request.batch
    )
    sizes = solve_parallel_sizes(
        request.gpus, request.tp, request.pp, request.cp, request.batch, request.grad_accum
    )
    shape = _tp_shape(request)
    records = load_results(request.results) if request.results else []
    measurements = measurements_from_records(records)
    profile = _profile_for(request, measurements)
    calibration = None
    if measurements:
        calibration = calibrate(measurements, profile, files=request.results)
        profile = calibration.profile
    per_node = request.gpus_per_node or profile.devices_per_node
    _check_nodes(request.gpus, per_node)
    ranked, rejected = _evaluate(request, sizes, shape, profile, per_node, measurements)
    frameworks = framework_settings(ranked, sizes) if ranked else ()
    return Recommendation(
        request=request,
        profile=profile,
        sizes=sizes,
        shape=shape,
        gpus_per_node=per_node,
        ranked=tuple(ranked),
        rejected=tuple(rejected),
        explanation=explain(ranked, profile) if ranked else _no_winner(rejected),
        frameworks=frameworks,
        calibration=calibration,
    )


def _check_request(request: RecommendRequest) -> None:
    check_phase(request.phase)
    if request.top < 0:
        raise CpbenchError(f"top must be >= 0 (0 lists all), got {request.top}")
    if request.gpus_per_node is not None:
        _check_positive("gpus per node", request.gpus_per_node)
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
    return AttentionShape(
        request.seq_len,
        request.heads // tp,
        request.kv_heads // tp,
        request.head_dim,
        request.batch,
    )


def _profile_for(request: RecommendRequest, measurements: Sequence[Measurement]) -> HardwareProfile:
    if request.hardware:
        return load_profile(request.hardware)
    if measurements:
        return load_profile(default_prior_name(measurements))
    return load_profile(DEFAULT_HARDWARE)


def _candidate_layouts(ring: int, causal: bool) -> tuple[str, ...]:
    """Layouts worth comparing: all with a causal ring; one otherwise (they cost the same)."""
    return LAYOUTS if causal and ring > 1 else ("contiguous",)


def _evaluate(
    request: RecommendRequest,
    sizes: ParallelSizes,
    shape: AttentionShape,
    profile: HardwareProfile,
    per_node: int,
    measurements: Sequence[Measurement],
) -> tuple[list[RankedCandidate], list[Rejection]]:
    ranked: list[RankedCandidate] = []
    mesh_rules: dict[tuple[int, int, str], list[str]] = {}
    memory: list[Rejection] = []
    for ulysses in divisors(sizes.cp):
        ring = sizes.cp // ulysses
        for layout in _candidate_layouts(ring, request.causal):
            feasibility = check_mesh(shape, ulysses, ring, layout)
            if not feasibility.ok:
                key = (ulysses, ring, feasibility.reason or "infeasible")
                label = layout if request.causal and ring > 1 else "any"
                mesh_rules.setdefault(key, []).append(label)
                continue
            candidate = MeshCandidate(
                shape, ulysses, ring, layout, request.dtype, request.causal, None, request.phase
            )
            prediction = predict(candidate, profile, per_node, rank_stride=sizes.tp)
            rule = prediction.memory_rule()
            if rule is not None:
                memory.append(Rejection(ulysses, ring, (layout_label(prediction),), rule, "memory"))
                continue
            measured = _matching_measurement(candidate, measurements)
            ranked.append(
                RankedCandidate(
                    prediction,
                    measured.median_s if measured else None,
                    measured.record_id if measured else None,
                )
            )
    ranked.sort(key=_rank_key)
    rejected = [
        Rejection(u, r, tuple(layouts), rule, "mesh")
        for (u, r, rule), layouts in mesh_rules.items()
    ]
    return ranked, rejected + _merge_memory_rejections(memory)


def _merge_memory_rejections(rejections: Sequence[Rejection]) -> list[Rejection]:
    """One row per mesh: its layouts need the same memory (their longest sequences differ
    only by the layout's divisor); the row keeps the first layout's rule."""
    merged: dict[tuple[int, int], Rejection] = {}
    for r in rejections:
        key = (r.ulysses, r.ring)
        first = merged.get(key)
        merged[key] = (
            r
            if first is None
            else Rejection(r.ulysses, r.ring, first.layouts + r.layouts, first.rule, r.kind)
        )
    return list(merged.values())


LAYOUT_PREFERENCE = {"zigzag": 0, "striped": 1, "contiguous": 2}
"""Among equal times prefer zigzag: every framework that load-balances uses it."""


def _rank_key(r: RankedCandidate) -> tuple[float, int, int, int]:
    """Time (to 4 significant digits, so float noise cannot reorder ties), then layout
    preference, memory, and the larger Ulysses degree."""
    p = r.prediction
    return (
        float(f"{r.time_s:.4g}"),
        LAYOUT_PREFERENCE[p.config.layout],
        p.memory_bytes,
        -p.config.ulysses,
    )


def _matching_measurement(
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
            and c.causal == candidate.causal
            and c.phase == candidate.phase
        ):
            return m
    return None


# ------------------------------------------------------------------------------- explain


def _gb(value: float) -> str:
    return f"{value / GB:.2f} GB"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def explain(ranked: Sequence[RankedCandidate], profile: HardwareProfile) -> str:
    """One paragraph: why the winner wins (comm per tier, imbalance, memory, margin)."""
    best = ranked[0]
    p = best.prediction
    c, t = p.config, p.phase_time
    parts = [
        f"{best.label} is {'measured' if best.measured_s is not None else 'predicted'} fastest "
        f"at {_ms(best.time_s)} per layer ({p.candidate.phase})"
    ]
    mesh = (c.ulysses, c.ring)
    others = [
        r for r in ranked[1:] if (r.prediction.config.ulysses, r.prediction.config.ring) != mesh
    ]
    ties = [r for r in ranked[1:] if r not in others and _rank_key(r)[0] == _rank_key(best)[0]]
    if others:
        second = others[0]
        margin = second.time_s / best.time_s - 1
        parts[0] += f", {margin:.1%} ahead of the next mesh, {second.label} ({_ms(second.time_s)})"
    else:
        parts[0] += ", the only feasible mesh"
    if ties:
        tied = ", ".join(layout_label(r.prediction) for r in ties)
        parts[0] += f" ({tied} on the same mesh ties; zigzag is preferred: frameworks support it)"
    parts[0] += "."
    parts.append(_placement_sentence(p, profile))
    parts.append(
        f"Of {_ms(t.comm_s)} of communication, {_ms(t.exposed_comm_s)} stays exposed "
        f"(all-to-all is never overlapped; ring hops hide behind the kernels when a step's "
        f"compute is longer than its hop)."
    )
    parts.append(_balance_sentence(p))
    parts.append(
        f"The kernel works on L/R = {p.kernel_seq_len} tokens at {p.attention_tflops:.1f} TFLOP/s "
        f"per rank; {c.heads_per_rank} query head(s) and {c.kv_heads_per_rank} KV head(s) per rank "
        f"after the all-to-all"
        + (f" (KV heads replicated x{c.kv_replication})." if c.kv_replication > 1 else ".")
    )
    parts.append(
        f"It needs {p.memory_bytes / GIB:.2f} GiB per rank of {p.memory_capacity_bytes / GIB:.1f} "
        f"GiB (attention layer lower bound); the longest sequence that fits this mesh is "
        f"{p.max_seq_len} tokens."
    )
    return " ".join(parts)


def _placement_sentence(p: Prediction, profile: HardwareProfile) -> str:
    traffic = []
    for item in p.traffic:
        link = profile.link(item.tier)
        kind = "all-to-all" if item.kind == "all_to_all" else "ring send/recv"
        traffic.append(f"{_gb(item.total_bytes)} of {kind} on {link.name}")
    sent = "; per rank and layer it sends " + ", ".join(traffic) if traffic else ""
    return f"Placement: {p.placement.describe()}{sent}."


def _balance_sentence(p: Prediction) -> str:
    c = p.config
    if not p.candidate.causal:
        return "Without a causal mask every rank does the same work."
    if c.ring == 1:
        return (
            "No causal imbalance: after the all-to-all every rank holds the whole sequence "
            "for its share of the heads."
        )
    if p.work_imbalance <= 1.01:
        return (
            f"The {c.layout} layout balances the causal work (slowest / mean rank "
            f"{p.work_imbalance:.2f})."
        )
    return (
        f"The {c.layout} layout leaves causal imbalance (slowest / mean rank "
        f"{p.work_imbalance:.2f}, {_ms(p.phase_time.imbalance_s)} per step)."
    )


def _no_winner(rejected: Sequence[Rejection]) -> str:
    return (
        f"No candidate is feasible: all {len(rejected)} are rejected; see the rules above "
        f"(change the CP degree, the sequence length, or the hardware)."
    )


# ---------------------------------------------------------------------------- frameworks


def framework_settings(
    ranked: Sequence[RankedCandidate], sizes: ParallelSizes
) -> tuple[FrameworkSetting, ...]:
    """Settings for the winner in Megatron-LM, DeepSpeed, yunchang and torchtitan."""
    best = ranked[0].prediction
    if sizes.cp == 1:
        none = "CP = 1: no context parallelism; nothing to set"
        return tuple(
            FrameworkSetting(name, True, "-", none)
            for name in ("Megatron-LM", "DeepSpeed", "yunchang", "torchtitan")
        )
    return (
        megatron_setting(best, sizes),
        deepspeed_setting(best, ranked),
        yunchang_setting(best, sizes),
        torchtitan_setting(best, ranked),
    )


def cp_comm_type(ulysses: int, ring: int) -> str:
    """Megatron's --cp-comm-type for a mesh: p2p (ring), a2a (Ulysses) or a2a+p2p (USP)."""
    if ulysses == 1:
        return "p2p"
    return "a2a" if ring == 1 else "a2a+p2p"


def megatron_setting(p: Prediction, sizes: ParallelSizes) -> FrameworkSetting:
    """--context-parallel-size, --cp-comm-type and, for a2a+p2p, the hierarchical sizes."""
    c = p.config
    comm = cp_comm_type(c.ulysses, c.ring)
    flags = [
        f"--tensor-model-parallel-size {sizes.tp}",
        f"--pipeline-model-parallel-size {sizes.pp}",
        f"--context-parallel-size {sizes.cp}",
        f"--cp-comm-type {comm}",
    ]
    if comm == "a2a+p2p":
        flags.append(f"--hierarchical-context-parallel-sizes {c.ulysses} {c.ring}")
    notes = [
        "Megatron (Transformer Engine) always splits the sequence into 2 x CP chunks "
        "(zigzag-style load balancing)"
    ]
    if c.ring > 1 and p.candidate.causal and c.layout != "zigzag":
        notes.append(f"it cannot run the {c.layout} layout: expect its zigzag equivalent")
    if c.kv_replication > 1:
        notes.append(
            f"the all-to-all needs KV heads replicated x{c.kv_replication}; check that your "
            f"Transformer Engine version accepts kv heads < the a2a size"
        )
    return FrameworkSetting("Megatron-LM", True, " ".join(flags), "; ".join(notes) + ".")


def deepspeed_setting(p: Prediction, ranked: Sequence[RankedCandidate]) -> FrameworkSetting:
    """--ds-sequence-parallel-size: Ulysses only."""
    c = p.config
    if c.ring == 1 and c.ulysses > 1:
        note = "DeepSpeed-Ulysses (all-to-all over the sequence-parallel group)."
        if c.kv_replication > 1:
            note += (
                f" KV heads ({c.shape.kv_heads}) < sequence-parallel size ({c.ulysses}): "
                f"needs a DeepSpeed version that replicates KV heads for GQA."
            )
        return FrameworkSetting("DeepSpeed", True, f"--ds-sequence-parallel-size {c.ulysses}", note)
    alternative = next(
        (r for r in ranked if r.prediction.config.ring == 1 and r.prediction.config.ulysses > 1),
        None,
    )
    reason = (
        f"DeepSpeed-Ulysses cannot express a ring (R = {c.ring}): it only does all-to-all "
        f"sequence parallelism."
    )
    if alternative is None:
        return FrameworkSetting(
            "DeepSpeed", False, "-", reason + " No Ulysses-only mesh is feasible."
        )
    u = alternative.prediction.config.ulysses
    position = ranked.index(alternative) + 1
    return FrameworkSetting(
        "DeepSpeed",
        False,
        f"--ds-sequence-parallel-size {u}",
        f"{reason} Closest: Ulysses {u}x1 (rank {position}, {_ms(alternative.time_s)}).",
    )


def yunchang_setting(p: Prediction, sizes: ParallelSizes) -> FrameworkSetting:
    """set_seq_parallel_pg(U, R, rank, world_size) and the ring implementation of the layout."""
    c = p.config
    impl = YUNCHANG_RING_IMPL_TYPES[c.layout if c.ring > 1 else "contiguous"]
    code = (
        f"set_seq_parallel_pg({c.ulysses}, {c.ring}, rank, world_size={sizes.world}); "
        f'LongContextAttention(ring_impl_type="{impl}")'
    )
    note = (
        "Ulysses groups are the low (consecutive) ranks (use_ulysses_low=True), as modelled; "
        f"shard the inputs with the matching extract function (EXTRACT_FUNC_DICT['{impl}'])."
    )
    return FrameworkSetting("yunchang", True, code, note)


def torchtitan_setting(p: Prediction, ranked: Sequence[RankedCandidate]) -> FrameworkSetting:
    """context_parallel_degree and rotate method; ring-only with head-tail load balancing."""
    c = p.config
    base = (
        "torchtitan's context parallelism is ring-only with head-tail load balancing (the "
        "zigzag layout); rotate_method alltoall passes K/V shards around the ring like the "
        "modelled ring, allgather (the default) gathers all K/V first"
    )
    settings = (
        f"--parallelism.context_parallel_degree {c.world} "
        f"--parallelism.context_parallel_rotate_method alltoall"
    )
    if c.ulysses == 1:
        return FrameworkSetting("torchtitan", True, settings, base + ".")
    ring_alternative = next(
        (
            r
            for r in ranked
            if r.prediction.config.ulysses == 1
            and r.prediction.config.layout in ("zigzag", "contiguous")
            and (r.prediction.config.layout == "zigzag" or not r.prediction.candidate.causal)
        ),
        None,
    )
    closest = (
        f" Closest: ring 1x{c.world} zigzag (rank {ranked.index(ring_alternative) + 1}, "
        f"{_ms(ring_alternative.time_s)})."
        if ring_alternative is not None
        else " No ring-only mesh is feasible."
    )
    return FrameworkSetting(
        "torchtitan",
        False,
        settings,
        f"{base}; it cannot express Ulysses (U = {c.ulysses}).{closest}",
    )


# ---------------------------------------------------------------------------- JSON report


def _candidate_dict(position: int, r: RankedCandidate) -> dict[str, Any]:
    p = r.prediction
    c = p.config
    t = p.phase_time
    return {
        "rank": position,
        "ulysses": c.ulysses,
        "ring": c.ring,
        "layout": c.layout,
        "layout_matters": layout_label(p) != "any",
        "kv_replication": c.kv_replication,
        "scheme": c.scheme,
        "source": r.source,
        "record_id": r.record_id,
        "time_s": r.time_s,
        "measured_s": r.measured_s,
        "predicted_s": p.step_s,
        "compute_s": t.compute_s,
        "imbalance_s": t.imbalance_s,
        "exposed_comm_s": t.exposed_comm_s,
        "comm_s": t.comm_s,
        "forward_s": p.forward.total_s,
        "forward_backward_s": p.forward_backward.total_s,
        "bytes_per_tier": p.bytes_by_tier(PHASE_PASSES[p.candidate.phase]),
        "traffic": [
            {
                "tier": x.tier,
                "kind": x.kind,
                "forward_bytes": x.forward_bytes,
                "backward_bytes": x.backward_bytes,
            }
            for x in p.traffic
        ],
        "placement": p.placement.describe(),
        "ulysses_tier": p.placement.ulysses_tier,
        "ring_tier": p.placement.ring_tier,
        "work_imbalance": p.work_imbalance,
        "kernel_seq_len": p.kernel_seq_len,
        "attention_tflops_per_rank": p.attention_tflops,
        "memory_bytes": p.memory_bytes,
        "memory_capacity_bytes": p.memory_capacity_bytes,
        "max_seq_len": p.max_seq_len,
    }


def recommendation_report(rec: Recommendation) -> dict[str, Any]:
    """The `--json` answer of `recommend`."""
    q, s = rec.request, rec.sizes
    listed = rec.ranked if q.top == 0 else rec.ranked[: q.top]
    return {
        "inputs": {
            "heads": q.heads,
            "kv_heads": q.kv_heads,
            "seq_len": q.seq_len,
            "head_dim": q.head_dim,
            "batch": q.batch,
            "gpus": q.gpus,
            "gpus_per_node": rec.gpus_per_node,
            "hardware": rec.profile.name,
            "dtype": canonical_dtype(q.dtype),
            "causal": q.causal,
            "phase": q.phase,
            "results": list(q.results),
        },
        "parallel": {
            "world": s.world,
            "tp": s.tp,
            "cp": s.cp,
            "pp": s.pp,
            "dp": s.dp,
            "micro_batch": s.micro_batch,
            "grad_accum": s.grad_accum,
            "global_batch": s.global_batch,
            "world_formula": s.world_formula(),
            "global_batch_formula": s.batch_formula(),
            "attention_heads_per_tp_rank": rec.shape.heads,
            "kv_heads_per_tp_rank": rec.shape.kv_heads,
        },
        "conventions": {"time": TIME_CONVENTION, "flops": FLOPS_CONVENTION},
        "feasible": len(rec.ranked),
        "candidates": [_candidate_dict(i + 1, r) for i, r in enumerate(listed)],
        "rejected": [
            {
                "ulysses": x.ulysses,
                "ring": x.ring,
                "layouts": list(x.layouts),
                "kind": x.kind,
                "rule": x.rule,
            }
            for x in rec.rejected
        ],
        "winner": _candidate_dict(1, rec.winner) if rec.winner else None,
        "explanation": rec.explanation,
        "frameworks": [
            {
                "framework": f.framework,
                "expressible": f.expressible,
                "settings": f.settings,
                "note": f.note,
            }
            for f in rec.frameworks
        ],
        "calibration": calibration_summary(rec.calibration) if rec.calibration else None,
    }
