"""Application service of `cpbench plan`: does a whole model fit at a sequence length on the
GPUs given, with which TP x CP (U x R, layout) x PP x DP and recomputation, and how long does a
training step take.

`plan` enumerates every world = TP x CP x PP x DP of the GPUs (TP inside a node, dividing the
heads and KV heads; PP dividing the layers; DP x micro-batch dividing the global batch), every
U x R mesh of CP with its fastest layout (`cpbench.model.cost.prediction.predict`), and every
recompute level; it keeps the plans whose busiest rank fits the device memory
(`cpbench.model.plan.memory`) ranked by predicted step time (`cpbench.model.plan.step`), and
rejects the rest with the rule or the overflowing component. For each plan it finds the longest
sequence that fits (bisection over L), and the shortest CP that fits at all; for the winner the
Megatron-LM, torchtitan and DeepSpeed settings. `to_json` is the `--json` answer and what
`cpbench.render.plan` renders.

`recommend` answers another question (which U x R mesh for one attention layer at a given CP
degree) and takes heads, not a model; `plan` reuses its attention model for the attention part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cpbench.app.recommend.frameworks import cp_comm_type
from cpbench.app.recommend.types import FrameworkSetting
from cpbench.config.bench import factorizations
from cpbench.config.constraints import AttentionShape, check_mesh, seq_divisor
from cpbench.config.problem import MeshCandidate, check_positive_int
from cpbench.config.vocabulary import canonical_dtype
from cpbench.errors import CpbenchError
from cpbench.model.cost.prediction import Prediction, predict
from cpbench.model.hardware.loading import load_profile
from cpbench.model.hardware.profile import HardwareProfile
from cpbench.model.plan.memory import (
    RECOMPUTES,
    Parallelism,
    Recompute,
    StageMemory,
    attention_buffer_bytes,
    check_recompute,
    check_zero,
    peak_stage,
    plan_memory,
)
from cpbench.model.plan.step import (
    MFU_CONVENTION,
    TIME_CONVENTION,
    MatmulEfficiency,
    StepTime,
    matmul_efficiency,
    step_time,
)
from cpbench.model.plan.transformer import ModelSpec, load_model
from cpbench.units import GIB

DEFAULT_HARDWARE = "h100-sxm"
CUDA_RESERVE_GIB = 2.0
"""Default runtime reserve on a GPU: CUDA context, NCCL buffers, allocator fragmentation
(estimate)."""
MAX_SEQ_LEN = 2**40
"""Bisection ceiling of the longest sequence."""
PLAN_LAYOUTS: tuple[str, ...] = ("zigzag", "striped", "contiguous")
"""Ring layouts a plan compares (one causal sequence per sample), in order of preference among
equal attention times: zigzag first (Megatron and torchtitan run it)."""


@dataclass(frozen=True)
class PlanRequest:
    """What `cpbench plan` is asked."""

    model: str
    """Preset name, model TOML or Hugging Face config.json."""
    seq_len: int
    """L: tokens per sequence."""
    gpus: int
    """GPUs in total."""
    gpus_per_node: int | None = None
    """GPUs per node; None = the profile's."""
    hardware: str | None = None
    """Profile name or TOML path; None = h100-sxm."""
    recompute: Recompute | None = None
    """One recompute level; None = search none and full (and selective where the attention
    kernel materialises the scores)."""
    zero: int = 1
    """ZeRO stage over DP x CP (1 = Megatron's distributed optimizer)."""
    micro_batch: int = 1
    """Sequences per micro-batch."""
    global_batch: int | None = None
    """Sequences per optimizer step; None = one per GPU."""
    dtype: str = "bfloat16"
    """Weights and activations dtype (peak FLOP/s, activation bytes)."""
    kernel: str = "auto"
    """Attention kernel (cpbench's kernel names)."""
    tp: int | None = None
    """Only this TP (None = search)."""
    cp: int | None = None
    """Only this CP."""
    pp: int | None = None
    """Only this PP."""
    matmul_efficiency: float | None = None
    """GEMM efficiency override."""
    reserve_gib: float | None = None
    """Runtime reserve per GPU; None = 2 GiB on a GPU, 0 on CPU."""


