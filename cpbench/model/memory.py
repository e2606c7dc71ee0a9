"""Memory per rank of one context-parallel attention layer: an itemised lower bound. Pure Python.

The items, stages and the all-gather's strides: docs/design.md section 2, "Memory per rank"."""

from __future__ import annotations

import math
from dataclasses import dataclass

from cpbench.config.constraints import seq_divisor
from cpbench.config.problem import CpProblem, check_choice
from cpbench.config.vocabulary import DTYPE_BYTES, STEP_PASSES, Pass, Passes
from cpbench.errors import CpbenchError

FWD_A2A_IN = "fwd_a2a_in"
FWD_ATTENTION = "fwd_attention"
FWD_A2A_OUT = "fwd_a2a_out"
BWD_A2A_IN = "bwd_a2a_in"
BWD_ATTENTION = "bwd_attention"
BWD_A2A_OUT = "bwd_a2a_out"
STAGES: tuple[str, ...] = (
    FWD_A2A_IN,
    FWD_ATTENTION,
    FWD_A2A_OUT,
    BWD_A2A_IN,
    BWD_ATTENTION,
    BWD_A2A_OUT,
)
FORWARD_STAGES: tuple[str, ...] = STAGES[:3]


@dataclass(frozen=True)
class MemoryItem:
    """One tensor a rank holds."""

    name: str
    """What it is, e.g. `q_local`, `kv_ring_buffers`."""
    shape: tuple[int, ...]
    """Its shape."""
    dtype: str
    """Canonical dtype name (fp32 accumulators are `float32` whatever the input dtype)."""
    stages: tuple[str, ...]
    """Stages during which it is alive, in order; the first is where it is allocated."""
    note: str = ""
    """One line on what it is for."""

    @property
    def elements(self) -> int:
        """Elements of the tensor."""
        return math.prod(self.shape)

    @property
    def bytes(self) -> int:
        """Bytes of the tensor."""
        return self.elements * DTYPE_BYTES[self.dtype]

    @property
    def phase(self) -> Pass:
        """forward when allocated in a forward stage, else backward."""
        return "forward" if self.stages[0] in FORWARD_STAGES else "backward"


@dataclass(frozen=True)
class MemoryEstimate:
    """Itemised per-rank memory of one layer, with totals and peaks."""

    config: CpProblem
    """The configuration."""
    items: tuple[MemoryItem, ...]
    """Every tensor, forward ones first."""
    stages: tuple[str, ...]
    """The stages this scheme runs through (no all-to-all stages when U = 1)."""

    def items_of(self, phase: Passes) -> tuple[MemoryItem, ...]:
        """Items allocated in a phase: forward only, or forward and backward."""
        check_choice("memory phase", phase, STEP_PASSES)
        if phase == "forward_backward":
            return self.items
        return tuple(item for item in self.items if item.phase == "forward")

    def stage_bytes(self, stage: str) -> int:
        """Bytes alive during a stage."""
        check_choice("stage", stage, self.stages)
        return sum(item.bytes for item in self.items if stage in item.stages)

    def total(self, phase: Passes) -> int:
        """Sum of every item allocated in the phase (as if nothing were ever freed)."""
        return sum(item.bytes for item in self.items_of(phase))

    def peak(self, phase: Passes) -> int:
        """Largest live bytes over the stages of the phase."""
        return self.stage_bytes(self.peak_stage(phase))

    def peak_stage(self, phase: Passes) -> str:
        """The stage where the peak of the phase is reached."""
        check_choice("memory phase", phase, STEP_PASSES)
        stages = [s for s in self.stages if phase == "forward_backward" or s in FORWARD_STAGES]
        return max(stages, key=self.stage_bytes)


def scheme_stages(ulysses: int) -> tuple[str, ...]:
    """Stages a scheme runs through: all six with Ulysses, the two attention stages without."""
    return STAGES if ulysses > 1 else (FWD_ATTENTION, BWD_ATTENTION)


