"""Communication volume of context-parallel attention per rank, as numbers and as formulas.

The symbols, counting convention and volumes: docs/design.md section 2. Pure Python."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from cpbench.config.constraints import seq_divisor
from cpbench.config.problem import CpProblem, check_choice
from cpbench.config.vocabulary import PASSES, Pass
from cpbench.errors import CpbenchError

FP32_BYTES = 4
"""Bytes per element of the fp32 accumulators (dK/dV travelling the ring, outputs, LSE)."""

Stage = Literal["ulysses", "ring", "all_gather"]
"""Where a collective runs: the Ulysses all-to-alls, the ring hops, or the all-gather of the
ring axis (`cp_comm = "all_gather"`)."""
CollectiveKind = Literal["all_to_all", "send_recv"]
"""The link kinds a hardware profile prices (latency + busbw each)."""
VolumeKind = Literal["all_to_all", "send_recv", "all_gather", "reduce_scatter"]
"""What a collective of a stage is (nccl-tests' name for it); the all-gather and the
reduce-scatter are priced on the all-to-all link cost of their tier (`cpbench.model.cost.schemes`)."""


# ----------------------------------------------------------------------------------- formulas

_SYMBOL = re.compile(r"\b(B|L_run|L|h_kv|hs|h|d_h|d_kv|d|U|R|c|e|k)\b")


def substitute(formula: str, symbols: Mapping[str, int]) -> str:
    """The formula with every symbol replaced by its value: `B*(L/U)` -> `1*(8192/4)`."""
    return _SYMBOL.sub(lambda m: str(symbols[m.group(1)]), formula)


# ------------------------------------------------------------------------- volume dataclasses


def same_bytes(counted: Mapping[str, int], expected: Mapping[str, int]) -> bool:
    """Whether the bytes counted per collective are the model's, a collective of 0 bytes the
    same as one never called (a window of one token passes no K/V; a world of 1 sends nothing
    through its all-to-all: the model lists the one, the counter the other)."""
    return {n: b for n, b in counted.items() if b} == {n: b for n, b in expected.items() if b}


@dataclass(frozen=True)
class CollectiveVolume:
    """One collective of a stage: how often it runs and what a rank sends through it."""

    name: str
    """Identifier the instrumented communicator uses too, e.g. `a2a_kv`, `p2p_dkv`."""
    stage: Stage
    """ulysses (all-to-all), ring (point-to-point) or all_gather (the ring axis gathering)."""
    phase: Pass
    """forward or backward."""
    kind: VolumeKind
    """all_to_all, send_recv, all_gather or reduce_scatter."""
    group_size: int
    """Ranks taking part: U for an all-to-all, R for the ring or the all-gather group."""
    calls: int
    """Calls per layer and phase (1 per all-to-all; hops for the ring; strides for the
    all-gather and the reduce-scatter)."""
    elements_per_call: int
    """Elements of the nccl-tests `size` of one call: what a rank hands in (all-to-all: self
    part included; send: the tensor; reduce-scatter: its whole input of R chunks), or for an
    all-gather its whole output (R chunks, its own included)."""
    elements_sent: int
    """Elements crossing the wire for a rank over all calls: sent (its own all-to-all part
    excluded), or for an all-gather the (R-1) chunks it receives."""
    bytes_per_element: int
    """e of the input dtype, or 4 for fp32 accumulators."""
    element_symbol: str
    """How `bytes_per_element` is written in formulas: `e`, or `4` for fp32 accumulators."""
    per_call_formula: str
    """Symbolic `elements_per_call`."""
    formula: str
    """Symbolic `elements_sent`."""

    @property
    def bytes_sent(self) -> int:
        """Bytes a rank sends over all calls."""
        return self.elements_sent * self.bytes_per_element

    @property
    def bytes_per_call(self) -> int:
        """Bytes handed in per call: the `size` nccl-tests reports for this collective."""
        return self.elements_per_call * self.bytes_per_element

    @property
    def bytes_formula(self) -> str:
        """Symbolic `bytes_sent`."""
        return f"{self.element_symbol}*{self.formula}"


@dataclass(frozen=True)
class StageVolume:
    """The collectives of one stage (Ulysses or ring) in one phase, with the stage formula."""

    stage: Stage
    """ulysses or ring."""
    phase: Pass
    """forward or backward."""
    collectives: tuple[CollectiveVolume, ...]
    """Its collectives, in the order they run."""
    formula: str
    """Symbolic elements sent per rank by the whole stage."""
    bytes_formula: str
    """Symbolic bytes sent per rank by the whole stage."""

    @property
    def elements_sent(self) -> int:
        """Elements a rank sends in this stage."""
        return sum(c.elements_sent for c in self.collectives)

    @property
    def bytes_sent(self) -> int:
        """Bytes a rank sends in this stage."""
        return sum(c.bytes_sent for c in self.collectives)


@dataclass(frozen=True)
class CommVolume:
    """Communication of one attention layer per rank, forward and backward."""

    config: CpProblem
    """The configuration it is computed for."""
    forward: tuple[StageVolume, ...]
    """Forward stages that communicate (none for a single rank)."""
    backward: tuple[StageVolume, ...]
    """Backward stages that communicate."""

    def stages(self, phase: Pass) -> tuple[StageVolume, ...]:
        """The stages of a phase."""
        check_choice("phase", phase, PASSES)
        return self.forward if phase == "forward" else self.backward

    def collectives(self, phase: Pass) -> tuple[CollectiveVolume, ...]:
        """Every collective of a phase, in order."""
        return tuple(c for stage in self.stages(phase) for c in stage.collectives)

    def elements_sent(self, phase: Pass) -> int:
        """Elements a rank sends in a phase."""
        return sum(stage.elements_sent for stage in self.stages(phase))

    def bytes_sent(self, phase: Pass) -> int:
        """Bytes a rank sends in a phase."""
        return sum(stage.bytes_sent for stage in self.stages(phase))

    def global_bytes_sent(self, phase: Pass) -> int:
        """Bytes all U*R ranks send in a phase (every rank sends the same amount)."""
        return self.bytes_sent(phase) * self.config.world

    def global_elements_sent(self, phase: Pass) -> int:
        """Elements all U*R ranks send in a phase."""
        return self.elements_sent(phase) * self.config.world


# ------------------------------------------------------------------------ numbers (per rank)


def ulysses_q_elements(config: CpProblem) -> int:
    """Elements a rank hands to `a2a_q` (and `a2a_out`, `a2a_dout`, `a2a_dq`): B*S*h*d_h."""
    s = config.shape
    return s.batch * config.tokens_per_rank * s.heads * s.head_dim


def ulysses_kv_elements(config: CpProblem) -> int:
    """Elements a rank hands to `a2a_kv` (and `a2a_dkv`): 2*B*S*c*h_kv*d_h, K and V packed."""
    s = config.shape
    return 2 * s.batch * config.tokens_per_rank * config.replication * s.kv_heads * s.head_dim


def all_to_all_sent(handed_in: int, group_size: int) -> int:
    """Elements an all-to-all sends: what a rank hands in minus its own 1/U part."""
    if group_size <= 1:
        return 0
    if handed_in % group_size:
        raise CpbenchError(
            f"an all-to-all over {group_size} ranks needs a buffer divisible by {group_size}, "
            f"got {handed_in} elements"
        )
    return handed_in // group_size * (group_size - 1)


def ring_kv_chunk_elements(config: CpProblem) -> int:
    """Elements of one ring hop of K/V packed: 2*B*(L/R)*(c*h_kv/U)*d_h."""
    s = config.shape
    return 2 * s.batch * config.ring_shard * config.kv_heads_per_rank * s.head_dim


def gather_bytes_sent(config: CpProblem, phase: Pass = "forward") -> int:
    """Bytes crossing the wire for a rank in the all-gather stage, per pass: (R-1) K/V chunks
    gathered, plus backward (R-1) fp32 dK/dV chunks reduce-scattered; 0 without it."""
    check_choice("phase", phase, PASSES)
    if not config.all_gather:
        return 0
    chunks = (config.ring - 1) * ring_kv_chunk_elements(config)
    kv = chunks * config.bytes_per_element
    return kv if phase == "forward" else kv + chunks * FP32_BYTES


def gathered_kv_elements(config: CpProblem) -> int:
    """Elements of the K/V one all-gather call delivers: R chunks of `hs` KV heads,
    2*B*L_run*hs*d_h (the whole sequence's K/V of the stride)."""
    s = config.shape
    return 2 * s.batch * config.run_len * config.gather_stride * s.head_dim


# ---------------------------------------------------------------------- formulas (symbolic)


def _length_symbol(config: CpProblem) -> str:
    """`L`, or `L_run` when the layout pads."""
    return "L_run" if config.padding else "L"


def _tokens_symbol(config: CpProblem) -> str:
    """S = L/(U*R) written as simply as the mesh allows."""
    length = _length_symbol(config)
    return f"({length}/U)" if config.ring == 1 else f"({length}/(U*R))"


def _ring_kv_heads_symbol(config: CpProblem) -> str:
    """KV heads per rank in the ring: h_kv for pure ring, c*h_kv/U with Ulysses."""
    return "h_kv" if config.ulysses == 1 else "(c*h_kv/U)"


def _ring_kv_width_symbol(config: CpProblem) -> str:
    """KV channels per rank in the ring: d_kv for pure ring, c*d_kv/U with Ulysses."""
    return "d_kv" if config.ulysses == 1 else "(c*d_kv/U)"


def _all_to_all(
    config: CpProblem, name: str, phase: Pass, handed: int, handed_formula: str
) -> CollectiveVolume:
    u = config.ulysses
    return CollectiveVolume(
        name=name,
        stage="ulysses",
        phase=phase,
        kind="all_to_all",
        group_size=u,
        calls=1,
        elements_per_call=handed,
        elements_sent=all_to_all_sent(handed, u),
        bytes_per_element=config.bytes_per_element,
        element_symbol="e",
        per_call_formula=handed_formula,
        formula=f"{handed_formula}*(U-1)/U",
    )


def ulysses_stage(config: CpProblem, phase: Pass) -> StageVolume | None:
    """The Ulysses all-to-alls of a phase; None when U == 1."""
    check_choice("phase", phase, PASSES)
    if config.ulysses == 1:
        return None
    tokens = _tokens_symbol(config)
    q_formula = f"B*{tokens}*h*d_h"
    kv_formula = f"2*B*{tokens}*c*h_kv*d_h"
    q, kv = ulysses_q_elements(config), ulysses_kv_elements(config)
    if phase == "forward":
        specs = [("a2a_q", q, q_formula), ("a2a_kv", kv, kv_formula), ("a2a_out", q, q_formula)]
    else:
        specs = [("a2a_dout", q, q_formula), ("a2a_dq", q, q_formula), ("a2a_dkv", kv, kv_formula)]
    collectives = tuple(_all_to_all(config, n, phase, e, f) for n, e, f in specs)
    formula = f"B*{tokens}*(U-1)/U*(2*d + 2*c*d_kv)"
    return StageVolume("ulysses", phase, collectives, formula, f"e*{formula}")


def _kv_hops_symbol(config: CpProblem) -> str:
    """`(R-1)` when every ring step runs, else `(k-1)`."""
    return "(R-1)" if config.ring_steps == config.ring else "(k-1)"


def _ring_hops(config: CpProblem, name: str, phase: Pass, hops: int, fp32: bool) -> CollectiveVolume:
    chunk_formula = f"2*B*({_length_symbol(config)}/R)*{_ring_kv_heads_symbol(config)}*d_h"
    hops_symbol = _kv_hops_symbol(config)  # K/V and dK/dV alike: k - 1 hops
    return CollectiveVolume(
        name=name,
        stage="ring",
        phase=phase,
        kind="send_recv",
        group_size=config.ring,
        calls=hops,
        elements_per_call=ring_kv_chunk_elements(config),
        elements_sent=hops * ring_kv_chunk_elements(config),
        bytes_per_element=FP32_BYTES if fp32 else config.bytes_per_element,
        element_symbol="4" if fp32 else "e",
        per_call_formula=chunk_formula,
        formula=f"{hops_symbol}*{chunk_formula}",
    )


def ring_axis_stage(config: CpProblem, phase: Pass) -> StageVolume | None:
    """The ring axis of a phase: the ring hops, or (`cp_comm = "all_gather"`) the all-gather
    and the backward reduce-scatter; None when R == 1."""
    check_choice("phase", phase, PASSES)
    if config.ring == 1:
        return None
    gather = config.all_gather
    hops = "(R-1)" if gather else _kv_hops_symbol(config)
    kv_formula = f"2*B*{_length_symbol(config)}*{_ring_kv_width_symbol(config)}*{hops}/R"
    stage: Stage = "all_gather" if gather else "ring"
    if gather:
        kv = _gather_collective(config, "ag_kv", phase, "all_gather", fp32=False)
    else:
        kv = _ring_hops(config, "p2p_kv", phase, config.kv_hops, fp32=False)
    if phase == "forward" or (not gather and config.dkv_hops == 0):
        return StageVolume(stage, phase, (kv,), kv_formula, f"e*{kv_formula}")
    if gather:
        dkv = _gather_collective(config, "rs_dkv", phase, "reduce_scatter", fp32=True)
    else:
        dkv = _ring_hops(config, "p2p_dkv", phase, config.dkv_hops, fp32=True)
    bytes_formula = f"e*{kv_formula} + 4*{kv_formula}"
    return StageVolume(stage, phase, (kv, dkv), f"2*{kv_formula}", bytes_formula)


def _gather_collective(
    config: CpProblem, name: str, phase: Pass, kind: VolumeKind, fp32: bool
) -> CollectiveVolume:
    length, heads = _length_symbol(config), _ring_kv_heads_symbol(config)
    per_call = gathered_kv_elements(config)
    chunk_formula = f"2*B*({length}/R)*{heads}*d_h"
    return CollectiveVolume(
        name=name,
        stage="all_gather",
        phase=phase,
        kind=kind,
        group_size=config.ring,
        calls=config.gathers,
        elements_per_call=per_call,
        elements_sent=(config.ring - 1) * ring_kv_chunk_elements(config),
        bytes_per_element=FP32_BYTES if fp32 else config.bytes_per_element,
        element_symbol="4" if fp32 else "e",
        per_call_formula=f"2*B*{length}*hs*d_h",
        formula=f"(R-1)*{chunk_formula}",
    )


@functools.lru_cache(maxsize=4096)
def comm_volume(config: CpProblem) -> CommVolume:
    """Per-rank communication of a configuration, forward and backward: the Ulysses
    all-to-alls, then the ring hops or (cp_comm all_gather) the all-gather stage (cached: a fit
    prices the same configurations thousands of times)."""

    def stages(phase: Pass) -> tuple[StageVolume, ...]:
        found = (ulysses_stage(config, phase), ring_axis_stage(config, phase))
        return tuple(stage for stage in found if stage is not None)

    return CommVolume(config, stages("forward"), stages("backward"))


# ---------------------------------------------------------------------- nccl-tests bandwidth


def busbw_factor(kind: VolumeKind, group_size: int) -> Fraction:
    """busbw / algbw: (n-1)/n for an all-to-all, an all-gather or a reduce-scatter over n
    ranks (nccl-tests: `size` is the whole output of an all-gather, the whole input of a
    reduce-scatter), 1 for send/recv."""
    if group_size < 1:
        raise CpbenchError(f"group size must be at least 1, got {group_size}")
    if kind in ("all_to_all", "all_gather", "reduce_scatter"):
        return Fraction(group_size - 1, group_size)
    if kind == "send_recv":
        return Fraction(1)
    raise CpbenchError(
        f"collective kind {kind!r} is not one of all_to_all, send_recv, all_gather, reduce_scatter"
    )


def bandwidths(
    size_bytes: float, seconds: float, kind: VolumeKind, group_size: int
) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s of one call of `size_bytes` that took `seconds`, as nccl-tests
    reports them: algbw = size / time (an all-to-all's `size` is the whole buffer a rank hands
    in, its own part included, `CollectiveVolume.bytes_per_call`; send/recv's the message),
    busbw = algbw x `busbw_factor`."""
    if seconds <= 0:
        raise CpbenchError(f"time must be positive to compute a bandwidth, got {seconds} s")
    if size_bytes < 0:
        raise CpbenchError(f"size must be non-negative, got {size_bytes} bytes")
    alg = size_bytes / seconds
    return alg, alg * float(busbw_factor(kind, group_size))


HOPS_NOTE = (
    "k = ring steps the mask needs (R without a window or packed documents): K/V makes k-1 hops "
    "per pass, the fp32 dK/dV accumulator k (none when k = 1); steps k..R-1 are skipped"
)


GATHER_NOTE = (
    "all-gather of the ring axis (cp_comm all_gather): every rank receives the (R-1) K/V chunks "
    "of the others per pass, in (c*h_kv/U)/hs calls of hs KV heads; backward gathers again and "
    "reduce-scatters the fp32 dK/dV, (R-1) chunks sent; the mask skips compute, never bytes"
)


def seq_len_divisor(config: CpProblem) -> int:
    """The multiple of which the sequence length must be for this mesh and layout."""
    return seq_divisor(config.ulysses, config.ring, config.layout)