@dataclass(frozen=True)
class Plan:
    """A feasible plan: layout, attention prediction, memory and step time."""

    par: Parallelism
    """TP x CP x PP x DP, recompute, ZeRO."""
    attention: Prediction
    """One layer's attention for one micro-batch."""
    stages: tuple[StageMemory, ...]
    """Memory of the stages that can set the peak."""
    time: StepTime
    """Step time by part."""
    max_seq_len: int
    """Longest L (a multiple of the mesh's divisor) this plan holds in memory."""

    @property
    def peak(self) -> StageMemory:
        """The stage of the largest total."""
        return peak_stage(self.stages)


@dataclass(frozen=True)
class PlanRejection:
    """A plan that cannot run, with the rule or the overflowing component."""

    label: str
    """`TP t CP UxR PP p DP d` (or the part of it the rule is about), with the recompute."""
    kind: str
    """tp, pp, batch, mesh or memory."""
    rule: str
    """The rule with the numbers."""
    total_bytes: float | None = None
    """Peak bytes per rank (memory rejections)."""
    max_seq_len: int | None = None
    """Longest L it would hold (memory rejections)."""


@dataclass(frozen=True)
class PlanResult:
    """The answer of `plan`."""

    request: PlanRequest
    """The question."""
    model: ModelSpec
    """The model."""
    profile: HardwareProfile
    """The hardware profile."""
    gpus_per_node: int
    """GPUs per node used."""
    global_batch: int
    """Sequences per optimizer step."""
    efficiency: MatmulEfficiency
    """GEMM efficiency used."""
    reserve_bytes: float
    """Runtime reserve per GPU."""
    feasible: tuple[Plan, ...]
    """Plans that fit, fastest first."""
    rejected: tuple[PlanRejection, ...]
    """Plans that do not."""
    frameworks: tuple[FrameworkSetting, ...]
    """Settings of the winner."""
    notes: tuple[str, ...]
    """What the user should know about the answer."""

    @property
    def winner(self) -> Plan | None:
        """The fastest feasible plan."""
        return self.feasible[0] if self.feasible else None

    @property
    def shortest_cp(self) -> Plan | None:
        """The fastest plan of the smallest CP degree that fits."""
        if not self.feasible:
            return None
        smallest = min(p.par.cp for p in self.feasible)
        return next(p for p in self.feasible if p.par.cp == smallest)


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _check(request: PlanRequest) -> None:
    check_positive_int("seq_len", request.seq_len)
    check_positive_int("gpus", request.gpus)
    check_positive_int("micro batch", request.micro_batch)
    for name, value in (("gpus per node", request.gpus_per_node),
                        ("global batch", request.global_batch),
                        ("tp", request.tp), ("cp", request.cp), ("pp", request.pp)):
        if value is not None:
            check_positive_int(name, value)
    if request.recompute is not None:
        check_recompute(request.recompute)
    check_zero(request.zero)
    canonical_dtype(request.dtype)
    if request.reserve_gib is not None and request.reserve_gib < 0:
        raise CpbenchError(f"reserve must be >= 0 GiB, got {request.reserve_gib}")


