"""The settings that reproduce a recommended mesh in Megatron-LM, DeepSpeed, yunchang,
torchtitan and ring-flash-attn, each with its caveats as facts (`cpbench.render.recommend`
words them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from cpbench.app.recommend.parallel import ParallelSizes
from cpbench.app.recommend.types import (
    Caveat,
    CaveatKind,
    FrameworkSetting,
    RankedCandidate,
)
from cpbench.config.vocabulary import YUNCHANG_RING_IMPL_TYPES
from cpbench.model.cost.prediction import Prediction


def _closest(
    kind: CaveatKind, r: RankedCandidate, ranked: Sequence[RankedCandidate], *values: int
) -> Caveat:
    """A caveat naming the closest alternative `r` (its label, rank and time)."""
    return Caveat(kind, values, candidate=r.label, position=ranked.index(r) + 1, time_s=r.time_s)


def framework_settings(
    ranked: Sequence[RankedCandidate], sizes: ParallelSizes
) -> tuple[FrameworkSetting, ...]:
    """Settings for the winner in Megatron-LM, DeepSpeed, yunchang and torchtitan."""
    best = ranked[0].prediction
    if sizes.cp == 1:
        return tuple(
            FrameworkSetting(name, True, "-", caveats=(Caveat("cp1"),))
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
            settings += (all_gather_alternative(pick, ranked, gathers[0]),)
    if best.candidate.mask.plain:
        return settings
    return tuple(_with_mask_caveats(s, best) for s in settings) + (ring_flash_setting(best),)


def all_gather_alternative(
    r: RankedCandidate, ranked: Sequence[RankedCandidate], best: RankedCandidate
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
    caveats = [_closest("ag_alternative", r, ranked)]
    if best is not r:
        caveats.append(_closest("ag_best_has_ulysses", best, ranked))
    if c.ulysses > 1:
        caveats.append(Caveat("ag_ulysses_megatron", (c.ulysses,)))
    return FrameworkSetting("all-gather CP", c.ulysses == 1, settings, caveats=tuple(caveats))


def llama3_setting(p: Prediction) -> FrameworkSetting:
    """ring-flash-attention's all-gather CP (its `llama3_*` functions) with the head stride."""
    c = p.candidate
    code = (
        "llama3_flash_attn_prepare_cu_seqlens(cu_seqlens, causal=True, rank, world_size); "
        f"llama3_flash_attn_varlen_func(q, k, v, ..., heads_k_stride={c.gather_stride})"
    )
    caveats = [Caveat("llama3", (c.gather_stride,))]
    if c.layout != "contiguous" and p.candidate.causal:
        caveats.append(Caveat("llama3_layout", name=c.layout))
    if c.ulysses > 1:
        caveats.append(Caveat("gather_only", (c.ulysses,)))
    return FrameworkSetting("ring-flash-attn", c.ulysses == 1, code, caveats=tuple(caveats))


def _with_mask_caveats(setting: FrameworkSetting, p: Prediction) -> FrameworkSetting:
    mask = p.candidate.mask
    added: tuple[Caveat, ...] = ()
    if mask.documents is not None and len(mask.documents) > 1:
        added += (Caveat("documents", name=setting.framework),)
    if mask.window is not None:
        added += (Caveat("window"),)
    return replace(setting, caveats=setting.caveats + added)


def ring_flash_setting(p: Prediction) -> FrameworkSetting:
    """ring-flash-attn's varlen zigzag for packed documents (ring only)."""
    c = p.candidate
    caveats = [Caveat("ring_flash_documents")]
    if c.ulysses != 1:
        caveats.append(Caveat("ring_only", (c.ulysses,)))
    if c.mask.window is not None:
        caveats.append(Caveat("window"))
    return FrameworkSetting(
        "ring-flash-attn",
        c.ulysses == 1,
        "zigzag_ring_flash_attn_varlen_func(q, k, v, cu_seqlens, max_seqlen, causal=True)",
        caveats=tuple(caveats),
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
    caveats = [Caveat("te_chunks")]
    if c.ring > 1 and p.candidate.causal and c.layout != "zigzag":
        caveats.append(Caveat("te_layout", name=c.layout))
    if c.replication > 1:
        caveats.append(Caveat("kv_replication", (c.replication,)))
    if c.all_gather:
        caveats.append(Caveat("no_a2a_all_gather" if c.ulysses > 1 else "te_all_gather"))
    expressible = not (c.all_gather and c.ulysses > 1)
    return FrameworkSetting("Megatron-LM", expressible, " ".join(flags), caveats=tuple(caveats))


def deepspeed_setting(p: Prediction, ranked: Sequence[RankedCandidate]) -> FrameworkSetting:
    """--ds-sequence-parallel-size: Ulysses only. A mesh with a ring (R > 1) has no DeepSpeed
    setting: the cell says `-` and the caveats name the closest Ulysses-only mesh with its own
    flag (it runs that other mesh, not the winner)."""
    c = p.candidate
    if c.ring == 1 and c.ulysses > 1:
        caveats = [Caveat("ds_ulysses")]
        if c.replication > 1:
            caveats.append(Caveat("ds_gqa", (c.shape.kv_heads, c.ulysses)))
        flag = f"--ds-sequence-parallel-size {c.ulysses}"
        return FrameworkSetting("DeepSpeed", True, flag, caveats=tuple(caveats))
    alternative = next(
        (r for r in ranked if r.prediction.candidate.ring == 1 and r.prediction.candidate.ulysses > 1),
        None,
    )
    ring = Caveat("ds_ring", (c.ring,))
    if alternative is None:
        return FrameworkSetting("DeepSpeed", False, "-", caveats=(ring, Caveat("no_ulysses_mesh")))
    a = alternative.prediction.candidate
    caveats = [ring, _closest("closest_ulysses", alternative, ranked, a.ulysses)]
    if a.replication > 1:
        caveats.append(Caveat("ds_gqa", (a.shape.kv_heads, a.ulysses)))
    return FrameworkSetting("DeepSpeed", False, "-", caveats=tuple(caveats))


def yunchang_setting(p: Prediction, sizes: ParallelSizes) -> FrameworkSetting:
    """set_seq_parallel_pg(U, R, rank, world_size) and the ring implementation of the layout."""
    c = p.candidate
    impl = YUNCHANG_RING_IMPL_TYPES[c.layout if c.ring > 1 else "contiguous"]
    code = (
        f"set_seq_parallel_pg({c.ulysses}, {c.ring}, rank, world_size={sizes.world}); "
        f'LongContextAttention(ring_impl_type="{impl}")'
    )
    return FrameworkSetting("yunchang", True, code, caveats=(Caveat("yunchang", name=impl),))


def torchtitan_setting(p: Prediction, ranked: Sequence[RankedCandidate]) -> FrameworkSetting:
    """context_parallel_degree and rotate method; ring-only with head-tail load balancing."""
    c = p.candidate
    rotate = "allgather" if c.all_gather else "alltoall"
    settings = (
        f"--parallelism.context_parallel_degree {c.world} "
        f"--parallelism.context_parallel_rotate_method {rotate}"
    )
    if c.ulysses == 1:
        return FrameworkSetting("torchtitan", True, settings, caveats=(Caveat("torchtitan"),))
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
        _closest("closest_ring", ring_alternative, ranked, c.world)
        if ring_alternative is not None
        else Caveat("no_ring_mesh")
    )
    caveats = (Caveat("torchtitan"), Caveat("titan_ulysses", (c.ulysses,)), closest)
    return FrameworkSetting("torchtitan", False, settings, caveats=caveats)
