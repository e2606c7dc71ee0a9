"""Memory per rank of a training step by component: weights, gradients, optimizer, activations.

The formulas and their sources: docs/plan.md, "Memory per rank". Pure Python."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from cpbench.config.problem import CpProblem, check_choice
from cpbench.config.vocabulary import DTYPE_BYTES, canonical_dtype
from cpbench.errors import CpbenchError
from cpbench.model.memory import memory_estimate
from cpbench.model.plan.transformer import ModelSpec
from cpbench.units import GIB

Recompute = Literal["none", "selective", "full"]
"""Activation recomputation: none, selective (Korthikanti's: the core attention), full (every
layer from its input)."""
RECOMPUTES: tuple[Recompute, ...] = get_args(Recompute)
ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)
"""ZeRO / FSDP stages: 0 nothing sharded, 1 optimizer states (Megatron's distributed
optimizer), 2 + gradients, 3 + weights (FSDP full shard)."""

WEIGHT_BYTES = 2
"""bf16 weights."""
GRAD_BYTES = 4
"""fp32 main gradients (Megatron accumulates and reduces them in fp32 with bf16 weights)."""
OPTIMIZER_BYTES = 12
"""fp32 master weights 4 + Adam first moment 4 + second moment 4."""
ZERO3_GATHERED_LAYERS = 2
"""Layers whose full weights a ZeRO-3 rank holds at once (running + prefetched)."""
CUDA_RESERVE_GIB = 2.0
"""Default runtime reserve on a GPU: CUDA context, NCCL buffers, allocator fragmentation
(estimate)."""
SAFE_MEMORY_FRACTION = 0.8
"""Fujii, Watanabe, Yokota 2024, 'Accelerating Large Language Model Training with 4D Parallelism
and Memory Consumption Estimator' (arXiv:2411.06465), abstract: over 454 runs on A100 and H100,
'when the estimated memory usage is below 80% of the available GPU memory, the training never
encounters out-of-memory errors'. The margin covers what a tensor count leaves out: the caching
allocator's cached and fragmented blocks, NCCL and CUDA-graph buffers, the CUDA context."""
MemoryMargin = Literal["capacity", "safe"]
"""What a plan must fit: `capacity` (the tensors + the runtime reserve within the device
memory) or `safe` (the tensors within SAFE_MEMORY_FRACTION of it, Fujii et al.'s rule)."""
MEMORY_MARGINS: tuple[MemoryMargin, ...] = get_args(MemoryMargin)
SAVED_ATTENTION_ITEMS = frozenset(
    {"q_local", "k_local", "v_local", "o_local", "lse", "q_heads", "kv_heads", "o_heads"}
)
"""`cpbench.model.memory` items the activation terms already count (Q, K, V, O, LSE)."""


def check_recompute(value: object) -> Recompute:
    """`value` as a Recompute; CpbenchError naming it otherwise."""
    return check_choice("recompute", value, RECOMPUTES)


