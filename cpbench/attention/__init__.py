"""Context-parallel attention on explicit process groups: Ulysses, Ring and USP (U x R), every
layout and mask, GQA and KV replication. Usage: docs/internals.md."""

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