class _Search:
    """The state of one search: inputs and the attention cache."""

    def __init__(self, request: PlanRequest, model: ModelSpec, profile: HardwareProfile,
                 per_node: int, global_batch: int, efficiency: MatmulEfficiency,
                 reserve: float) -> None:
        self.request, self.model, self.profile = request, model, profile
        self.per_node, self.global_batch = per_node, global_batch
        self.efficiency, self.reserve = efficiency, reserve
        self.capacity = profile.memory_bytes
        family = profile.kernel_for(request.kernel, request.dtype)
        self.scores_materialised = family == "einsum"
        self._attention: dict[tuple[int, int, int], tuple[Prediction, int] | str] = {}

    def shape(self, tp: int, seq_len: int) -> AttentionShape:
        m = self.model
        return AttentionShape(seq_len, m.heads // tp, m.kv_heads // tp, m.head_dim,
                              self.request.micro_batch)

    def attention(self, tp: int, ulysses: int, ring: int) -> tuple[Prediction, int] | str:
        """The fastest layout's prediction and attention buffer bytes, or the mesh rule."""
        key = (tp, ulysses, ring)
        if key not in self._attention:
            self._attention[key] = self._best_layout(tp, ulysses, ring)
        return self._attention[key]

    def _best_layout(self, tp: int, ulysses: int, ring: int) -> tuple[Prediction, int] | str:
        shape = self.shape(tp, self.request.seq_len)
        layouts = PLAN_LAYOUTS if ring > 1 else PLAN_LAYOUTS[:1]
        best: tuple[tuple[float, int], Prediction] | None = None
        reason = ""
        for layout in layouts:
            feasibility = check_mesh(shape, ulysses, ring, layout)
            if not feasibility.ok:
                reason = reason or (feasibility.reason or "infeasible")
                continue
            candidate = MeshCandidate.for_shape(
                shape, ulysses=ulysses, ring=ring, layout=layout, dtype=self.request.dtype,
                kernel=self.request.kernel,
            )
            prediction = predict(candidate, self.profile, self.per_node, rank_stride=tp)
            key = (float(f"{prediction.step_s:.4g}"), PLAN_LAYOUTS.index(layout))
            if best is None or key < best[0]:
                best = (key, prediction)
        if best is None:
            return reason
        return best[1], attention_buffer_bytes(best[1].candidate)

    def memory(self, par: Parallelism, seq_len: int, buffers_per_token: float
               ) -> tuple[StageMemory, ...]:
        return plan_memory(self.model, par, seq_len, buffers_per_token * seq_len,
                           self.request.dtype, self.scores_materialised, self.reserve)

    def max_seq_len(self, par: Parallelism, buffers_per_token: float) -> int:
        """Longest L, a multiple of the mesh's divisor, whose peak fits (bisection)."""
        q = seq_divisor(par.ulysses, par.ring, par.layout)

        def fits(k: int) -> bool:
            return peak_stage(self.memory(par, k * q, buffers_per_token)).total <= self.capacity

        if not fits(1):
            return 0
        lo, hi = 1, 2
        while fits(hi) and hi * q < MAX_SEQ_LEN:
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo * q


def _recomputes(request: PlanRequest, scores_materialised: bool) -> tuple[Recompute, ...]:
    if request.recompute is not None:
        return (request.recompute,)
    return RECOMPUTES if scores_materialised else ("none", "full")


