"""Context-parallel attention on explicit process groups: Ulysses, Ring and USP (U x R), for the
contiguous, zigzag and striped layouts, with GQA and KV replication.

    mesh = build_mesh(ulysses=2, ring=2)
    q_local = shard(q, mesh, layout="zigzag")          # likewise k, v
    out_local = cp_attention(q_local, k_local, v_local, mesh, causal=True, layout="zigzag")
    out = unshard(out_local, mesh, layout="zigzag")
"""

from cpbench.attention.api import cp_attention, shard, unshard
from cpbench.attention.layouts import positions, shard_tensor, unshard_tensors
from cpbench.attention.mesh import CPMesh, build_mesh, mesh_grid
from cpbench.attention.reference import reference_attention

__all__ = [
    "CPMesh",
    "build_mesh",
    "cp_attention",
    "mesh_grid",
    "positions",
    "reference_attention",
    "shard",
    "shard_tensor",
    "unshard",
    "unshard_tensors",
]
