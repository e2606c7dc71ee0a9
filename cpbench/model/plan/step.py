"""Time of one training step of the whole model by part: GEMMs, attention, TP, PP, DP, optimizer.

The formulas and conventions (MFU included): docs/plan.md, "Step time". Pure Python."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Annotated, Literal

from pydantic import Field

from cpbench.config.constraints import AttentionShape
from cpbench.config.file_schema import FileModel
from cpbench.config.masks import MaskSpec
from cpbench.config.vocabulary import DTYPE_BYTES, canonical_dtype
from cpbench.errors import CpbenchError
from cpbench.model.flops import flops_per_pair, mask_pairs
from cpbench.model.hardware.profile import HardwareProfile, LinkCost
from cpbench.model.plan.memory import Parallelism, check_zero, params_per_rank
from cpbench.model.plan.transformer import ModelSpec
from cpbench.model.topology import PlanTiers, plan_tiers
from cpbench.reading import loads_toml

ADAM_BYTES_PER_PARAM = 30
"""Adam update traffic per parameter: read fp32 grad, master, m, v (16), write master, m, v
(12), write the bf16 weight (2)."""


class MatmulEfficiency(FileModel):
    """Achieved / peak FLOP/s of the model's GEMMs on a profile."""

    value: Annotated[float, Field(gt=0, le=1)]
    """In (0, 1]."""
    source: str
    """Where it comes from."""


class StepFile(FileModel):
    """`cpbench/data/plan/step.toml`: the step-time conventions and the GEMM efficiencies."""

    conventions: dict[Literal["mfu", "step_time"], str]
    """The MFU and step-time conventions reports print."""
    matmul_efficiency: dict[str, MatmulEfficiency]
    """GEMM efficiency per built-in profile, and `fallback` for the others."""


_STEP_TEXT = (resources.files("cpbench") / "data" / "plan" / "step.toml").read_text("utf-8")
_STEP = StepFile.model_validate(loads_toml(_STEP_TEXT, "cpbench/data/plan/step.toml"))
MFU_CONVENTION = _STEP.conventions["mfu"]
STEP_TIME_CONVENTION = _STEP.conventions["step_time"]
MATMUL_EFFICIENCY = {k: v for k, v in _STEP.matmul_efficiency.items() if k != "fallback"}
"""GEMM efficiency per built-in profile (a calibrated profile `NAME-...` reads NAME's)."""
FALLBACK_MATMUL_EFFICIENCY = _STEP.matmul_efficiency["fallback"]


def matmul_efficiency(profile: HardwareProfile, override: float | None = None) -> MatmulEfficiency:
    """The profile's GEMM efficiency (`override` when given; CpbenchError outside (0, 1])."""
    if override is not None:
        if isinstance(override, bool) or not 0 < override <= 1:
            raise CpbenchError(f"matmul efficiency must be in (0, 1], got {override!r}")
        return MatmulEfficiency(value=float(override), source="given (--matmul-efficiency)")
    for name in sorted(MATMUL_EFFICIENCY, key=len, reverse=True):
        if profile.name == name or profile.name.startswith(f"{name}-"):
            return MATMUL_EFFICIENCY[name]
    return FALLBACK_MATMUL_EFFICIENCY


def ring_collective(cost: LinkCost, bytes_total: float, ranks: int, sharing: int,
                    factor: float = 1.0, calls: int = 1) -> float:
    """`calls` ring collectives over `ranks` of a tensor of `bytes_total` bytes: each rank sends
    `factor x bytes (n-1)/n` (factor 1 all-gather / reduce-scatter, 2 all-reduce)."""
    if ranks <= 1 or bytes_total <= 0:
        return 0.0
    sent = factor * bytes_total * (ranks - 1) / ranks
    return cost.seconds(sent * calls, calls, sharing)