def plan(request: PlanRequest) -> PlanResult:
    """Search every plan; see the module docstring."""
    _check(request)
    model = load_model(request.model)
    profile = load_profile(request.hardware or DEFAULT_HARDWARE)
    per_node = request.gpus_per_node or profile.devices_per_node
    if request.gpus > per_node and request.gpus % per_node:
        raise CpbenchError(
            f"gpus ({request.gpus}) must be a multiple of gpus per node ({per_node}) when they "
            f"span nodes"
        )
    global_batch = request.global_batch or request.gpus
    efficiency = matmul_efficiency(profile, request.matmul_efficiency)
    reserve = (
        request.reserve_gib * GIB if request.reserve_gib is not None
        else (CUDA_RESERVE_GIB * GIB if profile.device_kind == "cuda" else 0.0)
    )
    search = _Search(request, model, profile, per_node, global_batch, efficiency, reserve)
    feasible: list[Plan] = []
    rejected: list[PlanRejection] = []
    for tp in _divisors(request.gpus):
        if request.tp is not None and tp != request.tp:
            continue
        rule = _tp_rule(model, tp, per_node)
        if rule:
            rejected.append(PlanRejection(f"TP {tp}", "tp", rule))
            continue
        for cp in _divisors(request.gpus // tp):
            if request.cp is not None and cp != request.cp:
                continue
            for pp in _divisors(request.gpus // (tp * cp)):
                if request.pp is not None and pp != request.pp:
                    continue
                _evaluate(search, tp, cp, pp, feasible, rejected)
    feasible.sort(key=lambda p: (float(f"{p.time.total_s:.4g}"), p.peak.total))
    notes = _notes(search, model)
    frameworks = framework_settings(feasible[0], model, request, global_batch) if feasible else ()
    return PlanResult(request, model, profile, per_node, global_batch, efficiency, reserve,
                      tuple(feasible), tuple(rejected), frameworks, notes)


def _tp_rule(model: ModelSpec, tp: int, per_node: int) -> str | None:
    if tp > per_node or per_node % tp:
        return (f"TP {tp} must divide the {per_node} GPUs of a node: tensor parallelism stays "
                f"inside a node (its collectives run on every layer)")
    if model.heads % tp or model.kv_heads % tp:
        return (f"TP {tp} must divide heads ({model.heads}) and KV heads ({model.kv_heads}): "
                f"each TP rank gets heads / TP of each")
    return None


def _evaluate(search: _Search, tp: int, cp: int, pp: int, feasible: list[Plan],
              rejected: list[PlanRejection]) -> None:
    request, model = search.request, search.model
    dp = request.gpus // (tp * cp * pp)
    label = f"TP {tp} CP {cp} PP {pp} DP {dp}"
    if model.layers % pp:
        rejected.append(PlanRejection(
            label, "pp", f"PP {pp} must divide the {model.layers} layers (layers / PP per stage)"
        ))
        return
    per_step = dp * request.micro_batch
    if search.global_batch % per_step:
        rejected.append(PlanRejection(
            label, "batch",
            f"global batch ({search.global_batch}) must be a multiple of DP {dp} x micro-batch "
            f"{request.micro_batch} = {per_step}",
        ))
        return
    micro_batches = search.global_batch // per_step
    for ulysses, ring in factorizations(cp):
        mesh_label = f"TP {tp} CP {ulysses}x{ring} PP {pp} DP {dp}"
        found = search.attention(tp, ulysses, ring)
        if isinstance(found, str):
            rejected.append(PlanRejection(mesh_label, "mesh", found))
            continue
        prediction, buffers = found
        per_token = buffers / request.seq_len
        for recompute in _recomputes(request, search.scores_materialised):
            par = Parallelism(tp, ulysses, ring, pp, dp, request.micro_batch, micro_batches,
                              recompute, request.zero, prediction.candidate.layout)
            stages = search.memory(par, request.seq_len, per_token)
            peak = peak_stage(stages)
            longest = search.max_seq_len(par, per_token)
            if peak.total > search.capacity:
                big = peak.largest
                stage = "" if peak.stage == "only" else f" on the {peak.stage} pipeline stage"
                rejected.append(PlanRejection(
                    f"{mesh_label} {recompute}", "memory",
                    f"{big.name} {big.bytes / GIB:.1f} GiB of {search.capacity / GIB:.1f} GiB "
                    f"(total {peak.total / GIB:.1f} GiB{stage}) at CP {cp} with {recompute} "
                    f"recompute; it holds L <= {longest}",
                    peak.total, longest,
                ))
                continue
            time = step_time(model, par, request.seq_len, prediction, search.profile,
                             search.per_node, request.dtype, search.efficiency)
            feasible.append(Plan(par, prediction, stages, time, longest))


def _notes(search: _Search, model: ModelSpec) -> tuple[str, ...]:
    notes = [model.describe() + f" ({model.source})"]
    if search.request.recompute is None and not search.scores_materialised:
        notes.append(
            "selective recompute (Korthikanti et al.'s: the core attention) is not searched: the "
            "fused attention kernel stores no scores, so it keeps what 'none' keeps and only "
            "adds an attention forward"
        )
    notes.append(f"matmul efficiency {search.efficiency.value:.2f}: {search.efficiency.source}")
    return tuple(notes)


# --------------------------------------------------------------------------- frameworks


def _recompute_flags(recompute: str) -> str:
    if recompute == "full":
        return " --recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
    if recompute == "selective":
        return " --recompute-granularity selective"
    return ""


def framework_settings(best: Plan, model: ModelSpec, request: PlanRequest,
                       global_batch: int) -> tuple[FrameworkSetting, ...]:
    """Megatron-LM, torchtitan and DeepSpeed settings of a plan."""
    p = best.par
    comm = cp_comm_type(p.ulysses, p.ring)
    flags = f"--tensor-model-parallel-size {p.tp}"
    if p.tp > 1:
        flags += " --sequence-parallel"
    flags += f" --context-parallel-size {p.cp}"
    if p.cp > 1:
        flags += f" --cp-comm-type {comm}"
        if comm == "a2a+p2p":
            flags += f" --hierarchical-context-parallel-sizes {p.ulysses} {p.ring}"
    flags += (
        f" --pipeline-model-parallel-size {p.pp} --micro-batch-size {p.micro_batch}"
        f" --global-batch-size {global_batch} --seq-length {request.seq_len}"
    )
    flags += _recompute_flags(p.recompute)
    notes = ["Megatron (Transformer Engine) splits the sequence into 2 x CP chunks (zigzag)"]
    if p.zero == 1:
        flags += " --use-distributed-optimizer"
    elif p.zero == 3:
        flags += " --use-torch-fsdp2"
        notes.append("ZeRO-3 is Megatron's FSDP path (--use-torch-fsdp2)")
    elif p.zero == 2:
        flags += " --use-distributed-optimizer"
        notes.append("Megatron has no ZeRO-2: the distributed optimizer shards the optimizer "
                     "states only (ZeRO-1), so gradients take more memory than planned")
    flags += " --bf16" if canonical_dtype(request.dtype) == "bfloat16" else ""
    megatron = FrameworkSetting("Megatron-LM", True, flags, "; ".join(notes) + ".")

    titan_ok = p.ulysses == 1
    ac = {"none": "none", "selective": "selective", "full": "full"}[p.recompute]
    titan = (
        f"--parallelism.tensor_parallel_degree {p.tp} "
        f"--parallelism.context_parallel_degree {p.cp} "
        f"--parallelism.pipeline_parallel_degree {p.pp} "
        f"--parallelism.data_parallel_shard_degree {p.dp} "
        f"--activation_checkpoint.mode {ac} --training.seq_len {request.seq_len} "
        f"--training.local_batch_size {p.micro_batch}"
    )
    titan_note = ("torchtitan's CP is ring-only with head-tail (zigzag) load balancing; FSDP2 "
                  "shards weights, gradients and optimizer states (ZeRO-3) over DP x CP")
    if not titan_ok:
        titan_note += f"; it cannot express Ulysses (U = {p.ulysses}): run ring 1x{p.cp}"
    torchtitan = FrameworkSetting("torchtitan", titan_ok, titan, titan_note + ".")

    ds_ok = p.tp == 1 and p.ring == 1 and p.pp == 1
    ds = (
        f'"zero_optimization": {{"stage": {p.zero}}}, '
        f'"train_micro_batch_size_per_gpu": {p.micro_batch}, '
        f'"train_batch_size": {global_batch}'
        + (f", --ds-sequence-parallel-size {p.ulysses}" if p.ulysses > 1 else "")
        + (', "activation_checkpointing": {"partition_activations": true}'
           if p.recompute != "none" else "")
    )
    reasons = []
    if p.tp > 1:
        reasons.append(f"TP {p.tp} needs Megatron-DeepSpeed")
    if p.ring > 1:
        reasons.append(f"DeepSpeed-Ulysses cannot express a ring (R = {p.ring})")
    if p.pp > 1:
        reasons.append(f"PP {p.pp} needs DeepSpeed's PipelineModule (ZeRO <= 1)")
    ds_note = "; ".join(reasons) if reasons else "DeepSpeed-Ulysses over the CP group"
    deepspeed = FrameworkSetting("DeepSpeed", ds_ok, ds, ds_note + ".")
    return (megatron, torchtitan, deepspeed)


# ---------------------------------------------------------------------------------- JSON


def _plan_json(p: Plan, rank: int) -> dict[str, Any]:
    par, t, peak = p.par, p.time, p.peak
    return {
        "rank": rank,
        "label": par.label(),
        "tp": par.tp,
        "cp": par.cp,
        "ulysses": par.ulysses,
        "ring": par.ring,
        "layout": par.layout if par.ring > 1 else "any",
        "pp": par.pp,
        "dp": par.dp,
        "recompute": par.recompute,
        "zero": par.zero,
        "micro_batch": par.micro_batch,
        "micro_batches": par.micro_batches,
        "step_s": t.total_s,
        "parts_s": {
            "gemm": t.gemm_s,
            "attention": t.attention_s,
            "tp_comm": t.tp_comm_s,
            "pp_comm": t.pp_comm_s,
            "bubble": t.bubble_s,
            "dp_comm": t.dp_comm_s,
            "optimizer": t.optimizer_s,
        },
        "attention_share": t.attention_share,
        "bubble_fraction": t.bubble_fraction,
        "tokens_per_s_per_gpu": t.tokens_per_s_per_gpu,
        "mfu": t.mfu,
        "memory_bytes": peak.total,
        "memory_stage": peak.stage,
        "memory": {
            s.stage: {c.name: {"bytes": c.bytes, "formula": c.formula} for c in s.components}
            for s in p.stages
        },
        "max_seq_len": p.max_seq_len,
    }


def to_json(result: PlanResult) -> dict[str, Any]:
    """The result as a JSON-serialisable dict (the `--json` answer)."""
    r, m = result.request, result.model
    winner, shortest = result.winner, result.shortest_cp
    ranked = {id(p): i + 1 for i, p in enumerate(result.feasible)}
    return {
        "inputs": {
            "model": m.to_dict(),
            "parameters": m.total_params,
            "seq_len": r.seq_len,
            "gpus": r.gpus,
            "gpus_per_node": result.gpus_per_node,
            "hardware": result.profile.name,
            "memory_capacity_bytes": result.profile.memory_bytes,
            "reserve_bytes": result.reserve_bytes,
            "dtype": canonical_dtype(r.dtype),
            "kernel": r.kernel,
            "zero": r.zero,
            "micro_batch": r.micro_batch,
            "global_batch": result.global_batch,
            "recompute": r.recompute or "search",
            "matmul_efficiency": result.efficiency.value,
            "matmul_efficiency_source": result.efficiency.source,
        },
        "feasible": [_plan_json(p, i + 1) for i, p in enumerate(result.feasible)],
        "rejected": [
            {
                "label": x.label,
                "kind": x.kind,
                "rule": x.rule,
                "memory_bytes": x.total_bytes,
                "max_seq_len": x.max_seq_len,
            }
            for x in result.rejected
        ],
        "winner": ranked[id(winner)] if winner is not None else None,
        "shortest_cp": (
            {"cp": shortest.par.cp, "rank": ranked[id(shortest)], "label": shortest.par.label()}
            if shortest is not None else None
        ),
        "frameworks": [
            {"framework": f.framework, "expressible": f.expressible, "settings": f.settings,
             "note": f.note}
            for f in result.frameworks
        ],
        "notes": list(result.notes),
        "conventions": {
            "time": TIME_CONVENTION,
            "mfu": MFU_CONVENTION,
            "memory": "bytes per rank of the busiest pipeline stage; GiB = 2**30 bytes",
            "tokens": "tokens per second per GPU = global batch x L / step time / GPUs",
        },
    }