class _ItemBuilder:
    """Collects items, clipping each lifetime to the stages the scheme has."""

    def __init__(self, config: CpProblem) -> None:
        self.config = config
        self.stages = scheme_stages(config.ulysses)
        self.shapes = _tensor_shapes(config)
        self.items: list[MemoryItem] = []

    def add(
        self, name: str, shape: str, first: str, last: str, note: str, dtype: str | None = None
    ) -> None:
        """An item of shape `self.shapes[shape]` in `dtype` (None: the input dtype), alive
        first..last."""
        lo, hi = STAGES.index(first), STAGES.index(last)
        alive = tuple(s for s in self.stages if lo <= STAGES.index(s) <= hi)
        self.items.append(
            MemoryItem(name, self.shapes[shape], dtype or self.config.dtype, alive, note)
        )

    def add_fp32(self, name: str, shape: str, first: str, last: str, note: str) -> None:
        """An fp32 item (accumulator, LSE) of shape `self.shapes[shape]`, alive first..last."""
        self.add(name, shape, first, last, note, "float32")


def memory_estimate(config: CpProblem) -> MemoryEstimate:
    """Itemised per-rank memory of one attention layer, forward and backward."""
    builder = _ItemBuilder(config)
    _add_forward_items(builder)
    _add_backward_items(builder)
    return MemoryEstimate(config, tuple(builder.items), builder.stages)


def _tensor_shapes(config: CpProblem) -> dict[str, tuple[int, ...]]:
    """Per-rank shapes: local (sequence shard), head-sharded (after the all-to-all), buffers."""
    s = config.shape
    batch, tokens, shard, d_h = s.batch, config.tokens_per_rank, config.ring_shard, s.head_dim
    heads_kv = (2, batch, shard, config.kv_heads_per_rank, d_h)
    buffers = 2 if config.gathers > 1 else 1
    return {
        "gathered_kv": (buffers, config.ring, 2, batch, shard, config.gather_stride, d_h),
        "local_q": (batch, tokens, s.heads, d_h),
        "local_kv": (batch, tokens, s.kv_heads, d_h),
        "send_kv": (2, batch, tokens, config.replication * s.kv_heads, d_h),
        "heads_q": (batch, shard, config.heads_per_rank, d_h),
        "heads_kv": heads_kv,
        "ring_kv_double": (2, *heads_kv),
        "lse": (batch, config.heads_per_rank, shard),
    }


def _add_forward_items(b: _ItemBuilder) -> None:
    ulysses, ring = b.config.ulysses > 1, b.config.ring > 1
    held = "input shard, held by the caller"
    b.add("q_local", "local_q", FWD_A2A_IN, BWD_A2A_OUT, held)
    b.add("k_local", "local_kv", FWD_A2A_IN, BWD_A2A_OUT, held)
    b.add("v_local", "local_kv", FWD_A2A_IN, BWD_A2A_OUT, held)
    if ulysses:
        if b.config.replication > 1:
            b.add("kv_replicated", "send_kv", FWD_A2A_IN, FWD_A2A_IN, "KV heads copied c times")
        b.add("a2a_q_send", "local_q", FWD_A2A_IN, FWD_A2A_IN, "all-to-all send buffer")
        b.add("a2a_kv_send", "send_kv", FWD_A2A_IN, FWD_A2A_IN, "all-to-all send buffer")
        b.add("q_heads", "heads_q", FWD_A2A_IN, BWD_ATTENTION, "Q' head shard, saved")
        b.add("kv_heads", "heads_kv", FWD_A2A_IN, BWD_ATTENTION, "K'/V' head shard, saved")
    if ring and b.config.all_gather:
        b.add_fp32("out_accumulator", "heads_q", FWD_ATTENTION, FWD_ATTENTION, "softmax merge")
        b.add("kv_gathered", "gathered_kv", FWD_ATTENTION, FWD_ATTENTION, _gathered_note(b))
    elif ring:
        b.add_fp32("out_accumulator", "heads_q", FWD_ATTENTION, FWD_ATTENTION, "online softmax")
        b.add("kv_ring_buffers", "ring_kv_double", FWD_ATTENTION, FWD_ATTENTION, "K/V in flight")
    b.add_fp32("lse", "lse", FWD_ATTENTION, BWD_ATTENTION, "log-sum-exp, saved")
    if ulysses:
        b.add("o_heads", "heads_q", FWD_ATTENTION, BWD_ATTENTION, "O' head shard, saved")
        b.add("a2a_out_send", "heads_q", FWD_A2A_OUT, FWD_A2A_OUT, "all-to-all send buffer")
    first = FWD_A2A_OUT if ulysses else FWD_ATTENTION
    b.add("o_local", "local_q", first, BWD_A2A_OUT, "output shard, held by the caller")


def _gathered_note(b: _ItemBuilder) -> str:
    c = b.config
    if c.gathers > 1:
        return (
            f"gathered K/V of a stride of {c.gather_stride} of {c.kv_heads_per_rank} KV heads, "
            f"x2 with the next stride in flight"
        )
    return "gathered K/V of the whole sequence (one stride)"