@dataclass(frozen=True)
class StepTime:
    """A training step's time on the slowest stage, by part (seconds; parts sum to total_s)."""

    gemm_s: float
    """GEMMs of every micro-batch (layers + output projection, recompute included)."""
    attention_s: float
    """Attention of every micro-batch (cost.predict, forward + backward [+ recompute])."""
    tp_comm_s: float
    """TP + SP all-gathers and reduce-scatters of every micro-batch."""
    pp_comm_s: float
    """Pipeline activation / gradient sends of every micro-batch."""
    bubble_s: float
    """Pipeline bubble: (p - 1) micro-batch times."""
    dp_comm_s: float
    """Gradient reduction (and ZeRO weight gathers) over the d x c ranks."""
    optimizer_s: float
    """Adam update."""
    micro_batch_s: float
    """One micro-batch on the slowest stage."""
    micro_batches: int
    """m per DP rank."""
    bubble_fraction: float
    """(p - 1) / (m + p - 1)."""
    matmul_tflops: float
    """Achieved GEMM TFLOP/s assumed (peak x efficiency)."""
    model_flops: float
    """Useful FLOPs of the step (MFU_CONVENTION)."""
    tokens: int
    """Tokens per optimizer step (global batch x L)."""
    world: int
    """GPUs."""
    peak_flops: float
    """Peak dense FLOP/s per GPU of the dtype."""

    @property
    def total_s(self) -> float:
        """The step: every part."""
        return (
            self.gemm_s + self.attention_s + self.tp_comm_s + self.pp_comm_s + self.bubble_s
            + self.dp_comm_s + self.optimizer_s
        )

    @property
    def attention_share(self) -> float:
        """attention_s / total_s."""
        return self.attention_s / self.total_s if self.total_s else 0.0

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """Tokens per second per GPU."""
        return self.tokens / self.total_s / self.world if self.total_s else 0.0

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation (MFU_CONVENTION)."""
        denominator = self.total_s * self.world * self.peak_flops
        return self.model_flops / denominator if denominator else 0.0


def layer_gemm_flops(model: ModelSpec, tokens: float, micro_batch: int, tp: int) -> float:
    """Forward GEMM FLOPs of one layer on one TP rank: 2 x b x s x (linear weights) / t."""
    return 2.0 * micro_batch * tokens * (model.attention_weights + model.mlp_params) / tp


def model_flops(model: ModelSpec, seq_len: int, sequences: int,
                documents: tuple[int, ...] | None = None) -> float:
    """Useful FLOPs of a step of `sequences` sequences of `seq_len` tokens (MFU_CONVENTION):
    attention's are the pairs of the causal mask, of its documents when `documents` packs
    them (a query attends only its own document's keys)."""
    tokens = seq_len * sequences
    shape = AttentionShape(seq_len, model.heads, model.kv_heads, model.head_dim, 1)
    pairs = mask_pairs(MaskSpec(documents=documents).normalized(), seq_len)
    attention = float(flops_per_pair(shape) * pairs)
    return 6.0 * model.matmul_params * tokens + 3.0 * attention * model.layers * sequences


def step_time_of_layer(
    model: ModelSpec,
    par: Parallelism,
    seq_len: int,
    attention_forward_s: float,
    attention_backward_s: float,
    profile: HardwareProfile,
    gpus_per_node: int,
    dtype: str = "bfloat16",
    efficiency: MatmulEfficiency | None = None,
    linear_speedup: float = 1.0,
    tiers: PlanTiers | None = None,
    documents: tuple[int, ...] | None = None,
) -> StepTime:
    """Predicted step time of a plan (docs/plan.md) from one layer's attention forward and
    backward seconds for one micro-batch (heads of one TP rank, rank stride TP, times the
    framework's factor); the linears' GEMMs run `linear_speedup` x faster than bf16 ones (FP8);
    TP, PP and DP priced on the links `tiers` gives them (None: `plan_tiers` on the profile's
    own links); `documents`, the lengths packed into each sequence, count the useful attention
    FLOPs of the MFU.

    Every part is non-decreasing in both seconds (the bubble is (p - 1) micro-batch times),
    so a lower bound of the attention gives a lower bound of the step: what the search prunes
    with (`cpbench.model.plan.search`)."""
    check_zero(par.zero)
    eff = efficiency or matmul_efficiency(profile)
    e = DTYPE_BYTES[canonical_dtype(dtype)]
    peak = profile.peak_flops(dtype)
    gemm_rate = peak * eff.value * linear_speedup
    t, p, m, b = par.tp, par.pp, par.micro_batches, par.micro_batch
    s = seq_len / par.cp
    layers = par.stage_layers(model.layers)
    passes = 4 if par.recompute == "full" else 3
    gemm = (
        layers * layer_gemm_flops(model, s, b, t) * passes
        + 2.0 * b * s * model.hidden * model.vocab / t * 3
    ) / gemm_rate
    attn_layer = attention_forward_s + attention_backward_s
    if par.recompute != "none":
        attn_layer += attention_forward_s
    attn = layers * attn_layer
    tiers = tiers or plan_tiers(par, profile, gpus_per_node)
    tp_link = tiers.of("tp").link
    tp_calls = 8 + (4 if par.recompute == "full" else 0)
    tp = layers * ring_collective(
        tp_link.send_recv, e * b * s * model.hidden, t, tp_link.devices_per_nic, calls=tp_calls
    )
    pp = 0.0
    if p > 1:
        link = tiers.of("pp").link
        pp = 2 * link.send_recv.seconds(e * b * s * model.hidden / t, 1, link.devices_per_nic)
    micro = gemm + attn + tp + pp
    n = par.zero_group
    stages = ((True, True),) if p == 1 else ((True, False), (False, True))  # (first, last)
    stage_params = max(params_per_rank(model, layers, first, last, p, t) for first, last in stages)
    dp_link = tiers.of("dp").link
    cost, sharing = dp_link.send_recv, dp_link.devices_per_nic
    grads, weights = stage_params * 4, stage_params * 2  # fp32 gradients, bf16 weights
    if par.zero == 0:
        dp = ring_collective(cost, grads, n, sharing, factor=2.0)
    elif par.zero < 3:
        dp = ring_collective(cost, grads, n, sharing) + ring_collective(cost, weights, n, sharing)
    else:
        dp = m * (
            ring_collective(cost, weights, n, sharing, calls=2)
            + ring_collective(cost, grads, n, sharing)
        )
    shard = stage_params / (n if par.zero >= 1 else 1)
    optimizer = shard * ADAM_BYTES_PER_PARAM / profile.memory_bandwidth
    sequences = m * b * par.dp
    return StepTime(
        gemm_s=m * gemm,
        attention_s=m * attn,
        tp_comm_s=m * tp,
        pp_comm_s=m * pp,
        bubble_s=(p - 1) * micro,
        dp_comm_s=dp,
        optimizer_s=optimizer,
        micro_batch_s=micro,
        micro_batches=m,
        bubble_fraction=(p - 1) / (m + p - 1),
        matmul_tflops=gemm_rate / 1e12,
        model_flops=model_flops(model, seq_len, sequences, documents),
        tokens=sequences * seq_len,
        world=par.world,
        peak_flops=peak,
    )
