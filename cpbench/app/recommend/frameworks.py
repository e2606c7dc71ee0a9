"""The settings that reproduce a recommended mesh in Megatron-LM, DeepSpeed, yunchang and
torchtitan."""

from __future__ import annotations

from collections.abc import Sequence

from cpbench.app.recommend.parallel import ParallelSizes
from cpbench.app.recommend.types import FrameworkSetting, RankedCandidate
from cpbench.config.vocabulary import YUNCHANG_RING_IMPL_TYPES
from cpbench.model.cost import Prediction
from cpbench.units import format_seconds


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
    settings: tuple[FrameworkSetting, ...] = (
        megatron_setting(best, sizes),
        deepspeed_setting(best, ranked),
        yunchang_setting(best, sizes),
        torchtitan_setting(best, ranked),
    )
    if best.candidate.all_gather:
        settings += (llama3_setting(best),)
    else:
        gathers = [r for r in ranked if r.prediction.candidate.all_gather]
        pure = [r for r in gathers if r.prediction.candidate.ulysses == 1]
        pick = pure[0] if pure else gathers[0] if gathers else None
        if pick is not None:
            settings += (all_gather_alternative(pick, ranked.index(pick) + 1, gathers[0]),)
    mask = best.candidate.mask
    if mask.plain:
        return settings
    return tuple(_with_mask_note(s, best) for s in settings) + (ring_flash_setting(best),)


def all_gather_alternative(
    r: RankedCandidate, position: int, best: RankedCandidate
) -> FrameworkSetting:
    """How the frameworks run an all-gather candidate when none wins: the best one they can
    express (U = 1), naming the best all-gather candidate of all when that one has Ulysses."""
    c = r.prediction.candidate
    ag = "all_gather" if c.ulysses == 1 else "a2a+p2p (no a2a+all_gather)"
    settings = (
        f"Megatron-LM --cp-comm-type {ag}; torchtitan "
        f"--parallelism.context_parallel_rotate_method allgather; ring-flash-attn "
        f"llama3_flash_attn_varlen_func(..., heads_k_stride={c.gather_stride})"
    )
    note = f"all-gather CP as {r.label} (rank {position}, {format_seconds(r.time_s, 2)})"
    if best is not r:
        note += (
            f"; the best all-gather candidate, {best.label} "
            f"({format_seconds(best.time_s, 2)}), combines Ulysses with the all-gather, "
            f"which no framework offers"
        )
    if c.ulysses > 1:
        note += (
            f"; its Ulysses level (U = {c.ulysses}) exists only in Megatron, as a2a+p2p with "
            f"the ring, and in cpbench"
        )
    return FrameworkSetting("all-gather CP", c.ulysses == 1, settings, note + ".")


def llama3_setting(p: Prediction) -> FrameworkSetting:
    """ring-flash-attention's all-gather CP (its `llama3_*` functions) with the head stride."""
    c = p.candidate
    stride = c.gather_stride
    code = (
        "llama3_flash_attn_prepare_cu_seqlens(cu_seqlens, causal=True, rank, world_size); "
        f"llama3_flash_attn_varlen_func(q, k, v, ..., heads_k_stride={stride})"
    )
    note = (
        "ring-flash-attention's all-gather CP (the Llama 3 scheme): K/V gathered over the CP "
        f"group in strides of heads_k_stride = {stride} KV head(s), the next in flight; it "
        "takes the contiguous (varlen) layout"
    )
    if c.layout != "contiguous" and p.candidate.causal:
        note += f", not {c.layout}: expect contiguous's imbalance"
    if c.ulysses > 1:
        note += f"; all-gather only: it cannot express the Ulysses level (U = {c.ulysses})"
    return FrameworkSetting("ring-flash-attn", c.ulysses == 1, code, note + ".")


PACKED_DOCUMENT_NOTES: dict[str, str] = {
    "Megatron-LM": (
        "packed documents: THD format (PackedSeqParams with cu_seqlens) and every sequence "
        "padded to a multiple of 2 x CP (Transformer Engine's per-document zigzag, cpbench's "
        "doc_zigzag); it has no work-balanced layout"
    ),
    "DeepSpeed": (
        "packed documents: Ulysses leaves each rank the whole sequence, so the kernel's own "
        "varlen / document mask applies; whether your DeepSpeed version passes cu_seqlens "
        "through the sequence-parallel all-to-all is unknown to cpbench"
    ),
    "yunchang": (
        "packed documents: cpbench found no varlen (cu_seqlens) entry point documented for "
        "LongContextAttention: unknown; its ring part comes from ring-flash-attn, which has one"
    ),
    "torchtitan": (
        "packed documents: block_causal (document) masks go through FlexAttention "
        "(pytorch/torchtitan#1001); with CP the load balancer changes for block_causal in "
        "recent versions: check that yours supports CP with it"
    ),
}
PACKED_DOCUMENT_NOTES["ring-flash-attn"] = (
    "packed documents: the llama3 varlen functions take cu_seqlens "
    "(llama3_flash_attn_prepare_cu_seqlens); after the gather every mask is local"
)
PACKED_DOCUMENT_NOTES["all-gather CP"] = (
    "packed documents: after the gather every rank holds all K/V, so the document mask is a "
    "local problem (the Llama 3 reason for all-gather CP)"
)
WINDOW_NOTE = (
    "sliding window: cpbench skips the ring steps no query can see; check that the framework "
    "passes the window to its kernels under CP rather than dropping it"
)


