"""The public entry point: `cp_attention(q, k, v, mesh, causal=..., layout=...)` on local shards.

USP composition: KV replication (if the mesh needs it) -> Ulysses all-to-all (sequence ->
heads) -> ring attention over the ring group -> Ulysses all-to-all back. U = 1 skips the
all-to-alls (pure ring), R = 1 makes the ring a single local step (pure Ulysses).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from cpbench.attention.kernels import LocalKernel, default_scale, select_kernel
from cpbench.attention.layouts import shard_tensor, unshard_tensors
from cpbench.attention.mesh import CPMesh
from cpbench.attention.ring import RingAttention, RingSpec, Variant
from cpbench.attention.ulysses import HeadsToSeq, SeqToHeads
from cpbench.config.constraints import AttentionShape, check_mesh
from cpbench.errors import CpbenchError


def cp_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mesh: CPMesh,
    causal: bool = True,
    layout: str = "contiguous",
    kernel: str | LocalKernel = "auto",
    scale: float | None = None,
    kv_replication: int | None = None,
    variant: Variant = "full",
) -> torch.Tensor:
    """Context-parallel attention of this rank's shards `q [B, S, h, D]`, `k`/`v [B, S, h_kv, D]`
    (sharded with `shard(..., layout=layout)`); returns this rank's output shard `[B, S, h, D]`.
    Autograd flows through it. Raises CpbenchError for a mesh the shapes cannot use."""
    if q.dim() != 4 or k.shape != v.shape or k.shape[:2] != q.shape[:2] or k.shape[3] != q.shape[3]:
        raise CpbenchError(
            f"expected q [B, S, h, D] and k, v [B, S, h_kv, D]; got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    b, s, h, d = q.shape
    shape = AttentionShape(
        seq_len=s * mesh.world, heads=h, kv_heads=k.shape[2], head_dim=d, batch=b
    )
    feasible = check_mesh(
        shape, mesh.ulysses, mesh.ring, layout, kv_replication
    ).raise_if_infeasible()
    local_kernel = select_kernel(q.device, q.dtype, kernel) if isinstance(kernel, str) else kernel
    skip_comm = variant == "compute"

    if feasible.kv_replication > 1:
        # Each KV head is copied so every Ulysses rank receives one whole head; autograd sums
        # the copies' gradients back onto the original head.
        k = k.repeat_interleave(feasible.kv_replication, dim=2)
        v = v.repeat_interleave(feasible.kv_replication, dim=2)
    kv = torch.stack([k, v], dim=2)  # [B, S, 2, h_kv*c, D]: K and V travel together
    q5 = q.unsqueeze(2)  # [B, S, 1, h, D]
    if mesh.ulysses > 1:
        group = mesh.ulysses_group
        q5 = SeqToHeads.apply(q5, group, mesh.ulysses, ("a2a_q", "a2a_dq"), skip_comm)
        kv = SeqToHeads.apply(kv, group, mesh.ulysses, ("a2a_kv", "a2a_dkv"), skip_comm)
    spec = RingSpec(
        group=mesh.ring_group,
        size=mesh.ring,
        rank=mesh.ring_rank,
        send_to=mesh.ring_next,
        recv_from=mesh.ring_prev,
    )
    out = RingAttention.apply(
        q5.squeeze(2), kv, spec, layout, causal, scale or default_scale(d), local_kernel, variant
    )
    if mesh.ulysses > 1:
        out = HeadsToSeq.apply(
            out.unsqueeze(2), mesh.ulysses_group, mesh.ulysses, ("a2a_out", "a2a_dout"), skip_comm
        ).squeeze(2)
    return out


def shard(x: torch.Tensor, mesh: CPMesh, layout: str = "contiguous", dim: int = 1) -> torch.Tensor:
    """This rank's shard of a global tensor (every rank holds the global tensor)."""
    return shard_tensor(x, mesh.ulysses, mesh.ring, layout, mesh.rank, dim)


def unshard(
    local: torch.Tensor, mesh: CPMesh, layout: str = "contiguous", dim: int = 1
) -> torch.Tensor:
    """Gather every rank's shard back into the global tensor (collective over the CP group)."""
    pieces = [torch.empty_like(local) for _ in range(mesh.world)]
    dist.all_gather(pieces, local.contiguous(), group=mesh.cp_group)
    return unshard_tensors(pieces, mesh.ulysses, mesh.ring, layout, dim)
