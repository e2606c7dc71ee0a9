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
    settings = (
        megatron_setting(best, sizes),
        deepspeed_setting(best, ranked),
        yunchang_setting(best, sizes),
        torchtitan_setting(best, ranked),
    )
    mask = best.config.mask
    if mask.plain:
        return settings
    return tuple(_with_mask_note(s, best) for s in settings) + (ring_flash_setting(best),)


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
WINDOW_NOTE = (
    "sliding window: cpbench skips the ring steps no query can see; check that the framework "
    "passes the window to its kernels under CP rather than dropping it"
)


def _with_mask_note(setting: FrameworkSetting, p: Prediction) -> FrameworkSetting:
    mask = p.config.mask
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
    c = p.config
    expressible = c.ulysses == 1
    note = (
        "packed documents: zigzag_ring_flash_attn_varlen_func with cu_seqlens, every document "
        "cut into 2 x ring chunks (cpbench's doc_zigzag, each length a multiple of 2 x ring)"
    )
    if not expressible:
        note += f"; ring only: it cannot express Ulysses (U = {c.ulysses})"
    if p.config.mask.window is not None:
        note += f"; {WINDOW_NOTE}"
    return FrameworkSetting(
        "ring-flash-attn",
        expressible,
        "zigzag_ring_flash_attn_varlen_func(q, k, v, cu_seqlens, max_seqlen, causal=True)",
        note + ".",
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
        f"{reason} Closest: Ulysses {u}x1 (rank {position}, {format_seconds(alternative.time_s, 2)}).",
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