def _add_backward_items(b: _ItemBuilder) -> None:
    ulysses, ring = b.config.ulysses > 1, b.config.ring > 1
    b.add("do_local", "local_q", BWD_A2A_IN, BWD_A2A_OUT, "output gradient, from the caller")
    if ulysses:
        b.add("a2a_dout_send", "local_q", BWD_A2A_IN, BWD_A2A_IN, "all-to-all send buffer")
        b.add("do_heads", "heads_q", BWD_A2A_IN, BWD_ATTENTION, "dO' head shard")
    if ring and b.config.all_gather:
        b.add("kv_gathered_bwd", "gathered_kv", BWD_ATTENTION, BWD_ATTENTION, _gathered_note(b))
        b.add_fp32("dq_accumulator", "heads_q", BWD_ATTENTION, BWD_ATTENTION, "dQ' accumulator")
        b.add_fp32(
            "dkv_gathered", "gathered_kv", BWD_ATTENTION, BWD_ATTENTION, "dK/dV to reduce-scatter"
        )
        b.add_fp32("dkv_accumulator", "heads_kv", BWD_ATTENTION, BWD_ATTENTION, "dK/dV received")
    elif ring:
        b.add(
            "kv_ring_buffers_bwd", "ring_kv_double", BWD_ATTENTION, BWD_ATTENTION, "K/V in flight"
        )
        b.add_fp32("dq_accumulator", "heads_q", BWD_ATTENTION, BWD_ATTENTION, "dQ' accumulator")
        b.add_fp32("dkv_accumulator", "heads_kv", BWD_ATTENTION, BWD_ATTENTION, "travelling dK/dV")
        b.add_fp32("dkv_recv_buffer", "heads_kv", BWD_ATTENTION, BWD_ATTENTION, "its next hop")
        b.add("dkv_own", "heads_kv", BWD_ATTENTION, BWD_ATTENTION, "own chunk's dK/dV, home")
    if ulysses:
        first = BWD_A2A_OUT if ring else BWD_ATTENTION
        b.add("dq_heads", "heads_q", first, BWD_A2A_OUT, "dQ' head shard in dtype")
        b.add("dkv_heads", "heads_kv", first, BWD_A2A_OUT, "dK'/dV' head shard in dtype")
        b.add("a2a_dq_send", "local_q", BWD_A2A_OUT, BWD_A2A_OUT, "all-to-all send buffer")
        b.add("a2a_dkv_send", "send_kv", BWD_A2A_OUT, BWD_A2A_OUT, "all-to-all send buffer")
        if b.config.replication > 1:
            b.add("dkv_replicated", "send_kv", BWD_A2A_OUT, BWD_A2A_OUT, "copies' grads, summed")
    first = BWD_A2A_OUT if ulysses else BWD_ATTENTION
    grad = "gradient of the input shard"
    b.add("dq_local", "local_q", first, BWD_A2A_OUT, grad)
    b.add("dk_local", "local_kv", first, BWD_A2A_OUT, grad)
    b.add("dv_local", "local_kv", first, BWD_A2A_OUT, grad)


def max_seq_len_for_budget(
    budget_bytes: float, problem: CpProblem, phase: Passes = "forward_backward"
) -> int:
    """Longest L, a multiple of `seq_divisor(U, R, layout)`, at which `problem` (its shape
    but its length, mesh, layout, dtype, exchange) fits the budget per rank at its peak.

    Every item is proportional to L, so peak(L) = peak(D) * L / D with D the divisor and the
    answer is floor(budget / peak(D)) * D; 0 when not even D fits. doc_zigzag (which pads any
    length) answers with the zigzag divisor: one document of such a length needs no padding.
    """
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, float)):
        raise CpbenchError(f"memory budget must be a number of bytes, got {budget_bytes!r}")
    if budget_bytes <= 0:
        raise CpbenchError(f"memory budget must be positive, got {budget_bytes} bytes")
    check_choice("memory phase", phase, STEP_PASSES)
    divisor_layout = "zigzag" if problem.layout == "doc_zigzag" else problem.layout
    divisor = seq_divisor(problem.ulysses, problem.ring, divisor_layout)
    unit = CpProblem(
        **{**problem.problem_fields(), "seq_len": divisor, "documents": None, "window": None}
    )
    return int(budget_bytes // memory_estimate(unit).peak(phase)) * divisor
