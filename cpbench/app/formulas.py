"""Application service of `cpbench formulas`: every analytic number of one configuration, as the
typed `FormulasReport` of `formulas_report` (its model_dump is the `--json` answer;
`cpbench.render.formulas` draws it)."""

from __future__ import annotations

from dataclasses import replace

from cpbench.app import formulas_schema as out
from cpbench.app.formulas_schema import FormulasReport
from cpbench.config.documents import resolve_documents
from cpbench.config.masks import MaskSpec
from cpbench.config.problem import CpProblem
from cpbench.config.vocabulary import LAYOUTS, PASS_TOTALS, PASSES, STEP_PASSES, Layout
from cpbench.errors import CpbenchError
from cpbench.model.flops import FLOPS_CONVENTION, FlopsBreakdown, flops_breakdown
from cpbench.model.formulas import (
    GATHER_NOTE,
    HOPS_NOTE,
    CollectiveVolume,
    CommVolume,
    StageVolume,
    busbw_factor,
    comm_volume,
    gathered_kv_elements,
    seq_len_divisor,
    substitute,
)
from cpbench.model.memory import MemoryEstimate, max_seq_len_for_budget, memory_estimate
from cpbench.units import GIB

WHAT_IF_BUDGET_GIB = 80
"""Per-rank memory of the "largest sequence that fits" what-if (an 80 GiB accelerator)."""
MAX_STEP_MATRIX_RING = 32
"""Rings larger than this report only the busiest rank per step, not the full step matrix."""
COUNTING_CONVENTION = (
    "elements a rank sends per layer: an all-to-all counts what the rank hands in minus the 1/U "
    "part it keeps; a send counts the tensor sent; bytes = elements x e (dtype) or x 4 (fp32 "
    "dK/dV on the ring); an all-gather counts the (R-1) chunks a rank receives, a "
    "reduce-scatter the (R-1) chunks it sends"
)
NCCL_CONVENTION = (
    "nccl-tests view: size = bytes a rank hands in per call (all-to-all: whole buffer, own part "
    "included; send/recv: the message; all-gather: its whole output, R chunks of the stride; "
    "reduce-scatter: its whole input, R chunks); algbw = size / time; busbw = algbw x (n-1)/n "
    "for an all-to-all, all-gather or reduce-scatter over n ranks, = algbw for send/recv"
)
WORK_UNIT = (
    "attended (query, key) token pairs, a causal-diagonal pair counting 1/2; a rank's pairs are "
    "its ring rank's pairs / U (the U Ulysses ranks split the heads); chunk units = pairs / "
    "(L/(2P))^2"
)


MASK_CONVENTION = (
    "per layout on this mask: imbalance = slowest ring rank's pairs / mean; overhead = slowest "
    "ring rank's pairs / (the mask's pairs / R), imbalance and padding together; padding = "
    "tokens doc_zigzag adds (and the share of extra pairs they cost); ring steps k of R; bytes "
    "per rank and layer, forward + backward (ring K/V in the dtype, dK/dV in fp32, plus any "
    "all-to-all)"
)


def mask_from_options(
    seq_len: int,
    causal: bool = True,
    documents: str | None = None,
    window: int | None = None,
    seed: int = 0,
) -> MaskSpec:
    """The mask of the `--documents SRC --window W --seed N` options (SRC as
    `cpbench.config.documents.resolve_documents` takes it); CpbenchError naming a bad value."""
    docs = None if documents is None else resolve_documents(documents, seq_len, seed)
    if window is not None and (isinstance(window, bool) or window <= 0):
        raise CpbenchError(f"--window must be a positive number of tokens, got {window}")
    return MaskSpec(causal=causal, documents=docs, window=window).normalized()


# ------------------------------------------------------------------------------- the report


def formulas_report(problem: CpProblem) -> FormulasReport:
    """Every analytic number of a problem; CpbenchError when it is infeasible. A mask with
    documents or a window adds the per-layout comparison; `cp_comm="all_gather"` (R > 1) the
    all-gather stage and a section on its head strides."""
    config = problem.require_feasible()
    mask = config.mask
    flops = flops_breakdown(config)
    volume = comm_volume(config)
    return FormulasReport(
        inputs=out.Inputs.of(
            config, mask=mask.kind, documents=list(mask.documents) if mask.documents else None,
            window=mask.window,
        ),
        mesh=out.Mesh.of(
            config, feasible=True, world_size=config.world, kv_replication=config.replication,
            seq_divisor=seq_len_divisor(config), ring_shard_tokens=config.ring_shard,
            padding_tokens=config.padding,
        ),
        symbols=config.symbols(),
        shapes=_shapes(config),
        communication=_communication(volume),
        nccl_tests=_nccl_view(volume),
        flops=_flops(flops),
        work=_work(flops),
        memory=_memory_report(memory_estimate(config)),
        what_if=_what_if(config),
        mask=None if mask.plain else _mask_section(config),
        all_gather=_gather_section(config) if config.all_gather else None,
    )