def check_zero(value: object) -> int:
    """`value` as a ZeRO stage; CpbenchError naming it otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in ZERO_STAGES:
        raise CpbenchError(f"ZeRO stage {value!r} is not one of 0, 1, 2, 3")
    return value


@dataclass(frozen=True)
class Parallelism:
    """How a plan lays the model over its GPUs: world = TP x CP x PP x DP."""

    tp: int
    """t: tensor-parallel size (with sequence parallelism when > 1 and `sequence_parallel`)."""
    ulysses: int
    """U: Ulysses degree of the CP group."""
    ring: int
    """R: ring degree of the CP group."""
    pp: int
    """p: pipeline stages."""
    dp: int
    """d: data-parallel replicas."""
    micro_batch: int = 1
    """b: sequences per micro-batch."""
    micro_batches: int = 1
    """m: micro-batches per data-parallel rank and optimizer step."""
    recompute: Recompute = "none"
    """Activation recomputation."""
    zero: int = 1
    """ZeRO stage over the d x c data-parallel ranks."""
    layout: str = "zigzag"
    """Token layout of the ring."""
    sequence_parallel: bool = True
    """Megatron's sequence parallelism with TP (shards the norm and dropout activations)."""
    uneven_stages: bool = False
    """Whether PP may split the layers unevenly (torchtitan's pipeline split, Megatron's
    --decoder-first/last-pipeline-num-layers): the busiest stage then holds ceil(layers / PP)."""

    def stage_layers(self, layers: int) -> int:
        """Layers of the busiest pipeline stage: layers / PP, or ceil(layers / PP) with
        `uneven_stages`; CpbenchError when PP does not divide them otherwise."""
        if layers % self.pp == 0:
            return layers // self.pp
        if self.uneven_stages and self.pp <= layers:
            return -(-layers // self.pp)
        raise CpbenchError(
            f"layers ({layers}) must be divisible by PP ({self.pp}): every pipeline stage "
            f"holds layers / PP layers (or PP <= layers with uneven stages)"
        )

    @property
    def cp(self) -> int:
        """c = U x R."""
        return self.ulysses * self.ring

    @property
    def world(self) -> int:
        """t x c x p x d."""
        return self.tp * self.cp * self.pp * self.dp

    @property
    def zero_group(self) -> int:
        """Ranks ZeRO shards over and gradients are reduced over: d x c."""
        return self.dp * self.cp

    def label(self) -> str:
        """`TP t CP UxR PP p DP d`."""
        return f"TP {self.tp} CP {self.ulysses}x{self.ring} PP {self.pp} DP {self.dp}"


@dataclass(frozen=True)
class MemoryComponent:
    """Bytes one rank holds for one purpose."""

    name: str
    """weights, gradients, optimizer, activations, recompute working set, attention buffers,
    logits/loss, ZeRO-3 gathered weights, runtime reserve."""
    bytes: float
    """Bytes per rank."""
    formula: str
    """How it is counted, with the numbers."""


@dataclass(frozen=True)
class StageMemory:
    """Memory of one rank of one pipeline stage, by component."""

    stage: str
    """first, last, or only (PP = 1)."""
    components: tuple[MemoryComponent, ...]
    """Every component, in a fixed order."""

    @property
    def total(self) -> float:
        """Sum of the components."""
        return sum(c.bytes for c in self.components)

    @property
    def largest(self) -> MemoryComponent:
        """The largest component."""
        return max(self.components, key=lambda c: c.bytes)

    def component(self, name: str) -> float:
        """Bytes of a component (0 when absent)."""
        return sum(c.bytes for c in self.components if c.name == name)

    @property
    def tensor_total(self) -> float:
        """The tensors alone: the total less the runtime reserve."""
        return self.total - self.component("runtime reserve")


def fits_margin(stage: StageMemory, capacity: float, margin: str = "capacity") -> bool:
    """Whether a stage fits the device memory under a margin (`MemoryMargin`)."""
    check_choice("memory margin", margin, MEMORY_MARGINS)
    if margin == "safe":
        return stage.tensor_total <= SAFE_MEMORY_FRACTION * capacity
    return stage.total <= capacity


# ------------------------------------------------------------------------ activations


def layer_activation_bytes(
    model: ModelSpec,
    seq_tokens: float,
    micro_batch: int,
    tp: int = 1,
    recompute: Recompute = "none",
    sequence_parallel: bool = True,
    scores_materialised: bool = False,
    dtype: str = "bfloat16",
    key_tokens: float | None = None,
) -> float:
    """Bytes one rank saves for backward per layer and micro-batch (docs/plan.md).

    `seq_tokens` is s, the rank's tokens (L / CP); `key_tokens` the keys each query sees when
    scores are materialised (L; default s, the paper's case of no CP)."""
    check_recompute(recompute)
    e = DTYPE_BYTES[canonical_dtype(dtype)]
    s, b, h, t = seq_tokens, micro_batch, model.hidden, tp
    sp = t if sequence_parallel else 1  # divisor of the terms SP shards
    if recompute == "full":
        return e * s * b * h / sp
    replicated = 4 * e * s * b * h  # two norm inputs, QKV input, MLP input
    if model.dropout:
        replicated += 2 * s * b * h  # attention-output and MLP-output dropout masks
    sharded = (2 * model.q_width + 2 * model.kv_width) * e * s * b  # Q, O, K, V
    mlp_tensors = 3 if model.ffn_type == "swiglu" else 2
    sharded += mlp_tensors * e * s * b * model.ffn_hidden
    keys = s if key_tokens is None else key_tokens
    if scores_materialised:
        per_score = (2 * e + 1) if model.dropout else e
        scores = per_score * model.heads * s * keys * b if recompute == "none" else 0.0
    else:
        scores = 4 * model.heads * s * b  # the fused kernel's fp32 log-sum-exp
    return replicated / sp + (sharded + scores) / t


def attention_buffer_bytes(config: CpProblem) -> int:
    """Transient bytes of the CP scheme for one layer: the largest stage of
    `cpbench.model.memory`'s estimate less the saved Q, K, V, O and LSE it holds there."""
    estimate = memory_estimate(config)
    transient = [item for item in estimate.items if item.name not in SAVED_ATTENTION_ITEMS]
    live = [
        sum(item.bytes for item in transient if stage in item.stages) for stage in estimate.stages
    ]
    return max(live, default=0)


# ------------------------------------------------------------------------- the stage


def params_per_rank(model: ModelSpec, layers: int, first: bool, last: bool, pp: int,
                     tp: int) -> float:
    """Parameters one rank of a stage holds: the linear weights / t, norms replicated, the
    embedding (first) and the output projection + final norm (last) / t."""
    linear = model.attention_params + model.mlp_params
    params = layers * (linear / tp + model.norm_params_per_layer)
    if first:
        params += model.embedding_params / tp
    if last:
        head = model.vocab * model.hidden if (pp > 1 and model.tied_embeddings) else model.head_params
        params += head / tp + model.hidden
    return params


def stage_memory(
    model: ModelSpec,
    par: Parallelism,
    seq_len: int,
    stage: str,
    attention_buffers: float,
    dtype: str = "bfloat16",
    scores_materialised: bool = False,
    reserve_bytes: float = 0.0,
) -> StageMemory:
    """Memory of one rank of the `first`, `last` or `only` pipeline stage (docs/plan.md)."""
    check_choice("stage", stage, ("first", "last", "only"))
    layers = par.stage_layers(model.layers)
    check_zero(par.zero)
    first, last = stage in ("first", "only"), stage in ("last", "only")
    t, n = par.tp, par.zero_group
    params = params_per_rank(model, layers, first, last, par.pp, t)
    e = DTYPE_BYTES[canonical_dtype(dtype)]
    s = seq_len / par.cp
    b = par.micro_batch
    in_flight = min(par.pp, par.micro_batches) if first else 1
    per_layer = layer_activation_bytes(
        model, s, b, t, par.recompute, par.sequence_parallel, scores_materialised, dtype, seq_len
    )
    p_label = f"{params / 1e9:.3f} G params per rank"
    states = (  # (component, bytes per parameter, what they are, ZeRO stage sharding it)
        ("weights", WEIGHT_BYTES, "bf16", 3, "ZeRO-3"),
        ("gradients", GRAD_BYTES, "fp32", 2, "ZeRO-2+"),
        ("optimizer", OPTIMIZER_BYTES, "fp32 master + Adam m, v", 1,
         f"ZeRO-1+ over DP {par.dp} x CP {par.cp}"),
    )
    parts = []
    for name, size, kind, sharded_from, zero_label in states:
        div = n if par.zero >= sharded_from else 1
        sharded = f" / {n} ({zero_label})" if div > 1 else ""
        parts.append(MemoryComponent(name, params * size / div,
                                     f"{p_label} x {size} B ({kind}){sharded}"))
    if par.zero >= 3:
        gathered = ZERO3_GATHERED_LAYERS * model.layer_params / t * WEIGHT_BYTES
        parts.append(MemoryComponent(
            "ZeRO-3 gathered weights", gathered,
            f"{ZERO3_GATHERED_LAYERS} layers x {model.layer_params / 1e6:.1f} M params / TP {t} "
            f"x {WEIGHT_BYTES} B",
        ))
    parts.append(MemoryComponent(
        "activations", layers * in_flight * per_layer,
        f"{layers} layers x {in_flight} micro-batch(es) in flight x "
        f"{per_layer / 2**20:.1f} MiB per layer ({par.recompute} recompute, s = L/CP = "
        f"{s:g} tokens, b = {b}, TP {t}{' + SP' if par.sequence_parallel and t > 1 else ''})",
    ))
    if par.recompute == "full":
        working = layer_activation_bytes(
            model, s, b, t, "none", par.sequence_parallel, scores_materialised, dtype, seq_len
        )
        parts.append(MemoryComponent(
            "recompute working set", working,
            "one layer's activations rebuilt at a time in backward",
        ))
    parts.append(MemoryComponent(
        "attention buffers", attention_buffers,
        f"CP {par.ulysses}x{par.ring} {par.layout}: transient buffers of one layer "
        "(cpbench.model.memory)",
    ))
    if last:
        sp = t if par.sequence_parallel else 1
        logits = 2 * e * s * b * model.hidden / sp + (e + 4) * s * b * model.vocab / t
        parts.append(MemoryComponent(
            "logits/loss", logits,
            f"final norm + output input 2 x {e} B x s b h / {sp}, logits {e} B + fp32 softmax "
            f"4 B x s b v / TP {t}",
        ))
    if reserve_bytes:
        parts.append(MemoryComponent(
            "runtime reserve", reserve_bytes,
            f"{reserve_bytes / GIB:.1f} GiB: CUDA context, NCCL buffers, allocator fragmentation "
            "(estimate)",
        ))
    return StageMemory(stage, tuple(parts))


def plan_memory(
    model: ModelSpec,
    par: Parallelism,
    seq_len: int,
    attention_buffers: float,
    dtype: str = "bfloat16",
    scores_materialised: bool = False,
    reserve_bytes: float = 0.0,
) -> tuple[StageMemory, ...]:
    """The stages whose ranks can set the peak: `only` (PP = 1), else `first` (most
    micro-batches in flight, the embedding) and `last` (the output projection, the logits)."""
    stages = ("only",) if par.pp == 1 else ("first", "last")
    return tuple(
        stage_memory(model, par, seq_len, stage, attention_buffers, dtype, scores_materialised,
                     reserve_bytes)
        for stage in stages
    )


def peak_stage(stages: tuple[StageMemory, ...]) -> StageMemory:
    """The stage of the largest total."""
    return max(stages, key=lambda s: s.total)