def _with_mask_note(setting: FrameworkSetting, p: Prediction) -> FrameworkSetting:
    mask = p.candidate.mask
    notes = [setting.note.rstrip(".")]
    if mask.documents is not None and len(mask.documents) > 1:
        notes.append(PACKED_DOCUMENT_NOTES[setting.framework])
    if mask.window is not None:
        notes.append(WINDOW_NOTE)
    return FrameworkSetting(
        setting.framework, setting.expressible, setting.settings, "; ".join(notes) + "."
    )


def ring_flash_setting(p: Prediction) -> FrameworkSetting:
    """ring-flash-attn's varlen zigzag for packed documents (ring only)."""
    c = p.candidate
    expressible = c.ulysses == 1
    note = (
        "packed documents: zigzag_ring_flash_attn_varlen_func with cu_seqlens, every document "
        "cut into 2 x ring chunks (cpbench's doc_zigzag, each length a multiple of 2 x ring)"
    )
    if not expressible:
        note += f"; ring only: it cannot express Ulysses (U = {c.ulysses})"
    if p.candidate.mask.window is not None:
        note += f"; {WINDOW_NOTE}"
    return FrameworkSetting(
        "ring-flash-attn",
        expressible,
        "zigzag_ring_flash_attn_varlen_func(q, k, v, cu_seqlens, max_seqlen, causal=True)",
        note + ".",
    )


def cp_comm_type(ulysses: int, ring: int, cp_comm: str = "p2p") -> str:
    """Megatron's --cp-comm-type for a mesh: p2p (ring), all_gather (all-gather CP), a2a
    (Ulysses) or a2a+p2p (USP). Megatron has no a2a+all_gather: a U x A all-gather mesh with
    U > 1 maps to a2a+p2p, its closest (`megatron_setting` says so)."""
    if ulysses == 1:
        return "all_gather" if cp_comm == "all_gather" and ring > 1 else "p2p"
    return "a2a" if ring == 1 else "a2a+p2p"


def megatron_setting(p: Prediction, sizes: ParallelSizes) -> FrameworkSetting:
    """--context-parallel-size, --cp-comm-type and, for a2a+p2p, the hierarchical sizes."""
    c = p.candidate
    comm = cp_comm_type(c.ulysses, c.ring, c.cp_comm)
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
    if c.replication > 1:
        notes.append(
            f"the all-to-all needs KV heads replicated x{c.replication}; check that your "
            f"Transformer Engine version accepts kv heads < the a2a size"
        )
    expressible = True
    if c.all_gather and c.ulysses > 1:
        expressible = False
        notes.append(
            "Megatron's --cp-comm-type takes p2p, all_gather, a2a or a2a+p2p (per layer a "
            "list of them): there is no a2a+all_gather, so this U x A all-gather mesh runs as "
            "a2a+p2p (the ring on the second level)"
        )
    elif c.all_gather:
        notes.append(
            "all_gather gathers the full K/V before attention with no head stride (TE's "
            "all-gather path); cpbench's stride, if any, has no Megatron flag"
        )
    return FrameworkSetting("Megatron-LM", expressible, " ".join(flags), "; ".join(notes) + ".")


def deepspeed_setting(p: Prediction, ranked: Sequence[RankedCandidate]) -> FrameworkSetting:
    """--ds-sequence-parallel-size: Ulysses only."""
    c = p.candidate
    if c.ring == 1 and c.ulysses > 1:
        note = "DeepSpeed-Ulysses (all-to-all over the sequence-parallel group)."
        if c.replication > 1:
            note += (
                f" KV heads ({c.shape.kv_heads}) < sequence-parallel size ({c.ulysses}): "
                f"needs a DeepSpeed version that replicates KV heads for GQA."
            )
        return FrameworkSetting("DeepSpeed", True, f"--ds-sequence-parallel-size {c.ulysses}", note)
    alternative = next(
        (r for r in ranked if r.prediction.candidate.ring == 1 and r.prediction.candidate.ulysses > 1),
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
    u = alternative.prediction.candidate.ulysses
    position = ranked.index(alternative) + 1
    return FrameworkSetting(
        "DeepSpeed",
        False,
        f"--ds-sequence-parallel-size {u}",
        f"{reason} Closest: Ulysses {u}x1 (rank {position}, {format_seconds(alternative.time_s, 2)}).",
    )


def yunchang_setting(p: Prediction, sizes: ParallelSizes) -> FrameworkSetting:
    """set_seq_parallel_pg(U, R, rank, world_size) and the ring implementation of the layout."""
    c = p.candidate
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
    c = p.candidate
    base = (
        "torchtitan's context parallelism is ring-only with head-tail load balancing (the "
        "zigzag layout); rotate_method alltoall passes K/V shards around the ring like the "
        "modelled ring, allgather (the default) gathers all K/V first"
    )
    rotate = "allgather" if c.all_gather else "alltoall"
    settings = (
        f"--parallelism.context_parallel_degree {c.world} "
        f"--parallelism.context_parallel_rotate_method {rotate}"
    )
    if c.ulysses == 1:
        return FrameworkSetting("torchtitan", True, settings, base + ".")
    ring_alternative = next(
        (
            r
            for r in ranked
            if r.prediction.candidate.ulysses == 1
            and r.prediction.candidate.layout in ("zigzag", "contiguous")
            and (r.prediction.candidate.layout == "zigzag" or not r.prediction.candidate.causal)
        ),
        None,
    )
    closest = (
        f" Closest: ring 1x{c.world} zigzag (rank {ranked.index(ring_alternative) + 1}, "
        f"{format_seconds(ring_alternative.time_s, 2)})."
        if ring_alternative is not None
        else " No ring-only mesh is feasible."
    )
    return FrameworkSetting(
        "torchtitan",
        False,
        settings,
        f"{base}; it cannot express Ulysses (U = {c.ulysses}).{closest}",
    )
