"""The typed report `cpbench formulas` returns (`cpbench.app.formulas.formulas_report`; its
--json is `FormulasReport.model_dump(mode="json")`). Data only; the service fills it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cpbench.app.schema import ReportModel, Versioned
from cpbench.config.vocabulary import CpComm, Dtype, Layout, Mask, Pass, Scheme
from cpbench.model.formulas import Stage, VolumeKind

Shape = list[int]
"""A tensor shape, outermost dimension first."""


class Inputs(ReportModel):
    """The problem as given (the mask's kind, documents and window included)."""

    seq_len: int
    heads: int
    kv_heads: int
    head_dim: int
    batch: int
    ulysses: int
    ring: int
    cp_comm: CpComm
    heads_k_stride: int | None
    """KV heads per all-gather as asked (None: all in one)."""
    layout: Layout
    dtype: Dtype
    bytes_per_element: int
    causal: bool
    mask: Mask
    """The mask's kind."""
    documents: list[int] | None
    """Document lengths in tokens (None: one sequence)."""
    window: int | None
    """Sliding window in tokens (None: none)."""


class Mesh(ReportModel):
    """How the U x R mesh splits the problem."""

    feasible: Literal[True]
    """Always true: an infeasible problem raises instead."""
    scheme: Scheme
    world_size: int
    kv_replication: int
    """How many times each KV head is replicated so U ranks get whole heads."""
    seq_divisor: int
    """What seq_len must be a multiple of."""
    tokens_per_rank: int
    ring_shard_tokens: int
    """Tokens a ring rank holds after the Ulysses all-to-all (L / R)."""
    heads_per_rank: int
    kv_heads_per_rank: int
    run_len: int
    """Tokens the attention runs on (seq_len plus any layout padding)."""
    padding_tokens: int
    ring_steps: int


class HeadShapes(ReportModel):
    """q: its shape on a rank before and after the Ulysses all-to-all."""

    local: Shape
    after_all_to_all: Shape


class KvShapes(ReportModel):
    """k or v: local, after replicating the KV heads, and after the all-to-all."""

    local: Shape
    replicated: Shape
    after_all_to_all: Shape


class OutputShapes(ReportModel):
    """o: the head shard the attention writes, and the sequence shard it returns to."""

    heads: Shape
    local: Shape


class Shapes(ReportModel):
    """Per-rank tensor shapes."""

    q: HeadShapes
    k: KvShapes
    v: KvShapes
    o: OutputShapes
    ring_kv_chunk: Shape | None
    """The K/V a ring hop passes (None without a ring)."""
    gathered_kv: Shape | None
    """The K/V of one head stride an all-gather returns (None without an all-gather)."""
    lse: Shape
    """The fp32 log-sum-exp of the attention."""


class Collective(ReportModel):
    """One collective of a stage: its formulas, substituted, and what a rank sends."""

    name: str
    stage: Stage
    kind: VolumeKind
    group_size: int
    calls: int
    elements_per_call: int
    per_call_formula: str
    formula: str
    """Elements a rank sends over all calls, symbolically."""
    substituted: str
    """`formula` with the symbols' values."""
    elements_sent: int
    bytes_per_element: int
    bytes_formula: str
    bytes_substituted: str
    bytes_sent: int


class StageSection(ReportModel):
    """One stage (ulysses, ring or all_gather) of a pass and its collectives."""

    stage: Stage
    formula: str
    substituted: str
    elements_sent: int
    bytes_formula: str
    bytes_substituted: str
    bytes_sent: int
    collectives: list[Collective]


class PassVolume(ReportModel):
    """What a pass sends: per stage, per rank and over all ranks."""

    stages: list[StageSection]
    elements_per_rank: int
    bytes_per_rank: int
    global_elements: int
    global_bytes: int


class TotalVolume(ReportModel):
    """Forward and backward together."""

    bytes_per_rank: int
    global_bytes: int


class Communication(ReportModel):
    """Communication per rank and layer, forward and backward."""

    convention: str
    hops_note: str
    ring_steps: int
    forward: PassVolume
    backward: PassVolume
    forward_backward: TotalVolume

    def by_pass(self) -> dict[Pass, PassVolume]:
        """Each pass's volume, forward first."""
        return {"forward": self.forward, "backward": self.backward}


class NcclCollective(ReportModel):
    """One collective as nccl-tests would measure it."""

    phase: Pass
    name: str
    kind: VolumeKind
    group_size: int
    calls: int
    size_bytes: int
    busbw_factor: float
    bus_bytes_per_call: int


class NcclView(ReportModel):
    """The collectives in nccl-tests' terms (size, algbw, busbw)."""

    convention: str
    collectives: list[NcclCollective]


class PassTotals(ReportModel):
    """FLOPs of the forward, the backward and both."""

    forward: float
    backward: float
    forward_backward: float


class StepFlops(ReportModel):
    """FLOPs per rank of what a step runs: the forward, or forward and backward."""

    forward: list[float]
    forward_backward: list[float]


class StepTotals(ReportModel):
    """FLOPs of the slowest rank, forward and forward + backward."""

    forward: float
    forward_backward: float


class Flops(ReportModel):
    """Attention FLOPs of one layer."""

    convention: str
    causal: bool
    mask: str
    """The mask's label."""
    per_pair_per_rank: int
    global_: PassTotals = Field(validation_alias="global", serialization_alias="global")
    """FLOPs of all ranks (the key is `global`)."""
    run: PassTotals
    """FLOPs of the run, padding included."""
    per_rank: StepFlops
    slowest_rank: StepTotals
    per_step_slowest_forward: list[float]
    """Forward FLOPs of the busiest rank at each ring step."""


class Work(ReportModel):
    """Attended (query, key) pairs per rank and ring step: the causal work and its balance."""

    unit: str
    layout: str
    causal: bool
    chunk_size: float
    total_pairs: float
    ring_rank_pairs: list[float]
    rank_pairs: list[float]
    rank_chunk_units: list[float]
    imbalance: float
    """Slowest ring rank's pairs / mean."""
    overhead: float
    """Slowest ring rank's pairs / (the mask's pairs / R): imbalance and padding together."""
    mask: str
    """The mask's label."""
    ring_steps: int
    padding_tokens: int
    padding_pairs: float
    padding_fraction: float
    busiest_step_sum: float
    step_pairs: list[list[float]] | None
    """Pairs of each ring rank at each step (None on a ring longer than
    `cpbench.app.formulas.MAX_STEP_MATRIX_RING`)."""
    step_max_pairs: list[float]


class MemoryTensor(ReportModel):
    """One tensor a rank holds."""

    name: str
    shape: Shape
    dtype: str
    bytes: int
    phase: Pass
    """The pass that allocates it."""
    stages: list[str]
    """The stages it is alive in."""
    note: str


class MemoryPhase(ReportModel):
    """Memory of the forward, or of forward and backward."""

    total: int
    """Every item allocated, summed."""
    peak: int
    """The largest sum of items alive in one stage."""
    peak_stage: str


class Memory(ReportModel):
    """Memory per rank of one layer (a lower bound)."""

    items: list[MemoryTensor]
    stages: dict[str, int]
    """Bytes alive in each stage."""
    forward: MemoryPhase
    forward_backward: MemoryPhase


class WhatIf(ReportModel):
    """The longest sequence whose attention memory fits the budget."""

    budget_gib: int
    budget_bytes: int
    seq_divisor: int
    max_seq_len_forward: int
    max_seq_len_forward_backward: int


class LayoutRow(ReportModel):
    """One feasible layout under the mask, on this mesh with the ring's K/V hops."""

    layout: Layout
    feasible: Literal[True]
    imbalance: float
    overhead: float
    slowest_ring_rank: int
    slowest_rank_pairs: float
    ring_rank_pairs: list[float]
    padding_tokens: int
    padding_fraction: float
    run_len: int
    ring_steps: int
    kv_hops: int
    dkv_hops: int
    hops_saved: int
    """Ring hops the mask lets this layout skip (R - ring_steps)."""
    bytes_forward: int
    bytes_backward: int
    bytes_forward_backward: int


class InfeasibleLayout(ReportModel):
    """A layout this problem cannot use, and why."""

    layout: Layout
    feasible: Literal[False]
    reason: str | None


class MaskSection(ReportModel):
    """The mask and every layout side by side (a mask with documents or a window only)."""

    label: str
    kind: Mask
    documents: int
    """How many documents (1 without documents)."""
    longest_document: int
    window: int | None
    ring: int
    convention: str
    hops_note: str
    layouts: list[LayoutRow | InfeasibleLayout]


class GatherStride(ReportModel):
    """The all-gather's memory at one head stride."""

    heads_k_stride: int
    gathers: int
    gathered_elements_per_call: int
    gathered_kv_bytes: int
    gathered_kv_shape: Shape
    peak_forward_backward: int
    selected: bool
    """The stride of this problem."""


class GatherSection(ReportModel):
    """The all-gather's memory against its head stride, the ring's for comparison
    (`cp_comm="all_gather"` only)."""

    note: str
    kv_heads_per_rank: int
    heads_k_stride: int
    """The stride this problem gathers with."""
    gathers: int
    gathered_kv_formula: str
    strides: list[GatherStride]
    """Every stride that divides the KV heads a rank gathers, largest first."""
    ring_peak_forward_backward: int
    ring_kv_buffers_bytes: int


class FormulasReport(Versioned):
    """Every analytic number of one configuration (its --json is `model_dump(mode="json")`)."""

    inputs: Inputs
    mesh: Mesh
    symbols: dict[str, int]
    """The value of each symbol the formulas use."""
    shapes: Shapes
    communication: Communication
    nccl_tests: NcclView
    flops: Flops
    work: Work
    memory: Memory
    what_if: WhatIf
    mask: MaskSection | None = None
    """Only for a mask with documents or a window (the key is left out without)."""
    all_gather: GatherSection | None = None
    """Only when the ring axis all-gathers, R > 1 (the key is left out otherwise)."""

    omitted_when_none = ("mask", "all_gather")
