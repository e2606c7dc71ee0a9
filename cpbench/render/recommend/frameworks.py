"""The words of a framework setting's caveats (`cpbench.app.recommend.types.Caveat`):
`CAVEATS` words each kind, `setting_note` a setting's caveats in one note."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cpbench.units import format_seconds

_DOCUMENTS = {
    "Megatron-LM": "THD format (PackedSeqParams with cu_seqlens) and every sequence padded to a "
    "multiple of 2 x CP (Transformer Engine's per-document zigzag, cpbench's doc_zigzag); it "
    "has no work-balanced layout",
    "DeepSpeed": "Ulysses leaves each rank the whole sequence, so the kernel's own varlen / "
    "document mask applies; whether your DeepSpeed version passes cu_seqlens through the "
    "sequence-parallel all-to-all is unknown to cpbench",
    "yunchang": "cpbench found no varlen (cu_seqlens) entry point documented for "
    "LongContextAttention: unknown; its ring part comes from ring-flash-attn, which has one",
    "torchtitan": "block_causal (document) masks go through FlexAttention "
    "(pytorch/torchtitan#1001); with CP the load balancer changes for block_causal in recent "
    "versions: check that yours supports CP with it",
    "ring-flash-attn": "the llama3 varlen functions take cu_seqlens "
    "(llama3_flash_attn_prepare_cu_seqlens); after the gather every mask is local",
    "all-gather CP": "after the gather every rank holds all K/V, so the document mask is a "
    "local problem (the Llama 3 reason for all-gather CP)",
}
CAVEATS: dict[str, str] = {
    "cp1": "CP = 1: no context parallelism; nothing to set",
    "te_chunks": "Megatron (Transformer Engine) always splits the sequence into 2 x CP chunks "
    "(zigzag-style load balancing)",
    "te_layout": "it cannot run the {name} layout: expect its zigzag equivalent",
    "kv_replication": "the all-to-all needs KV heads replicated x{v[0]}; check that your "
    "Transformer Engine version accepts kv heads < the a2a size",
    "no_a2a_all_gather": "Megatron's --cp-comm-type takes p2p, all_gather, a2a or a2a+p2p (per "
    "layer a list of them): there is no a2a+all_gather, so this U x A all-gather mesh runs as "
    "a2a+p2p (the ring on the second level)",
    "te_all_gather": "all_gather gathers the full K/V before attention with no head stride "
    "(TE's all-gather path); cpbench's stride, if any, has no Megatron flag",
    "ds_ulysses": "DeepSpeed-Ulysses (all-to-all over the sequence-parallel group)",
    "ds_gqa": "KV heads ({v[0]}) < sequence-parallel size ({v[1]}): needs a DeepSpeed version "
    "that replicates KV heads for GQA",
    "ds_ring": "DeepSpeed-Ulysses cannot express a ring (R = {v[0]}): its sequence parallelism "
    "is all-to-all only (no ring, no U x R hybrid, no layout); no DeepSpeed setting runs this "
    "mesh",
    "no_ulysses_mesh": "no Ulysses-only mesh is feasible",
    "closest_ulysses": "closest: Ulysses {v[0]}x1 (rank {position}, {time}), "
    "--ds-sequence-parallel-size {v[0]}: it runs that mesh, not the winner",
    "yunchang": "Ulysses groups are the low (consecutive) ranks (use_ulysses_low=True), as "
    "modelled; shard the inputs with the matching extract function "
    "(EXTRACT_FUNC_DICT['{name}'])",
    "torchtitan": "torchtitan's context parallelism is ring-only with head-tail load balancing "
    "(the zigzag layout); rotate_method alltoall passes K/V shards around the ring like the "
    "modelled ring, allgather (the default) gathers all K/V first",
    "titan_ulysses": "it cannot express Ulysses (U = {v[0]})",
    "closest_ring": "closest: ring 1x{v[0]} zigzag (rank {position}, {time})",
    "no_ring_mesh": "no ring-only mesh is feasible",
    "ag_alternative": "all-gather CP as {candidate} (rank {position}, {time})",
    "ag_best_has_ulysses": "the best all-gather candidate, {candidate} ({time}), combines "
    "Ulysses with the all-gather, which no framework offers",
    "ag_ulysses_megatron": "its Ulysses level (U = {v[0]}) exists only in Megatron, as a2a+p2p "
    "with the ring, and in cpbench",
    "llama3": "ring-flash-attention's all-gather CP (the Llama 3 scheme): K/V gathered over the "
    "CP group in strides of heads_k_stride = {v[0]} KV head(s), the next in flight; it takes "
    "the contiguous (varlen) layout",
    "llama3_layout": "not {name}: expect contiguous's imbalance",
    "gather_only": "all-gather only: it cannot express the Ulysses level (U = {v[0]})",
    "documents": "packed documents: {documents}",
    "ring_flash_documents": "packed documents: zigzag_ring_flash_attn_varlen_func with "
    "cu_seqlens, every document cut into 2 x ring chunks (cpbench's doc_zigzag, each length a "
    "multiple of 2 x ring)",
    "ring_only": "ring only: it cannot express Ulysses (U = {v[0]})",
    "window": "sliding window: cpbench skips the ring steps no query can see; check that the "
    "framework passes the window to its kernels under CP rather than dropping it",
}
"""The words of each framework caveat kind (`cpbench.app.recommend.types.CaveatKind`)."""


def caveat_text(c: Mapping[str, Any]) -> str:
    """One caveat in words."""
    return CAVEATS[c["kind"]].format(
        v=c["values"], name=c["name"], candidate=c["candidate"], position=c["position"],
        time=format_seconds(c["time_s"], 2), documents=_DOCUMENTS.get(c["name"], ""),
    )


def setting_note(f: Mapping[str, Any]) -> str:
    """A framework setting's caveats in words (or `cpbench plan`'s note as written)."""
    text = "; ".join(caveat_text(c) for c in f.get("caveats", ()))
    return text + "." if text else f.get("note", "")
