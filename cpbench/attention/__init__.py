"""Context-parallel attention on explicit process groups: Ulysses, Ring and USP (U x R), for the
five layouts (contiguous, zigzag, striped, doc_zigzag, balanced) and every mask (causal, full,
packed documents, sliding window), with GQA and KV replication.

    mesh = build_mesh(ulysses=2, ring=2)
    mask = MaskSpec(documents=(300, 500, 224), window=128)
    q_local = shard(q, mesh, layout="balanced", mask=mask)          # likewise k, v
    out_local = cp_attention(q_local, k_local, v_local, mesh, layout="balanced", mask=mask)
    out = unshard(out_local, mesh, layout="balanced", mask=mask)

Prefill with a cached prefix (forward only; pass-KV, pass-Q, all-gather, Ulysses):
`shard_prefill`, `prefill_attention`, `unshard_prefill` (`cpbench.attention.inference`);
decode over a sequence-sharded KV cache: `shard_cache`, `decode_attention`
(`cpbench.attention.inference_decode`).

doc_zigzag pads documents: its global tensors have `run_length(mask, L, U, R, layout)` tokens.
"""

from cpbench.attention.api import cp_attention, shard, unshard
from cpbench.attention.inference import prefill_attention, shard_prefill, unshard_prefill
from cpbench.attention.inference_decode import decode_attention, shard_cache
from cpbench.attention.layouts import positions, run_length, shard_tensor, unshard_tensors
from cpbench.attention.mesh import CPMesh, build_mesh, mesh_grid
from cpbench.attention.reference import reference_attention

__all__ = [
    "CPMesh",
    "build_mesh",
    "cp_attention",
    "decode_attention",
    "mesh_grid",
    "positions",
    "prefill_attention",
    "reference_attention",
    "run_length",
    "shard",
    "shard_cache",
    "shard_prefill",
    "shard_tensor",
    "unshard",
    "unshard_prefill",
    "unshard_tensors",
]