def _gather_section(config: CpProblem) -> out.GatherSection:
    """The all-gather's memory against its head stride, and the ring's for comparison: every
    stride that divides the KV heads a rank gathers."""
    per_rank = config.kv_heads_per_rank
    ring = memory_estimate(replace(config, cp_comm="p2p", heads_k_stride=None))
    rows = []
    for stride in (d for d in range(per_rank, 0, -1) if per_rank % d == 0):
        other = replace(config, cp_comm="all_gather", heads_k_stride=stride)
        estimate = memory_estimate(other)
        gathered = next(i for i in estimate.items if i.name == "kv_gathered")
        rows.append(
            out.GatherStride(
                heads_k_stride=stride,
                gathers=other.gathers,
                gathered_elements_per_call=gathered_kv_elements(other),
                gathered_kv_bytes=gathered.bytes,
                gathered_kv_shape=list(gathered.shape),
                peak_forward_backward=estimate.peak("forward_backward"),
                selected=stride == config.gather_stride,
            )
        )
    return out.GatherSection(
        note=GATHER_NOTE,
        kv_heads_per_rank=per_rank,
        heads_k_stride=config.gather_stride,
        gathers=config.gathers,
        gathered_kv_formula="2*B*L*hs*d_h x (2 when more than one stride: the next in flight)",
        strides=rows,
        ring_peak_forward_backward=ring.peak("forward_backward"),
        ring_kv_buffers_bytes=next(i.bytes for i in ring.items if i.name == "kv_ring_buffers"),
    )


def _mask_section(config: CpProblem) -> out.MaskSection:
    """The mask and every layout side by side on this mesh."""
    mask, shape = config.mask, config.shape
    layouts = LAYOUTS if config.ring > 1 and mask.causal else (config.layout,)
    return out.MaskSection(
        label=mask.label,
        kind=mask.kind,
        documents=len(mask.documents) if mask.documents else 1,
        longest_document=max(mask.documents) if mask.documents else shape.seq_len,
        window=mask.window,
        ring=config.ring,
        convention=MASK_CONVENTION,
        hops_note=HOPS_NOTE,
        layouts=[_layout_row(config, layout) for layout in layouts],
    )


def _layout_row(config: CpProblem, layout: Layout) -> out.LayoutRow | out.InfeasibleLayout:
    other = replace(config, layout=layout, cp_comm="p2p", heads_k_stride=None)
    if not other.feasibility.ok:
        return out.InfeasibleLayout(layout=layout, feasible=False, reason=other.feasibility.reason)
    work = flops_breakdown(other).work
    volume = comm_volume(other)
    forward, backward = volume.bytes_sent("forward"), volume.bytes_sent("backward")
    return out.LayoutRow.of(
        work,
        layout=layout,
        feasible=True,
        slowest_rank_pairs=float(max(work.ring_rank_pairs)) / config.ulysses,
        padding_tokens=other.padding,
        run_len=other.run_len,
        ring_steps=other.ring_steps,
        kv_hops=other.kv_hops,
        dkv_hops=other.dkv_hops,
        hops_saved=config.ring - other.ring_steps,
        bytes_forward=forward,
        bytes_backward=backward,
        bytes_forward_backward=forward + backward,
    )


def _shapes(config: CpProblem) -> out.Shapes:
    s = config.shape
    b, tokens, shard, d_h = s.batch, config.tokens_per_rank, config.ring_shard, s.head_dim
    kv = out.KvShapes(
        local=[b, tokens, s.kv_heads, d_h],
        replicated=[b, tokens, config.replication * s.kv_heads, d_h],
        after_all_to_all=[b, shard, config.kv_heads_per_rank, d_h],
    )
    return out.Shapes(
        q=out.HeadShapes(
            local=[b, tokens, s.heads, d_h],
            after_all_to_all=[b, shard, config.heads_per_rank, d_h],
        ),
        k=kv,
        v=kv,
        o=out.OutputShapes(
            heads=[b, shard, config.heads_per_rank, d_h], local=[b, tokens, s.heads, d_h]
        ),
        ring_kv_chunk=[2, b, shard, config.kv_heads_per_rank, d_h] if config.ring > 1 else None,
        gathered_kv=(
            [config.ring, 2, b, shard, config.gather_stride, d_h] if config.all_gather else None
        ),
        lse=[b, config.heads_per_rank, shard],
    )


def _substituted(volume: CollectiveVolume | StageVolume, symbols: dict[str, int]) -> dict[str, str]:
    """A collective's or a stage's element and byte formulas with the symbols' values."""
    return {
        "substituted": substitute(volume.formula, symbols),
        "bytes_substituted": substitute(volume.bytes_formula, symbols),
    }


def _stage(stage: StageVolume, symbols: dict[str, int]) -> out.StageSection:
    return out.StageSection.of(
        stage,
        **_substituted(stage, symbols),
        collectives=[out.Collective.of(c, **_substituted(c, symbols)) for c in stage.collectives],
    )


def _communication(volume: CommVolume) -> out.Communication:
    symbols = volume.config.symbols()
    passes = {
        phase: out.PassVolume(
            stages=[_stage(s, symbols) for s in volume.stages(phase)],
            elements_per_rank=volume.elements_sent(phase),
            bytes_per_rank=volume.bytes_sent(phase),
            global_elements=volume.global_elements_sent(phase),
            global_bytes=volume.global_bytes_sent(phase),
        )
        for phase in PASSES
    }
    return out.Communication(
        convention=COUNTING_CONVENTION,
        hops_note=GATHER_NOTE if volume.config.all_gather else HOPS_NOTE,
        ring_steps=volume.config.ring_steps,
        forward=passes["forward"],
        backward=passes["backward"],
        forward_backward=out.TotalVolume(
            bytes_per_rank=sum(volume.bytes_sent(p) for p in PASSES),
            global_bytes=sum(volume.global_bytes_sent(p) for p in PASSES),
        ),
    )


def _nccl_view(volume: CommVolume) -> out.NcclView:
    rows = []
    for phase in PASSES:
        for c in volume.collectives(phase):
            factor = busbw_factor(c.kind, c.group_size)
            rows.append(
                out.NcclCollective.of(
                    c,
                    phase=phase,
                    size_bytes=c.bytes_per_call,
                    busbw_factor=float(factor),
                    bus_bytes_per_call=c.bytes_per_call * factor.numerator // factor.denominator,
                )
            )
    return out.NcclView(convention=NCCL_CONVENTION, collectives=rows)


def _flops(breakdown: FlopsBreakdown) -> out.Flops:
    return out.Flops(
        convention=FLOPS_CONVENTION,
        causal=breakdown.work.causal,
        mask=breakdown.work.mask.label,
        per_pair_per_rank=breakdown.pair_flops,
        global_=out.PassTotals.model_validate({p: breakdown.global_flops(p) for p in PASS_TOTALS}),
        run=out.PassTotals.model_validate({p: breakdown.run_flops(p) for p in PASS_TOTALS}),
        per_rank=out.StepFlops.model_validate(
            {p: list(breakdown.rank_flops(p)) for p in STEP_PASSES}
        ),
        slowest_rank=out.StepTotals.model_validate(
            {p: breakdown.slowest_rank_flops(p) for p in STEP_PASSES}
        ),
        per_step_slowest_forward=[
            float(pairs * breakdown.pair_flops) for pairs in breakdown.work.step_max_pairs
        ],
    )


def _work(breakdown: FlopsBreakdown) -> out.Work:
    work = breakdown.work
    full_matrix = work.ring <= MAX_STEP_MATRIX_RING
    return out.Work.of(
        work,
        unit=WORK_UNIT,
        total_pairs=work.total,
        mask=work.mask.label,
        ring_steps=work.steps,
        padding_tokens=work.padding,
        step_pairs=work.step_pairs if full_matrix else None,
    )


def _memory_report(estimate: MemoryEstimate) -> out.Memory:
    phases = {
        phase: out.MemoryPhase(
            total=estimate.total(phase),
            peak=estimate.peak(phase),
            peak_stage=estimate.peak_stage(phase),
        )
        for phase in STEP_PASSES
    }
    return out.Memory(
        items=[out.MemoryTensor.of(item) for item in estimate.items],
        stages={stage: estimate.stage_bytes(stage) for stage in estimate.stages},
        forward=phases["forward"],
        forward_backward=phases["forward_backward"],
    )


def _what_if(config: CpProblem) -> out.WhatIf:
    budget = WHAT_IF_BUDGET_GIB * GIB
    return out.WhatIf(
        budget_gib=WHAT_IF_BUDGET_GIB,
        budget_bytes=budget,
        seq_divisor=seq_len_divisor(config),
        max_seq_len_forward=max_seq_len_for_budget(budget, config, "forward"),
        max_seq_len_forward_backward=max_seq_len_for_budget(budget, config, "forward_backward"),
    )
